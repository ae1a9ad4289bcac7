"""Names and values as SQL text: the one place the reactor quotes what it writes into SQL.

:func:`identifier` and :func:`literal` are psycopg's own quoting, for SQL the reactor sends;
:func:`readable` is for SQL a person reads and runs (a printed GRANT, a suggested fix): each
name quoted exactly when PostgreSQL's ``quote_ident()`` would quote it, so that ``MyApp`` is
not folded to ``myapp`` and ``user`` is not read as the keyword. :func:`dollar_quoted` keeps a
function body's dollar quotes closed where the template closes them, whatever the names and
values quoted inside it hold. Pure: no connection is involved.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import count

import psycopg.sql

# What quote_ident() leaves bare (ruleutils.c, quote_identifier): a lower-case letter or _,
# then lower-case letters, digits or _ ($ is quoted), and no keyword but an unreserved one.
_PLAIN = re.compile(r"[a-z_][a-z0-9_]*")

# PostgreSQL's keywords that quote_ident() quotes: every category but the unreserved
# (SELECT word FROM pg_get_keywords() WHERE catcode <> 'U', on PostgreSQL 18). A newer word
# quoted on an older server costs nothing: a quoted name means the same.
# tests/integration/test_quoted_names.py compares this with quote_ident() on the server.
_KEYWORD_LIST = """
    all analyse analyze and any array as asc asymmetric authorization between bigint binary
    bit boolean both case cast char character check coalesce collate collation column
    concurrently constraint create cross current_catalog current_date current_role
    current_schema current_time current_timestamp current_user dec decimal default deferrable
    desc distinct do else end except exists extract false fetch float for foreign freeze from
    full grant greatest group grouping having ilike in initially inner inout int integer
    intersect interval into is isnull join json json_array json_arrayagg json_exists
    json_object json_objectagg json_query json_scalar json_serialize json_table json_value
    lateral leading least left like limit localtime localtimestamp merge_action national
    natural nchar none normalize not notnull null nullif numeric offset on only or order out
    outer overlaps overlay placing position precision primary real references returning right
    row select session_user setof similar smallint some substring symmetric system_user table
    tablesample then time timestamp to trailing treat trim true union unique user using values
    varchar variadic verbose when where window with xmlattributes xmlconcat xmlelement
    xmlexists xmlforest xmlnamespaces xmlparse xmlpi xmlroot xmlserialize xmltable
"""
_KEYWORDS = frozenset(_KEYWORD_LIST.split())


def identifier(*parts: str) -> str:
    """``parts`` as one quoted, dot-separated identifier: ``"app"."Job"``."""
    return psycopg.sql.Identifier(*parts).as_string(None)


def literal(value: str) -> str:
    """``value`` as a quoted SQL string literal."""
    return psycopg.sql.Literal(value).as_string(None)


def quote_ident(name: str) -> str:
    """``name`` as PostgreSQL's ``quote_ident()`` gives it: bare when it reads the same
    unquoted and is no keyword that needs quoting, else double-quoted."""
    if _PLAIN.fullmatch(name) and name not in _KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


def readable(*parts: str) -> str:
    """A name, schema-qualified when given two parts, as a person writes it: each part through
    :func:`quote_ident` (``public.analysis_jobs``, ``"user"."Job"``)."""
    return ".".join(quote_ident(part) for part in parts)


# What a template writes to open and close a dollar-quoted body: $$, or $tag$ (scan.l's
# dolqdelim, with the ASCII letters templates use). A digit after $ is a parameter ($1), not this.
DOLLAR_DELIMITER = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$")
# What the delimiters a render picks itself are called: $reactor_1$, $reactor_2$, ...
_FRESH_TAG = re.compile(r"reactor_([0-9]+)")


def dollar_quoted(pieces: Sequence[str], delimiters: Sequence[str]) -> str:
    """``pieces`` joined by ``delimiters`` (``pieces[0] + delimiters[0] + pieces[1] ...``), each
    delimiter a template's own ``$$`` or ``$tag$``, each piece the template's text between two
    of them with its names and values filled in.

    PostgreSQL, and psql before it, end a dollar-quoted body at the first occurrence of its
    delimiter, whatever quotes stand around that: a name holding ``$$`` inside a ``$$`` body
    would end it there, and what follows would run as SQL, or as a psql command. So a
    delimiter stays as the template wrote it only when the joined text holds it nowhere but
    where it was placed (an occurrence may also straddle a piece and a delimiter: ``$x`` then
    ``$x$``); else it is replaced, wherever the template placed it, by ``$reactor_<n>$`` with
    an ``n`` no piece holds after ``reactor_``, which therefore occurs nowhere else either. The
    same pieces always give the same text, so a render is as stable as its mapping."""
    if len(pieces) != len(delimiters) + 1:
        raise ValueError("one piece more than delimiters")
    held = {found for piece in pieces for found in _FRESH_TAG.findall(piece)}
    fresh = (f"$reactor_{n}$" for n in count(1) if str(n) not in held)
    chosen = {delimiter: delimiter for delimiter in delimiters}
    # Each round renames one delimiter that occurs elsewhere to a fresh one, which cannot.
    for _ in range(len(chosen) + 1):
        text, placed = _joined(pieces, [chosen[d] for d in delimiters])
        clashing = next(
            (d for d, tag in chosen.items() if _occurrences(text, tag) != placed[tag]), None
        )
        if clashing is None:
            return text
        chosen[clashing] = next(tag for tag in fresh if tag not in chosen.values())
    raise ValueError("no dollar-quote delimiter occurs only where it was placed")


def _joined(pieces: Sequence[str], delimiters: Sequence[str]) -> tuple[str, dict[str, set[int]]]:
    """The joined text, and where each delimiter was placed in it."""
    parts, at = [pieces[0]], len(pieces[0])
    placed: dict[str, set[int]] = {}
    for delimiter, piece in zip(delimiters, pieces[1:], strict=True):
        placed.setdefault(delimiter, set()).add(at)
        parts += [delimiter, piece]
        at += len(delimiter) + len(piece)
    return "".join(parts), placed


def _occurrences(text: str, tag: str) -> set[int]:
    """Every position ``tag`` starts at in ``text``, overlapping ones too (``$$$`` holds ``$$``
    twice): the lexer tries each ``$`` as the start of the closing delimiter."""
    found, at = set(), text.find(tag)
    while at != -1:
        found.add(at)
        at = text.find(tag, at + 1)
    return found
