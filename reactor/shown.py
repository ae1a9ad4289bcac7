"""Text from the catalog made safe to show: the one place the reactor escapes what it prints.

A table, column, constraint or enum label may hold any character, a newline or an escape
sequence included. Printed raw, such a name ends a TOML comment and starts a table of its own in
a drafted mapping file, or moves the cursor and rewrites what a terminal shows. Every catalog
string that reaches a comment, a message or the terminal passes through :func:`printable` first;
command lines to paste also go through :func:`shell_word`. Pure: nothing here reads or writes.
"""

from __future__ import annotations

import shlex
import unicodedata

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


def has_hidden(text: str) -> bool:
    """Whether :func:`printable` would change ``text``."""
    return printable(text) != text


def shell_word(text: str) -> str:
    """``text`` as one word of a POSIX shell command line to paste, quoted when it must be.
    Its control characters must be gone first (:func:`has_hidden`): a quoted newline is still
    a line break on the screen."""
    return shlex.quote(text)
