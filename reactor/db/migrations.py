"""The migration engine: what `reactor migrate` applies, and the script it prints instead.

Migrations run on a dedicated connection, one short transaction each, while the app keeps
writing: a migration that waits on the app's locks gives way and is tried again, and index
builds run CONCURRENTLY outside any transaction.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable

import anyio
import psycopg
import psycopg.errors
import tenacity

from reactor import mapping, sql
from reactor.db.fit import fitted
from reactor.db.queries import job_trigger, reconcile_pass
from reactor.db.session import AnyConnection
from reactor.errors import ConfigError, DatabaseUnreachable, SchemaMissing

# The package's one logger, named as the JSON log lines have always named it.
log = logging.getLogger("reactor.db")

# The migrations of two processes must not interleave; any constant works, this one is ours.
_MIGRATE_LOCK = 0x7265_6163  # "reac"
# A migration waits this long for a lock the app holds, then gives way and tries again: while a
# DDL statement waits, every app query on that table queues behind it.
_MIGRATE_LOCK_TIMEOUT = "1s"
_MIGRATE_ATTEMPTS = 30
# CREATE INDEX CONCURRENTLY IF NOT EXISTS <name> ON <table> <the rest of the definition>.
_CONCURRENT_INDEX = re.compile(
    r"CREATE\s+INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+(\w+|\"[^\"]+\")\s+ON\s+([\w.\"]+)(.*)",
    re.IGNORECASE | re.DOTALL,
)
_CONCURRENT_DROP = re.compile(
    r"DROP\s+INDEX\s+CONCURRENTLY\s+IF\s+EXISTS\s+(\w+)\s*$", re.IGNORECASE
)
# The longest identifier PostgreSQL keeps (NAMEDATALEN - 1).
_MAX_NAME = 63
# What `migrate --print` says before an index build: the script is text, written without a
# connection, so it cannot know whether analysis_jobs is partitioned or what its partitions are.
_PARTITIONED_NOTE = (
    "-- On a partitioned job table PostgreSQL refuses the next statement: run `reactor migrate`,\n"
    "-- which builds the index ON ONLY the table, CONCURRENTLY on each partition, and attaches\n"
    "-- each with ALTER INDEX ... ATTACH PARTITION; or do those steps with your tool."
)


async def schema_version(conn: AnyConnection) -> int | None:
    """The newest applied migration, or None when the reactor's schema is absent."""
    versions = f"{mapping.in_force().reactor_schema}.schema_version"
    cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (versions,))
    row = await cur.fetchone()
    if not row or not row[0]:
        return None
    cur = await conn.execute(f"SELECT max(version) FROM {versions}")
    row = await cur.fetchone()
    return row[0] if row else None


async def require_schema(conn: AnyConnection) -> None:
    """Raise SchemaMissing unless every migration of this release is applied."""
    found = await schema_version(conn)
    needed = sql.latest_version()
    if found is None or found < needed:
        have = "no reactor schema" if found is None else f"schema version {found}"
        raise SchemaMissing(
            f"the database has {have}, this reactor needs version {needed}; "
            "run `reactor migrate` (or apply `reactor migrate --print`)"
        )


