"""Changes to the app's tables made while the app writes to them.

Each transaction waits at most a second for a lock the app holds, then gives way and is tried
again; index builds run CONCURRENTLY outside any transaction, per partition on a partitioned
table. :mod:`.migrations` applies its migrations through these.
"""

from __future__ import annotations

import logging

import psycopg
import psycopg.errors
import tenacity

from reactor.db.indexes import DropIndex, Index, Step
from reactor.db.session import AnyConnection
from reactor.errors import DatabaseUnreachable
from reactor.install.quote import identifier

# The package's one logger, named as the JSON log lines have always named it.
log = logging.getLogger("reactor.db")

# A migration waits this long for a lock the app holds, then gives way and tries again: while a
# DDL statement waits, every app query on that table queues behind it.
LOCK_TIMEOUT = "1s"
_ATTEMPTS = 30


async def migration_transaction(conn: AnyConnection, text: str) -> None:
    """Run ``text`` in one transaction that gives way to the app's locks, tried again until it
    gets them; DatabaseUnreachable when it never does."""
    # Retried whole when a lock wait gives way to the app (each attempt rolls back cleanly).
    retrying = tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(_ATTEMPTS),
        wait=tenacity.wait_random_exponential(multiplier=0.2, max=5),
        retry=tenacity.retry_if_exception_type(psycopg.errors.LockNotAvailable),
        reraise=True,
    )
    try:
        async for attempt in retrying:
            with attempt:
                async with conn.transaction():
                    await conn.execute(
                        "SELECT set_config('lock_timeout', %s, true)", (LOCK_TIMEOUT,)
                    )
                    # Every function body is compiled as it is created, whatever the database's
                    # owner set: a body that ended early fails here, before the rest runs.
                    await conn.execute("SET LOCAL check_function_bodies = on")
                    await conn.execute(text)
    except psycopg.errors.LockNotAvailable:
        raise DatabaseUnreachable(
            f"migrate could not take a table lock in {_ATTEMPTS} tries of "
            f"{LOCK_TIMEOUT}: a long transaction holds the app's tables; nothing was "
            "changed by the last try, run `reactor migrate` again later"
        ) from None


async def build(conn: AnyConnection, step: Step) -> None:
    """Build (or drop) an index while the app writes, whatever the table's kind."""
    if isinstance(step, DropIndex):
        if await _relkind(conn, step.qualified) == "I":
            # PostgreSQL drops no partitioned index CONCURRENTLY: it goes in one short
            # transaction, with its partitions' indexes, under the lock timeout that gives way
            # to the app.
            await migration_transaction(conn, step.drop(concurrently=False))
        else:
            await _unbounded(conn, step.drop())
        return
    if await _relkind(conn, identifier(*step.table)) == "p":
        # PostgreSQL builds no index CONCURRENTLY on a partitioned table: build it per partition.
        await _partitioned_index(conn, step)
        return
    # A CONCURRENTLY build that failed (a crash, a cancel) leaves an invalid index behind that
    # IF NOT EXISTS would keep for ever: drop it and build again.
    cur = await conn.execute(
        "SELECT NOT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(%s)",
        (step.qualified,),
    )
    row = await cur.fetchone()
    if row and row[0]:
        log.warning("dropping an invalid index left by an earlier build: %s", step.qualified)
        await _unbounded(conn, f"DROP INDEX CONCURRENTLY IF EXISTS {step.qualified}")
    await _unbounded(conn, step.create())


async def copied_by(conn: AnyConnection, index: Index) -> str | None:
    """The name of an index of ``index``'s table, other than itself, that does what it would:
    a valid btree whose leading key columns are its columns, in order, over the same rows (no
    predicate where it has none, the same one where it has one). None when there is none."""
    predicate = None if index.predicate is None else await _deparsed(conn, index)
    if index.predicate is not None and predicate is None:
        return None
    cur = await conn.execute(
        """
        SELECT c.relname::text
          FROM pg_index i
          JOIN pg_class c ON c.oid = i.indexrelid
          JOIN pg_am am ON am.oid = c.relam
         WHERE i.indrelid = to_regclass(%(table)s) AND i.indisvalid AND am.amname = 'btree'
           AND c.relname <> %(name)s AND i.indnkeyatts >= cardinality(%(columns)s::text[])
           AND ARRAY(SELECT a.attname::text
                       FROM generate_series(0, cardinality(%(columns)s::text[]) - 1) AS k(n)
                       JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[k.n]
                      ORDER BY k.n) = %(columns)s::text[]
           AND pg_get_expr(i.indpred, i.indrelid) IS NOT DISTINCT FROM %(predicate)s
         ORDER BY i.indisprimary DESC, c.relname
         LIMIT 1
        """,
        {
            "table": identifier(*index.table),
            "name": index.name,
            "columns": list(index.columns),
            "predicate": predicate,
        },
    )
    row = await cur.fetchone()
    return None if row is None else str(row[0])


