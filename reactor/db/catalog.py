"""The catalog as the checks read it: a mapped relation found by schema and name, with its kind,
its owner and its columns, and what else :mod:`reactor.db.fit` asks of it (an enum's labels, a
unique index, the sequences a default draws from, the owners a superuser migrates for).

Only reads, and only what the catalog says: judging a mapping against it is :mod:`.fit`'s.
Every read names pg_catalog's objects in full, so that what a role's search_path puts before
pg_catalog is never consulted; the mapped tables are found by schema and name, never through the
search_path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from psycopg.rows import dict_row

from reactor.db.session import AnyConnection
from reactor.install.mapping import Mapping
from reactor.install.quote import readable

_TYPMOD = re.compile(r"\(\d+(?:,\d+)?\)")


@dataclass(frozen=True)
class Column:
    """One column of a mapped relation, its type without modifiers."""

    name: str
    type: str
    enum: bool
    not_null: bool
    filled: bool  # has a default, or is an identity or generated column


@dataclass(frozen=True)
class Table:
    """A mapped relation as the catalog has it."""

    oid: int
    schema: str
    name: str
    kind: str  # pg_class.relkind: r a table, p a partitioned one, v a view...
    owner: str
    owned: bool  # the current role is the owner, or a member of it
    columns: dict[str, Column]

    @property
    def partitioned(self) -> bool:
        return self.kind == "p"

    @property
    def shown(self) -> str:
        return self.name if self.schema == "public" else f"{self.schema}.{self.name}"


async def describe(conn: AnyConnection, name: tuple[str, ...]) -> Table | None:
    """The relation ``name`` (schema, name; a bare name is in public) and its columns as the
    catalog has them, or None when it is absent."""
    schema, relname = name if len(name) == 2 else ("public", name[-1])
    cur = await conn.execute(
        "SELECT c.oid, c.relkind::text, pg_catalog.pg_get_userbyid(c.relowner)::text,"
        "       pg_catalog.pg_has_role(current_user, c.relowner, 'MEMBER')"
        "  FROM pg_catalog.pg_class c"
        "  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s",
        (schema, relname),
    )
    found = await cur.fetchone()
    if found is None:
        return None
    oid, kind, owner, owned = found
    cur = await conn.cursor(row_factory=dict_row).execute(
        "SELECT a.attname AS name, pg_catalog.format_type(a.atttypid, a.atttypmod) AS type,"
        "       t.typtype = 'e' AS enum, a.attnotnull AS not_null,"
        "       a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '' AS filled"
        "  FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid"
        " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped"
        " ORDER BY a.attnum",
        (oid,),
    )
    # Without a type's modifiers: timestamp(3) is a timestamp, varchar(200) a varchar.
    columns = {
        row["name"]: Column(**{**row, "type": _TYPMOD.sub("", row["type"])})
        for row in await cur.fetchall()
    }
    return Table(oid, schema, relname, kind, owner, bool(owned), columns)


async def owners_note(conn: AnyConnection, mapping: Mapping) -> str | None:
    """For a superuser, for whom every ownership check passes: one line naming each mapped
    table's owner, so that whoever migrates sees whose tables got the triggers. None for any
    other role, which the checks held to its own tables."""
    cur = await conn.execute(
        "SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user"
    )
    row = await cur.fetchone()
    if not row or not row[0]:
        return None
    owned = []
    for table in (mapping.jobs.table, mapping.runs.table):
        found = await describe(conn, table)
        if found is not None:
            owned.append(f"{readable(found.schema, found.name)} belongs to {found.owner}")
    return "migrated as a superuser: " + ", ".join(owned) if owned else None


async def enum_labels(conn: AnyConnection, table: int, column: str) -> list[str]:
    """The labels of the enum type of ``table``'s ``column`` in their order; [] for another type."""
    cur = await conn.execute(
        "SELECT e.enumlabel FROM pg_catalog.pg_attribute a"
        "  JOIN pg_catalog.pg_enum e ON e.enumtypid = a.atttypid"
        " WHERE a.attrelid = %s AND a.attname = %s ORDER BY e.enumsortorder",
        (table, column),
    )
    return [label for (label,) in await cur.fetchall()]


async def unique_on(conn: AnyConnection, table: int, column: str) -> bool:
    """Whether ``table`` has a valid unique index on ``column`` alone (no predicate, no
    expression): the one an ON CONFLICT on that column finds."""
    cur = await conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute a"
        "    ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
        " WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid AND i.indpred IS NULL"
        "   AND i.indnkeyatts = 1 AND i.indexprs IS NULL AND a.attname = %s)",
        (table, column),
    )
    row = await cur.fetchone()
    return bool(row and row[0])


async def default_sequences(
    conn: AnyConnection, table: int, columns: list[str]
) -> tuple[tuple[str, str], ...]:
    """The sequences the defaults of ``table``'s ``columns`` draw from (a serial column's
    nextval), from the default expressions' dependencies: an identity column's sequence needs
    no grant of its own, and none is found here."""
    cur = await conn.execute(
        "SELECT DISTINCT n.nspname, s.relname"
        "  FROM pg_catalog.pg_attrdef d"
        "  JOIN pg_catalog.pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum"
        "  JOIN pg_catalog.pg_depend dep"
        "    ON dep.classid = 'pg_catalog.pg_attrdef'::pg_catalog.regclass"
        "   AND dep.objid = d.oid"
        "   AND dep.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass"
        "  JOIN pg_catalog.pg_class s ON s.oid = dep.refobjid AND s.relkind = 'S'"
        "  JOIN pg_catalog.pg_namespace n ON n.oid = s.relnamespace"
        " WHERE d.adrelid = %s AND a.attname = ANY(%s)"
        " ORDER BY 1, 2",
        (table, columns),
    )
    return tuple((schema, name) for schema, name in await cur.fetchall())
