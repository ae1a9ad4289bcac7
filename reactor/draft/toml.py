"""The mapping file as text: TOML keys, each under a comment saying where its value came from,
and TODO lines. Pure; :func:`tomllib.loads` reads back what it writes, and nothing but the keys
it wrote: a comment's text has its control characters escaped (:func:`reactor.shown.printable`),
so that no name from the catalog ends a comment and starts a table of its own."""

from __future__ import annotations

import json
import re
import textwrap

from reactor.shown import printable

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_WIDTH_CHARS = 99


def key_text(name: str) -> str:
    """A TOML key: bare when it may be, else a quoted string."""
    return name if _BARE_KEY.fullmatch(name) else value_text(name)


def value_text(value: object) -> str:
    """A TOML value: a string (literal when it holds double quotes, for readable SQL), an
    integer, or a list of them."""
    if isinstance(value, bool):
        raise TypeError("no booleans in a mapping file")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        if '"' in value and "'" not in value and value.isprintable():
            return f"'{value}'"
        # JSON's escapes are TOML's for a basic string; TOML also escapes DEL, which JSON
        # leaves as it is.
        return json.dumps(value).replace("\x7f", "\\u007f")
    if isinstance(value, list | tuple):
        return "[" + ", ".join(value_text(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


class Writer:
    """Collects the file's sections in order; a key may go to an earlier section."""

    def __init__(self) -> None:
        self._sections: dict[str, list[str]] = {"": []}
        self._current = ""
        self.todos: list[str] = []

    def section(self, name: str) -> None:
        self._current = name
        self._sections.setdefault(name, [])

    def _lines(self, section: str | None) -> list[str]:
        return self._sections[self._current if section is None else section]

    def comment(self, *lines: str, section: str | None = None) -> None:
        for line in lines:
            self._lines(section).extend(_wrapped("# ", line))

    def key(self, name: str, value: object, why: str, *, section: str | None = None) -> None:
        lines = self._lines(section)
        if why:
            lines.extend(_wrapped("# ", why))
        lines.append(f"{key_text(name)} = {value_text(value)}")

    def todo(self, text: str, *, section: str | None = None) -> None:
        text = printable(text)
        self.todos.append(text)
        self._lines(section).extend(_wrapped("# TODO: ", text, "#       "))

    def text(self) -> str:
        parts = []
        for name, lines in self._sections.items():
            head = [f"[{name}]"] if name else []
            if head or lines:
                parts.append("\n".join(head + lines))
        return "\n\n".join(parts) + "\n"


def _wrapped(first: str, text: str, rest: str = "# ") -> list[str]:
    return textwrap.wrap(
        printable(text),
        width=_WIDTH_CHARS,
        initial_indent=first,
        subsequent_indent=rest,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [first.rstrip()]
