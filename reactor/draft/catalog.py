"""Reading the catalog into :mod:`reactor.draft.facts`: every table of the app's schemas with
its columns, enum labels, CHECK values, unique indexes and foreign keys.

Every name is read schema-qualified (``pg_catalog.pg_class``), so what the session's search_path
holds changes nothing; only reads, in one READ ONLY transaction the caller opens.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from reactor.db.session import AnyConnection
from reactor.draft.facts import INTEGER_TYPES, ColumnFacts, ForeignKey, TableFacts
from reactor.draft.links import parse_name

_TYPMOD = re.compile(r"\(\d+(?:,\d+)?\)")
# A CHECK that lists what a column may hold, as pg_get_constraintdef prints it:
# CHECK (((status)::text = ANY ((ARRAY['queued'::character varying, ...])::text[])))
# CHECK ((status = ANY (ARRAY[0, 1, 2])))   CHECK (((state = 'a'::text) OR (state = 'b'::text)))
_STRING = re.compile(r"'((?:[^']|'')*)'")
_INTEGERS = re.compile(r"= ANY \(ARRAY\[(-?\d+(?:, -?\d+)*)\]\)")
_INTEGER_EQUALS = re.compile(r"(?<![<>!])= (-?\d+)\)")
# A check that excludes or bounds values lists none that a row may hold.
_NOT_A_LIST = re.compile(r"<>|!=|<|>|\bNOT\b|\bALL\b|~~")

_TABLES = """
SELECT c.oid, n.nspname, c.relname, c.relkind = 'p'
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
   AND n.nspname NOT IN ('pg_catalog', 'information_schema')
   AND n.nspname NOT LIKE 'pg\\_%'
   -- A reactor's own schema (its queue beside its record of the app's tables) is no app's.
   AND NOT (pg_catalog.to_regclass(pg_catalog.quote_ident(n.nspname) || '.app_tables') IS NOT NULL
            AND pg_catalog.to_regclass(pg_catalog.quote_ident(n.nspname) || '.pending') IS NOT NULL)
 ORDER BY n.nspname, c.relname
"""

_COLUMNS = """
SELECT a.attrelid, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull,
       a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '', t.typtype = 'e',
       ARRAY(SELECT e.enumlabel FROM pg_catalog.pg_enum e
              WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder)
  FROM pg_catalog.pg_attribute a
  JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
 WHERE a.attrelid = ANY(%(tables)s) AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attrelid, a.attnum
"""

_INDEXES = """
SELECT i.indrelid, i.indisprimary,
       ARRAY(SELECT a.attname
               FROM pg_catalog.unnest(i.indkey::pg_catalog.int2[]) WITH ORDINALITY k(num, ord)
               JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.num
              WHERE k.ord <= i.indnkeyatts ORDER BY k.ord)
  FROM pg_catalog.pg_index i
 WHERE i.indrelid = ANY(%(tables)s) AND i.indisunique AND i.indisvalid
   AND i.indpred IS NULL AND i.indexprs IS NULL
"""

_CONSTRAINTS = """
SELECT c.conrelid, c.contype, a.attname, tn.nspname, tc.relname, ta.attname,
       pg_catalog.pg_get_constraintdef(c.oid)
  FROM pg_catalog.pg_constraint c
  JOIN pg_catalog.pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
  LEFT JOIN pg_catalog.pg_class tc ON tc.oid = c.confrelid
  LEFT JOIN pg_catalog.pg_namespace tn ON tn.oid = tc.relnamespace
  LEFT JOIN pg_catalog.pg_attribute ta ON ta.attrelid = c.confrelid AND ta.attnum = c.confkey[1]
 WHERE c.conrelid = ANY(%(tables)s) AND c.contype IN ('f', 'c')
   AND pg_catalog.cardinality(c.conkey) = 1
 ORDER BY c.conrelid, c.conname
"""


async def read_tables(conn: AnyConnection) -> list[TableFacts]:
    """Every table of the database outside the system's and the reactor's schemas."""
    cur = await conn.execute(_TABLES)
    tables = await cur.fetchall()
    oids = [row[0] for row in tables]
    params = {"tables": oids}
    columns: dict[int, list[list[Any]]] = defaultdict(list)
    for oid, *rest in await (await conn.execute(_COLUMNS, params)).fetchall():
        columns[oid].append(rest)
    primary: dict[int, tuple[str, ...]] = {}
    unique: dict[int, set[str]] = defaultdict(set)
    for oid, is_primary, names in await (await conn.execute(_INDEXES, params)).fetchall():
        if is_primary:
            primary[oid] = tuple(names)
        if len(names) == 1:
            unique[oid].add(names[0])
    keys: dict[int, list[ForeignKey]] = defaultdict(list)
    checks: dict[tuple[int, str], list[str]] = defaultdict(list)
    for row in await (await conn.execute(_CONSTRAINTS, params)).fetchall():
        oid, kind, column, schema, target, target_column, definition = row
        if kind == "f":
            keys[oid].append(ForeignKey(column, (schema, target), target_column))
        else:
            checks[(oid, column)].append(definition)
    found = []
    for oid, schema, name, partitioned in tables:
        described = []
        for column, type_name, not_null, filled, enum, labels in columns[oid]:
            plain = _TYPMOD.sub("", type_name)
            described.append(
                ColumnFacts(
                    name=column,
                    type=plain,
                    not_null=not_null,
                    filled=filled,
                    enum=enum,
                    labels=tuple(labels) if enum else (),
                    checked=checked_values(checks.get((oid, column), []), plain),
                )
            )
        found.append(
            TableFacts(
                schema=schema,
                name=name,
                columns=tuple(described),
                primary_key=primary.get(oid, ()),
                unique=frozenset(unique[oid]),
                foreign_keys=tuple(keys[oid]),
                partitioned=partitioned,
            )
        )
    return found


def checked_values(definitions: list[str], type_name: str) -> tuple[str | int, ...]:
    """The constants the CHECK constraints of one column list, as a proposal of the values it
    may hold: the first check that lists any. ``reactor migrate`` evaluates each terminal value
    against every check, so a value read wrongly here is refused there, never written."""
    for definition in definitions:
        if _NOT_A_LIST.search(definition):
            continue
        if type_name in INTEGER_TYPES:
            listed = _INTEGERS.search(definition)
            numbers = listed.group(1).split(", ") if listed else _INTEGER_EQUALS.findall(definition)
            if numbers:
                return tuple(dict.fromkeys(int(n) for n in numbers))
        else:
            strings = [s.replace("''", "'") for s in _STRING.findall(definition)]
            if strings:
                return tuple(dict.fromkeys(strings))
    return ()


def find(tables: list[TableFacts], name: str) -> TableFacts | None:
    """The table ``name`` names, as a mapping file does: ``schema.table``, or ``table`` in
    public; case matters; a part may be double-quoted as in SQL (``public."Render"``)."""
    qualified = parse_name(name)
    return next((t for t in tables if t.key == qualified), None)
