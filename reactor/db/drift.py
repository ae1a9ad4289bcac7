"""Whether the reactor's triggers and functions were installed for the mapping in force.

`reactor migrate` records in ``app_tables.mapping_digest`` a digest of what it installs for the
mapping (notify_triggers.sql rendered for it, and the indexes it builds after): a mapping file
changed since then (other terminal values, another run column) leaves the installed functions
judging jobs by the old file while `reactor run` writes by the new one. `run` and `sweep` refuse
to start on such a difference, `status` reports it, and `migrate` says when it re-installed.

The channel and the trigger's --spread/--no-notify are left out of the digest: they are options
of an install, not of the mapping file (`run` cannot know the flags `migrate` was given), and the
job trigger's own arguments already show them, which the health check and `status` read. The
template's comments are left out too: a release that rewords them changes nothing installed.
"""

from __future__ import annotations

import hashlib

from reactor.db import indexes
from reactor.db.indexes import Index
from reactor.db.session import AnyConnection
from reactor.errors import ConfigError
from reactor.install import Install, sql
from reactor.install.quote import identifier, readable

# The column that holds the digest (migration 0019).
COLUMN = "mapping_digest"

CHANGED = (
    "the mapping file changed since the last `reactor migrate`: the installed triggers and "
    "functions still follow the old one; run `reactor migrate` to re-install them"
)
# What `reactor migrate` says when it did.
REINSTALLED = "re-installed the triggers and functions for the changed mapping file"


def mapping_digest(install: Install) -> str:
    """The digest of what `reactor migrate` installs for ``install``'s mapping: the same for
    two mappings exactly when the functions, triggers and indexes it renders are the same."""
    # What app_saves = "upsert" renders only drops what "plain" installed, and is left out: an
    # install made before the key keeps its digest.
    text = sql.repeatable(install.mapping).text.removesuffix(sql.app_saves("upsert"))
    triggers = install.render(text, channel="", spread=False)
    steps = [
        step.create() if isinstance(step, Index) else step.drop()
        for step in indexes.repeatable(install)
    ]
    statements = "\n".join(
        line for line in triggers.splitlines() if not line.lstrip().startswith("--")
    )
    return hashlib.sha256("\n".join([statements, *steps]).encode()).hexdigest()


def record_statement(install: Install) -> str:
    """The statement that records ``install``'s digest as the one installed."""
    table = readable(install.schema, "app_tables")
    return f"UPDATE {table} SET {COLUMN} = '{mapping_digest(install)}';"


async def installed_digest(conn: AnyConnection, install: Install) -> str | None:
    """The digest the last `reactor migrate` recorded; None when it recorded none (an install
    from before the column), or when the column is not there or not readable by this role."""
    table = identifier(install.schema, "app_tables")
    # CASE, not AND: has_column_privilege raises for a column that is not there.
    cur = await conn.execute(
        "SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM pg_attribute"
        "                              WHERE attrelid = to_regclass(%(t)s)"
        "                                AND attname = %(c)s AND NOT attisdropped) THEN false"
        "            ELSE has_column_privilege(to_regclass(%(t)s), %(c)s, 'SELECT') END",
        {"t": table, "c": COLUMN},
    )
    row = await cur.fetchone()
    if not row or not row[0]:
        return None
    cur = await conn.execute(f"SELECT {COLUMN} FROM {table}")
    row = await cur.fetchone()
    return None if row is None else row[0]


async def mapping_changed(conn: AnyConnection, install: Install) -> bool:
    """True when the install was recorded for another render of the mapping than this one."""
    installed = await installed_digest(conn, install)
    return installed is not None and installed != mapping_digest(install)


async def require_current_mapping(conn: AnyConnection, install: Install) -> None:
    """ConfigError when the installed triggers and functions were rendered from another
    version of the mapping file: `reactor migrate` re-installs them."""
    if await mapping_changed(conn, install):
        raise ConfigError(CHANGED)