def migration_script(
    channel: str, *, reference_schema: bool, applied: int = 0, notify: bool = True
) -> str:
    """The SQL `reactor migrate` runs from version ``applied``, for a migration tool to apply;
    with ``notify`` False, the job trigger queues without notifying.

    Each migration is one transaction; the statements that must run outside any transaction
    (index builds that leave the app writing) follow it, marked as such. The walk that queues
    the jobs which finished before the triggers existed is the reactor's, not SQL's: the script
    ends by saying to run `reactor sweep --once`, or to let a running reactor's reconcile do it.
    """
    lock = f"SELECT pg_advisory_xact_lock({_MIGRATE_LOCK});"
    timeout = f"SET LOCAL lock_timeout = '{_MIGRATE_LOCK_TIMEOUT}';"
    parts = []
    if reference_schema:
        parts += ["BEGIN;", sql.read("reference.sql"), "COMMIT;"]
    if applied == 0:
        baseline = sql.baseline()
        parts += [f"-- a first install: the schema at version {baseline.version}", "BEGIN;"]
        parts += [lock, timeout, sql.render(baseline.in_transaction).strip()]
        parts += [_record_all_statement(), "COMMIT;"]
    for migration in sql.migrations():
        if migration.version <= applied or applied == 0:
            continue
        record = (
            "INSERT INTO reactor.schema_version (version, name) "
            f"VALUES ({migration.version}, '{migration.name}') ON CONFLICT DO NOTHING;"
        )
        parts += [f"-- {migration.version:04d}_{migration.name}", "BEGIN;", lock, timeout]
        parts.append(sql.render(migration.in_transaction, channel=channel).strip())
        if not migration.outside_transaction:
            parts += [record, "COMMIT;"]
            continue
        parts.append("COMMIT;")
        # The marker names the one statement after it: run it on its own, in autocommit.
        for statement in migration.outside_transaction:
            if _CONCURRENT_INDEX.search(statement):
                parts.append(_PARTITIONED_NOTE)
            parts += [sql.OUTSIDE_TRANSACTION, f"{statement};"]
        parts.append(record)
    parts += ["-- the triggers, repeatable", "BEGIN;", lock, timeout]
    trigger_channel = channel if notify else ""
    repeatable = sql.repeatable()
    parts += [sql.render(repeatable.in_transaction, channel=trigger_channel).strip(), "COMMIT;"]
    for statement in map(sql.render, repeatable.outside_transaction):
        if _CONCURRENT_INDEX.search(statement):
            parts.append(_PARTITIONED_NOTE)
        parts += [sql.OUTSIDE_TRANSACTION, f"{statement};"]
    parts.append(
        "-- Jobs that finished before the triggers existed are not queued yet: run\n"
        "-- `reactor sweep --once`, or let a running reactor's reconcile pass find them."
    )
    return "\n".join(parts) + "\n"


async def migrate(
    conn: AnyConnection,
    channel: str,
    *,
    reference_schema: bool,
    notify: bool | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> list[int]:
    """Apply what is missing, then walk the jobs once; return the versions applied.

    Safe while the app writes, and safe to run concurrently: a session advisory lock makes a
    second migrate wait, then find nothing to do. Each migration is its own short transaction
    that waits at most a second for the app's locks and is retried; index builds run
    CONCURRENTLY outside it. The triggers are always re-pointed at ``channel``, so changing
    REACTOR_CHANNEL takes effect; with ``notify`` False they queue without notifying, and with
    None they keep the choice installed (notifying on a first install).

    Last comes a full reconcile pass. The triggers exist and are committed by then, so a job
    that turned eligible before they did is found by the pass, and any later one by them:
    nothing finishing during the install falls between the two. ``on_progress`` hears the
    number of jobs walked so far.
    """
    # Unbounded: an index build over a big table takes what it takes, and only waits.
    await conn.execute("SELECT set_config('statement_timeout', '0', false)")
    await _take_migrate_lock(conn)
    try:
        if reference_schema:
            await _migration_transaction(conn, sql.read("reference.sql"))
        # Checks before harm: nothing is changed until the mapping fits the app's tables.
        mapping = await fitted(conn, installing=True, reference_schema=reference_schema)
        applied = await schema_version(conn) or 0
        done = []
        if applied == 0:
            await _install_baseline(conn)
            done = [m.version for m in sql.migrations()]
        elif not mapping.is_reference and applied < sql.latest_version():
            raise ConfigError(
                f"the reactor's schema here is at version {applied}, installed for the reference "
                "tables; upgrade it with the reference mapping (REACTOR_CONFIG unset) first"
            )
        for migration in sql.migrations():
            if migration.version <= applied or applied == 0:
                continue
            text = sql.render(migration.in_transaction, channel=channel)
            outside = migration.outside_transaction
            await _migration_transaction(conn, text, None if outside else migration)
            for statement in outside:
                await _outside_transaction(conn, statement)
            if outside:
                await _record_version(conn, migration)
            done.append(migration.version)
        if notify is None:
            installed = await job_trigger(conn)
            notify = installed is None or installed[0] != ""
        repeatable = sql.repeatable()
        text = sql.render(repeatable.in_transaction, channel=channel if notify else "")
        await _migration_transaction(conn, text)
        for statement in repeatable.outside_transaction:
            await _outside_transaction(conn, sql.render(statement))
        # After an install, the pass queues what finished before the triggers existed: that is
        # expected, not drift. After a plain re-run, whatever it finds is drift.
        owner = "install" if done else "migrate"
        await reconcile_pass(conn, owner=owner, on_progress=on_progress)
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATE_LOCK,))
    return done


