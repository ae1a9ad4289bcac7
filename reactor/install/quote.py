"""Names and values as SQL text: the one place the reactor quotes what it writes into SQL.

:func:`identifier` and :func:`literal` are psycopg's own quoting, for SQL the reactor sends;
:func:`readable` is for SQL a person reads and runs (a printed GRANT, a suggested fix): each
name quoted exactly when PostgreSQL's ``quote_ident()`` would quote it, so that ``MyApp`` is
not folded to ``myapp`` and ``user`` is not read as the keyword. Pure: no connection is
involved.
"""

from __future__ import annotations

import re

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
