"""Whether the app may save its artifact rows with a plain INSERT (``runs.app_saves = "plain"``).

The triggers of triggers/app_saves.sql let the app's save replace the reactor's row by deleting
it in the app's transaction. Where another table's foreign key references the artifact table,
that delete would cascade to the rows that reference it (ON DELETE CASCADE, SET NULL, SET
DEFAULT) or fail the save (NO ACTION, RESTRICT): `reactor migrate` refuses "plain" there, and
`reactor init` says so in its draft. What is read here is the catalog alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from reactor.db.session import AnyConnection
from reactor.errors import ConfigError
from reactor.install.mapping import Mapping
from reactor.install.quote import readable

# What each ON DELETE action would do to the referencing rows when the save deletes the row.
_ACTIONS = {
    "c": "ON DELETE CASCADE: the save would delete the rows that refer to it",
    "n": "ON DELETE SET NULL: the save would cut the rows that refer to it loose",
    "d": "ON DELETE SET DEFAULT: the save would point the rows that refer to it elsewhere",
    "r": "ON DELETE RESTRICT: the save would fail while a row refers to it",
    "a": "ON DELETE NO ACTION: the save would fail while a row refers to it",
}

# Every foreign key that references the table, partitions' copies left out (a partitioned
# table's key is listed once, on the table).
_REFERENCES = """
SELECT n.nspname, c.relname, k.conname, k.confdeltype
  FROM pg_catalog.pg_constraint k
  JOIN pg_catalog.pg_class c ON c.oid = k.conrelid
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE k.contype = 'f' AND k.confrelid = %(table)s::regclass AND k.conparentid = 0
 ORDER BY n.nspname, c.relname, k.conname
"""


@dataclass(frozen=True)
class Reference:
    """A foreign key of another table (or of the table itself) to the artifact table."""

    table: tuple[str, str]
    name: str
    on_delete: str  # pg_constraint.confdeltype

    def why(self) -> str:
        """The key, and what a plain save's delete of the row it references would do."""
        action = _ACTIONS.get(self.on_delete, "the save would change them")
        return f"the foreign key {self.name} of {readable(*self.table)} references it ({action})"


async def references(conn: AnyConnection, table: tuple[str, str]) -> list[Reference]:
    """The foreign keys that reference ``table`` (schema, name)."""
    cur = await conn.execute(_REFERENCES, {"table": readable(*table)})
    return [
        Reference((schema, name), key, action) for schema, name, key, action in await cur.fetchall()
    ]


async def check_plain_saves(
    conn: AnyConnection, mapping: Mapping, table: tuple[str, str], where: str
) -> None:
    """ConfigError when ``mapping`` asks for app_saves = "plain" and a foreign key references
    its artifact table, ``table`` (schema, name) as the catalog has it."""
    if mapping.runs.app_saves != "plain":
        return
    found = await references(conn, table)
    if found:
        runs = mapping.runs
        raise ConfigError(
            f'runs.app_saves = "plain" in {where}: a plain save replaces the reactor\'s row of '
            f"{readable(*table)} by deleting it, and {found[0].why()}; keep "
            f'app_saves = "upsert" and save with INSERT ... ON CONFLICT ({runs.key}) DO UPDATE '
            f"SET ..., {runs.saved_by} = '{runs.client[0]}'"
        )