async def _take_migrate_lock(conn: AnyConnection) -> None:
    # Polled, never waited for inside a statement: a waiting statement holds a snapshot, and
    # the other migrate's CREATE INDEX CONCURRENTLY waits for every older snapshot to end.
    # Waiting in the lock would deadlock the two.
    waited = False
    while True:
        cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (_MIGRATE_LOCK,))
        row = await cur.fetchone()
        if row and row[0]:
            return
        if not waited:
            log.info("another `reactor migrate` is running; waiting for it to finish")
            waited = True
        await anyio.sleep(0.2)


async def _migration_transaction(
    conn: AnyConnection, text: str, migration: sql.Migration | None = None
) -> None:
    # Retried whole when a lock wait gives way to the app (each attempt rolls back cleanly).
    retrying = tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(_MIGRATE_ATTEMPTS),
        wait=tenacity.wait_random_exponential(multiplier=0.2, max=5),
        retry=tenacity.retry_if_exception_type(psycopg.errors.LockNotAvailable),
        reraise=True,
    )
    try:
        async for attempt in retrying:
            with attempt:
                async with conn.transaction():
                    await conn.execute(
                        "SELECT set_config('lock_timeout', %s, true)", (_MIGRATE_LOCK_TIMEOUT,)
                    )
                    await conn.execute(text)
                    if migration is not None:
                        await _record_version(conn, migration)
    except psycopg.errors.LockNotAvailable:
        raise DatabaseUnreachable(
            f"migrate could not take a table lock in {_MIGRATE_ATTEMPTS} tries of "
            f"{_MIGRATE_LOCK_TIMEOUT}: a long transaction holds analysis_jobs or analysis_runs; "
            "nothing was changed by the last try, run `reactor migrate` again later"
        ) from None


async def _outside_transaction(conn: AnyConnection, statement: str) -> None:
    index = _CONCURRENT_INDEX.search(statement)
    if index and await _relkind(conn, index.group(2)) == "p":
        # PostgreSQL builds no index CONCURRENTLY on a partitioned table: build it per partition.
        name = index.group(1).strip('"')
        await _partitioned_index(conn, name, index.group(2), index.group(3))
        return
    dropped = _CONCURRENT_DROP.search(statement)
    if dropped and await _relkind(conn, dropped.group(1)) == "I":
        # Nor does it drop a partitioned index CONCURRENTLY: it goes in one short transaction,
        # with its partitions' indexes, under the lock timeout that gives way to the app.
        await _migration_transaction(conn, f"DROP INDEX IF EXISTS {dropped.group(1)}")
        return
    if index:
        # A CONCURRENTLY build that failed (a crash, a cancel) leaves an invalid index behind
        # that IF NOT EXISTS would keep for ever: drop it and build again.
        cur = await conn.execute(
            "SELECT NOT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(%s)",
            (index.group(1),),
        )
        row = await cur.fetchone()
        if row and row[0]:
            log.warning("dropping an invalid index left by an earlier build: %s", index.group(1))
            await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index.group(1)}")
    # It waits for old transactions to end, which blocks nobody: no lock timeout for it.
    cur = await conn.execute("SELECT current_setting('lock_timeout')")
    row = await cur.fetchone()
    await conn.execute("SELECT set_config('lock_timeout', '0', false)")
    try:
        await conn.execute(statement)
    finally:
        if row is not None:
            await conn.execute("SELECT set_config('lock_timeout', %s, false)", (row[0],))


async def _install_baseline(conn: AnyConnection) -> None:
    # One transaction: the schema and its versions appear together or not at all.
    text = sql.render(sql.baseline().text) + _record_all_statement()
    await _migration_transaction(conn, text)


