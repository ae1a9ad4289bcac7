"""Names and values as SQL text: the one place the reactor quotes what it writes into SQL.

:func:`identifier` and :func:`literal` are psycopg's own quoting, for SQL the reactor sends;
:func:`readable` is for SQL a person reads and runs (a printed GRANT, a suggested fix): plain
lower-case names as written, any other quoted, so that ``MyApp`` is not folded to ``myapp``.
Pure: no connection is involved.
"""

from __future__ import annotations

import re

import psycopg.sql

# What PostgreSQL reads the same unquoted: a lower-case identifier.
_PLAIN = re.compile(r"[a-z_][a-z0-9_$]*")


def identifier(*parts: str) -> str:
    """``parts`` as one quoted, dot-separated identifier: ``"app"."Job"``."""
    return psycopg.sql.Identifier(*parts).as_string(None)


def literal(value: str) -> str:
    """``value`` as a quoted SQL string literal."""
    return psycopg.sql.Literal(value).as_string(None)


def readable(*parts: str) -> str:
    """A name, schema-qualified when given two parts, as a person writes it: each plain part
    bare, any other (camelCase, spaces) quoted."""
    return ".".join(part if _PLAIN.fullmatch(part) else identifier(part) for part in parts)
