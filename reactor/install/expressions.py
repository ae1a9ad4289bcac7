"""Is this text one SQL expression? The check of a ``[runs.columns]`` expression, pure.

A [runs.columns] expression is pasted into the record statements, so it is trusted like a
migration; what is checked here is only that it is one expression, and stays one once pasted
in parentheses (``mapping.value_of``): no statement after it, no list, nothing that closes the
parenthesis around it. This is a lexer, not a parser: it finds where PostgreSQL's literals,
quoted identifiers and comments begin and end, as scan.l does, and looks at what lies outside
them. `reactor migrate` then has the server compile it (``db.fit``).
"""

from __future__ import annotations

import re
from functools import cache

_CLOSER = {"(": ")", "[": "]"}
# A -- comment runs to the end of its line, either kind of line end (scan.l's newline).
_LINE_END = re.compile(r"[\n\r]")


@cache
def _words() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(what may start and continue an unquoted identifier or key word, scan.l's ident_start
    and ident_cont: a $ inside a word belongs to it, and is not the start of a dollar quote;
    a dollar quote's delimiter, $$ or $tag$: a digit after $ is a parameter, $1)."""
    # Compiled at the first check, not at import: a class up to U+10FFFF takes re some 8 ms
    # each, which every command (`reactor run`'s start among them) would pay for nothing.
    return (
        re.compile(r"[A-Za-z_\x80-\U0010ffff][A-Za-z0-9_$\x80-\U0010ffff]*"),
        re.compile(r"\$(?:[A-Za-z_\x80-\U0010ffff][A-Za-z0-9_\x80-\U0010ffff]*)?\$"),
    )


def expression_problem(expression: str) -> str | None:
    """Why ``expression`` is not one SQL expression that can stand in parentheses, or None.

    Pure. A plain '...' literal is read both with and without backslash escapes, because which
    one the server applies depends on its standard_conforming_strings: whichever it is, no ; and
    no unbalanced parenthesis is left outside the literals.
    """
    return _scan(expression, backslashes=False) or _scan(expression, backslashes=True)


def _scan(text: str, *, backslashes: bool) -> str | None:
    closers: list[str] = []
    word_pattern, dollar_pattern = _words()
    i, end = 0, len(text)
    while i < end:
        char = text[i]
        if char == "'":
            i = _literal_end(text, i + 1, backslashes=backslashes)
        elif char == '"':
            i = _quoted_end(text, i + 1, '"')
        elif text.startswith("--", i):
            line_end = _LINE_END.search(text, i)
            if line_end is None:
                return "it ends in a -- comment, which would swallow what follows it; use /* */"
            i = line_end.end()
        elif text.startswith("/*", i):
            i = _comment_end(text, i + 2)
        elif char == "$" and (dollar := dollar_pattern.match(text, i)):
            close = text.find(dollar.group(), dollar.end())
            i = -1 if close < 0 else close + len(dollar.group())
        elif word := word_pattern.match(text, i):
            i = word.end()
            if word.group() in ("e", "E") and text.startswith("'", i):
                i = _literal_end(text, i + 1, backslashes=True)
        else:
            if char in _CLOSER:
                closers.append(_CLOSER[char])
            elif char in ")]" and (not closers or closers.pop() != char):
                return f"its parentheses do not balance (a {char} closes nothing it opened)"
            elif char == ";":
                return (
                    "it holds a ; outside quotes and comments, and statements are not expressions"
                )
            elif char == "," and not closers:
                return "it holds a , outside parentheses: a list of values, not one"
            i += 1
        if i < 0:
            return "a literal, a quoted name or a comment in it is not closed"
    if closers:
        return f"its parentheses do not balance (a {closers[-1]} is missing)"
    return None


def _literal_end(text: str, i: int, *, backslashes: bool) -> int:
    # Past the closing quote of a '...' literal whose body starts at i; -1 if it has none.
    while i < len(text):
        char = text[i]
        if backslashes and char == "\\":
            i += 2
        elif char == "'":
            if not text.startswith("'", i + 1):
                return i + 1
            i += 2
        else:
            i += 1
    return -1


def _quoted_end(text: str, i: int, quote: str) -> int:
    # Past the closing quote of a "..." identifier (a doubled quote stands for itself).
    while (close := text.find(quote, i)) >= 0:
        if not text.startswith(quote, close + 1):
            return close + 1
        i = close + 2
    return -1


def _comment_end(text: str, i: int) -> int:
    # Past the */ that closes a /* comment opened before i; they nest, as in PostgreSQL.
    depth = 1
    while i < len(text):
        if text.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif text.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        else:
            i += 1
    return -1