def _record_all_statement() -> str:
    """Marks every migration applied: what a first install from the baseline leaves."""
    values = ", ".join(f"({m.version}, '{m.name}')" for m in sql.migrations())
    return (
        f"\nINSERT INTO {mapping.in_force().reactor_schema}.schema_version (version, name) "
        f"VALUES {values} "
        "ON CONFLICT DO NOTHING;"
    )


async def _relkind(conn: AnyConnection, name: str) -> str | None:
    cur = await conn.execute(
        "SELECT relkind::text FROM pg_class WHERE oid = to_regclass(%s)", (name,)
    )
    row = await cur.fetchone()
    return str(row[0]) if row else None


async def _partitioned_index(conn: AnyConnection, name: str, table: str, definition: str) -> None:
    """Build index ``name`` on partitioned ``table`` while the app writes to it.

    The index on the table itself is made ON ONLY it: an instant catalog change, invalid until
    each partition has its own index attached. Each partition's is then built CONCURRENTLY (a
    sub-partitioned one the same way, recursively) and attached, which makes the table's valid
    once the last one is. A run cut short resumes: partitions whose index is attached are
    skipped. A partition created or attached later gets its index from PostgreSQL itself.
    """
    await _migration_transaction(
        conn, f"CREATE INDEX IF NOT EXISTS {_ident(name)} ON ONLY {table}{definition}"
    )
    cur = await conn.execute(
        "SELECT c.oid::regclass::text, c.relname::text FROM pg_class c"
        " WHERE c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = to_regclass(%s))"
        "   AND c.relname = %s",
        (table, name),
    )
    found = await cur.fetchone()
    if found is None:
        raise RuntimeError(f"index {name} on {table} was not created")
    parent_index = str(found[0])
    cur = await conn.execute(
        """
        SELECT c.oid::regclass::text, c.relname::text, c.relkind::text,
               (SELECT relname::text FROM pg_class WHERE oid = to_regclass(%(table)s))
          FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = to_regclass(%(table)s)
           AND c.relkind IN ('r', 'p')
           AND NOT EXISTS (SELECT 1 FROM pg_inherits ii
                             JOIN pg_index x ON x.indexrelid = ii.inhrelid
                            WHERE ii.inhparent = to_regclass(%(index)s) AND x.indrelid = c.oid)
         ORDER BY c.oid
        """,
        {"table": table, "index": parent_index},
    )
    for partition, relname, kind, table_relname in await cur.fetchall():
        child = _partition_index_name(name, str(table_relname), str(relname))
        if kind == "p":
            await _partitioned_index(conn, child, partition, definition)
        else:
            build = f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {_ident(child)} ON {partition}"
            await _outside_transaction(conn, build + definition)
        await _migration_transaction(
            conn, f"ALTER INDEX {parent_index} ATTACH PARTITION {_qualified(partition, child)}"
        )
    cur = await conn.execute(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (parent_index,)
    )
    valid = await cur.fetchone()
    if not (valid and valid[0]):
        log.warning("index %s is not valid yet: a partition of %s has no index", name, table)


def _partition_index_name(index: str, table: str, partition: str) -> str:
    """The name of a partition's index: the partition's name where the index names the table."""
    suffix = index[len(table) + 1 :] if index.startswith(f"{table}_") else index
    name = f"{partition}_{suffix}"
    if len(name) > _MAX_NAME:
        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        name = f"{name[: _MAX_NAME - 9]}_{digest}"
    return name


def _qualified(partition: str, index: str) -> str:
    """``index`` in the schema of ``partition`` (a regclass text, qualified when it must be)."""
    schema, dot, _ = partition.rpartition(".")
    return f"{schema}.{_ident(index)}" if dot else _ident(index)


def _ident(name: str) -> str:
    return psycopg.sql.Identifier(name).as_string(None)


async def _record_version(conn: AnyConnection, migration: sql.Migration) -> None:
    await conn.execute(
        f"INSERT INTO {mapping.in_force().reactor_schema}.schema_version (version, name) "
        "VALUES (%s, %s) ON CONFLICT DO NOTHING",
        (migration.version, migration.name),
    )