async def _deparsed(conn: AnyConnection, index: Index) -> str | None:
    """``index``'s predicate as PostgreSQL prints an index's (pg_get_expr), to compare with the
    table's own indexes' without parsing SQL: from the same index on an empty temporary copy of
    the table's columns, rolled back. None when it cannot be made (no TEMP privilege)."""
    copy = identifier("pg_temp", "reactor_index_predicate")
    columns = ", ".join(identifier(column) for column in index.columns)
    try:
        async with conn.transaction(force_rollback=True):
            await conn.execute(f"CREATE TEMPORARY TABLE {copy} (LIKE {identifier(*index.table)})")
            await conn.execute(f"CREATE INDEX ON {copy} ({columns}) WHERE {index.predicate}")
            cur = await conn.execute(
                "SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index i"
                " WHERE i.indrelid = to_regclass(%s)",
                (copy,),
            )
            row = await cur.fetchone()
    except psycopg.Error:
        return None
    return None if row is None else str(row[0])


async def _unbounded(conn: AnyConnection, statement: str) -> None:
    # A concurrent build waits for old transactions to end, which blocks nobody: no lock
    # timeout for it.
    cur = await conn.execute("SELECT current_setting('lock_timeout')")
    row = await cur.fetchone()
    await conn.execute("SELECT set_config('lock_timeout', '0', false)")
    try:
        await conn.execute(statement)
    finally:
        if row is not None:
            await conn.execute("SELECT set_config('lock_timeout', %s, false)", (row[0],))


async def _relkind(conn: AnyConnection, name: str) -> str | None:
    cur = await conn.execute(
        "SELECT relkind::text FROM pg_class WHERE oid = to_regclass(%s)", (name,)
    )
    row = await cur.fetchone()
    return str(row[0]) if row else None


async def _partitioned_index(conn: AnyConnection, index: Index) -> None:
    """Build ``index`` on its partitioned table while the app writes to it.

    The index on the table itself is made ON ONLY it: an instant catalog change, invalid until
    each partition has its own index attached. Each partition's is then built CONCURRENTLY (a
    sub-partitioned one the same way, recursively) and attached, which makes the table's valid
    once the last one is. A run cut short resumes: partitions whose index is attached are
    skipped. A partition created or attached later gets its index from PostgreSQL itself.
    """
    await migration_transaction(conn, index.create(concurrently=False, only=True))
    cur = await conn.execute(
        """
        SELECT n.nspname::text, c.relname::text, c.relkind::text
          FROM pg_inherits i
          JOIN pg_class c ON c.oid = i.inhrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE i.inhparent = to_regclass(%(table)s)
           AND c.relkind IN ('r', 'p')
           AND NOT EXISTS (SELECT 1 FROM pg_inherits ii
                             JOIN pg_index x ON x.indexrelid = ii.inhrelid
                            WHERE ii.inhparent = to_regclass(%(index)s) AND x.indrelid = c.oid)
         ORDER BY c.oid
        """,
        {"table": identifier(*index.table), "index": index.qualified},
    )
    for schema, relname, kind in await cur.fetchall():
        child = index.on_partition((schema, relname))
        if kind == "p":
            await _partitioned_index(conn, child)
        else:
            await build(conn, child)
        await migration_transaction(
            conn, f"ALTER INDEX {index.qualified} ATTACH PARTITION {child.qualified}"
        )
    cur = await conn.execute(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (index.qualified,)
    )
    valid = await cur.fetchone()
    if not (valid and valid[0]):
        log.warning(
            "index %s is not valid yet: a partition of %s has no index",
            index.qualified,
            identifier(*index.table),
        )
