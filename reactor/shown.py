"""Text from the catalog made safe to show: the one place the reactor escapes what it prints, and
lays out the tables it prints without the cli extra.

A table, column, constraint or enum label may hold any character, a newline or an escape
sequence included. Printed raw, such a name ends a TOML comment and starts a table of its own in
a drafted mapping file, or moves the cursor and rewrites what a terminal shows. Every catalog
string that reaches a comment, a message or the terminal passes through :func:`printable` first;
command lines to paste also go through :func:`shell_word`. Pure: nothing here reads or writes.
"""

from __future__ import annotations

import shlex
import unicodedata
from collections.abc import Sequence

# The escapes a reader knows on sight; every other control character is written as \xNN or
# \uNNNN, as Python's repr() would write it.
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Control characters (Cc), format characters (Cf: the bidirectional overrides that reorder what
# a terminal shows), line and paragraph separators (Zl, Zp: str.splitlines() breaks on them),
# and lone surrogates (Cs), which no encoder writes.
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def escaped_char(char: str) -> str:
    """One character as :func:`printable` writes it."""
    if char in _NAMED:
        return _NAMED[char]
    if unicodedata.category(char) not in _HIDDEN:
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character escaped (``\\n``, ``\\x1b``, ``\\u202e``): one
    line, and nothing a terminal or a TOML comment would act on. Backslashes are kept as they
    are, so that a CHECK's regular expression still reads as written."""
    if all(unicodedata.category(char) not in _HIDDEN for char in text):
        return text
    return "".join(escaped_char(char) for char in text)


def printable_lines(text: str) -> str:
    """``text`` with each of its lines through :func:`printable`, the line breaks kept: a
    table cell of several lines."""
    return "\n".join(printable(line) for line in text.split("\n"))


def has_hidden(text: str) -> bool:
    """Whether :func:`printable` would change ``text``."""
    return printable(text) != text


def shell_word(text: str) -> str:
    """``text`` as one word of a POSIX shell command line to paste, quoted when it must be.
    Its control characters must be gone first (:func:`has_hidden`): a quoted newline is still
    a line break on the screen."""
    return shlex.quote(text)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``rows`` under ``header`` as plain text in aligned columns, for a terminal without the
    cli extra's tables: a cell's lines stay one under the other, each through
    :func:`printable`, and the last column is not padded."""
    cells = [[printable_lines(cell).split("\n") for cell in row] for row in [header, *rows]]
    widths = [max(len(line) for row in cells for line in row[col]) for col in range(len(header))]
    out = []
    for at, row in enumerate(cells):
        for n in range(max(len(cell) for cell in row)):
            parts = [cell[n] if n < len(cell) else "" for cell in row]
            padded = [part.ljust(width) for part, width in zip(parts[:-1], widths, strict=False)]
            out.append("  ".join([*padded, parts[-1]]).rstrip())
        if at == 0:
            out.append("  ".join("-" * width for width in widths))
    return "\n".join(out)
