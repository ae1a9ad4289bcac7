"""The migration engine: what `reactor migrate` applies, and the script it prints instead.

Migrations run on a dedicated connection, one short transaction each, while the app keeps
writing: a migration that waits on the app's locks gives way and is tried again, and index
builds run CONCURRENTLY outside any transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import psycopg
import psycopg.errors
import tenacity

from reactor.core.ownership import SHARES, share_channels
from reactor.db import drift, indexes
from reactor.db.fit import fit
from reactor.db.indexes import DropIndex, Index, Step
from reactor.db.queries import Database
from reactor.db.session import AnyConnection
from reactor.errors import ConfigError, DatabaseUnreachable, SchemaMissing, UntrustedSchema
from reactor.install import Install, sql
from reactor.install.mapping import Mapping
from reactor.install.quote import identifier, readable

# The package's one logger, named as the JSON log lines have always named it.
log = logging.getLogger("reactor.db")

# The migrations of two processes must not interleave; any constant works, this one is ours.
_MIGRATE_LOCK = 0x7265_6163  # "reac"
# A migration waits this long for a lock the app holds, then gives way and tries again: while a
# DDL statement waits, every app query on that table queues behind it.
_MIGRATE_LOCK_TIMEOUT = "1s"
_MIGRATE_ATTEMPTS = 30
# In the printed script: the statement after this line runs on its own, outside any
# transaction (CREATE INDEX CONCURRENTLY cannot run inside one, and is the point).
OUTSIDE_TRANSACTION = "-- reactor: outside-transaction"
# What `migrate --print` says before an index build: the script is text, written without a
# connection, so it cannot know whether the job table is partitioned or what its partitions are.
_PARTITIONED_NOTE = (
    "-- On a partitioned job table PostgreSQL refuses the next statement: run `reactor migrate`,\n"
    "-- which builds the index ON ONLY the table, CONCURRENTLY on each partition, and attaches\n"
    "-- each with ALTER INDEX ... ATTACH PARTITION; or do those steps with your tool."
)


# The first schema version a mapping other than the reference could install (the baseline of
# schema.sql came with the mapping): the numbered migrations before it know only the reference
# tables, and the ones after it are rendered for any mapping.
MAPPED_SINCE = 14


@dataclass(frozen=True)
class Migrated:
    """What `reactor migrate` did: the install it left (the mapping typed by the catalog, the
    channel), and the migrations it applied (none when the schema was up to date)."""

    install: Install
    applied: list[int]
    # The indexes it did not build because the table has one that does the same, as
    # (the index it would have built, the table's own).
    skipped: list[tuple[str, str]] = field(default_factory=list)
    # The install was recorded for another render of the mapping file, and this one re-installed
    # its functions and triggers for the file as it is now.
    reinstalled: bool = False


async def schema_version(conn: AnyConnection, schema: str) -> int | None:
    """The newest applied migration in the reactor's ``schema``, or None when it is absent."""
    versions = identifier(schema, "schema_version")
    cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (versions,))
    row = await cur.fetchone()
    if not row or not row[0]:
        return None
    cur = await conn.execute(f"SELECT max(version) FROM {versions}")
    row = await cur.fetchone()
    return row[0] if row else None


async def require_schema(conn: AnyConnection, schema: str) -> None:
    """Raise SchemaMissing unless every migration of this release is applied in ``schema``."""
    found = await schema_version(conn, schema)
    needed = sql.latest_version()
    if found is None or found < needed:
        have = "no reactor schema" if found is None else f"schema version {found}"
        raise SchemaMissing(
            f"the database has {have}, this reactor needs version {needed}; "
            "run `reactor migrate` (or apply `reactor migrate --print`)"
        )


def migration_script(
    install: Install,
    *,
    reference_schema: bool,
    applied: int = 0,
    notify: bool = True,
    spread: bool = False,
) -> str:
    """The SQL `reactor migrate` runs from version ``applied``, for a migration tool to apply;
    with ``notify`` False, the job trigger queues without notifying; with ``spread``, it
    notifies each share of the jobs on a channel of its own.

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
    guard = install.query("guard", "trust.sql") + ";"
    if applied == 0:
        baseline = sql.baseline()
        parts += [f"-- a first install: the schema at version {baseline.version}", "BEGIN;"]
        parts += [lock, timeout, guard, install.render(baseline.text).strip()]
        parts += [_record_all_statement(install), "COMMIT;"]
    for migration in sql.migrations():
        if migration.version <= applied or applied == 0:
            continue
        parts += [f"-- {migration.version:04d}_{migration.name}", "BEGIN;", lock, timeout, guard]
        parts.append(install.render(migration.text).strip())
        steps = indexes.of_migration(migration.version, install)
        if not steps:
            parts += [_record_statement(install, migration), "COMMIT;"]
            continue
        parts.append("COMMIT;")
        parts += _printed(steps)
        parts.append(_record_statement(install, migration))
    parts += ["-- the triggers, repeatable", "BEGIN;", lock, timeout, guard]
    trigger_channel = install.channel if notify else ""
    repeatable = sql.repeatable()
    triggers = install.render(
        repeatable.text, channel=trigger_channel, spread=_spreadable(install, spread)
    )
    parts += [triggers.strip(), drift.record_statement(install), "COMMIT;"]
    parts += _printed(indexes.repeatable(install))
    parts.append(
        "-- Jobs that finished before the triggers existed are not queued yet: run\n"
        "-- `reactor sweep --once`, or let a running reactor's reconcile pass find them."
    )
    parts.append(_reviewed(install))
    return "\n".join(parts) + "\n"


# The statements the running reactor sends to the app's tables, printed after the script for
# review, as comments (the script does not run them), each under when it runs.
_REVIEWED = (
    (
        "record_jobs",
        "`reactor run`, when a queued job's grace has passed: claims the jobs (FOR NO KEY\n"
        "UPDATE ... SKIP LOCKED), writes their runs and queues their hooks.",
    ),
    (
        "record_oldest",
        "`reactor run`'s fallback scan, and `reactor sweep --once`: the same claim and write\n"
        "for the oldest queued jobs past their grace.",
    ),
    (
        "reconcile_step",
        "The reconcile's walk, every REACTOR_RECONCILE_INTERVAL_SECONDS, by `reactor run`,\n"
        "`reactor sweep --once` and `reactor migrate`: reads the job and run tables in\n"
        "chunks and queues the jobs that need a run and are not queued.",
    ),
)


def _reviewed(install: Install) -> str:
    """The statements of :data:`_REVIEWED` rendered for ``install``'s mapping, commented out:
    %(name)s are the parameters each is sent with."""
    lines = [
        "",
        "-- ------------------------------------------------------------------------------",
        "-- For review, not run by this script: the statements the running reactor sends",
        "-- to the app's tables, rendered for this mapping.",
    ]
    templates = sql.templates()
    for name, when in _REVIEWED:
        lines += ["--", f"-- {name}: {when.splitlines()[0]}"]
        lines += [f"-- {line}" for line in when.splitlines()[1:]]
        lines.append("--")
        rendered = sql.render(templates[name], install.mapping, channel=install.channel)
        lines += [f"--   {line}".rstrip() for line in rendered.strip().splitlines()]
    return "\n".join(lines)


def _printed(steps: tuple[Step, ...]) -> list[str]:
    # The marker names the one statement after it: run it on its own, in autocommit.
    parts = []
    for step in steps:
        if isinstance(step, Index):
            parts += [_PARTITIONED_NOTE, OUTSIDE_TRANSACTION, f"{step.create()};"]
        else:
            parts += [OUTSIDE_TRANSACTION, f"{step.drop()};"]
    return parts


async def migrate(
    conn: AnyConnection,
    mapping: Mapping,
    *,
    channel: str | None = None,
    reference_schema: bool = False,
    notify: bool | None = None,
    spread: bool | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> Migrated:
    """Install or upgrade the reactor for ``mapping``'s tables, then walk the jobs once.

    Safe while the app writes, and safe to run concurrently: a session advisory lock makes a
    second migrate wait, then find nothing to do. Each migration is its own short transaction
    that waits at most a second for the app's locks and is retried; index builds run
    CONCURRENTLY outside it. The triggers are always re-pointed at ``channel`` (None: the
    mapping's own), so changing REACTOR_CHANNEL takes effect; with ``notify`` False they queue
    without notifying, and with None they keep the choice installed (notifying on a first
    install). ``spread`` likewise: each share of the jobs on a channel of its own, so that a
    replica hears only its own (not on a first install).

    Last comes a full reconcile pass. The triggers exist and are committed by then, so a job
    that turned eligible before they did is found by the pass, and any later one by them:
    nothing finishing during the install falls between the two. ``on_progress`` hears the
    number of jobs walked so far.
    """
    # Unbounded: an index build over a big table takes what it takes, and only waits.
    await conn.execute("SELECT set_config('statement_timeout', '0', false)")
    await _take_migrate_lock(conn)
    try:
        # Trust before harm: the reactor's schema is made by this role, or is this role's own
        # with nothing of another's in it. Nothing is changed before both checks pass.
        fresh = await _own_schema(conn, mapping.reactor_schema)
        await Database.dedicated(Install.of(mapping), conn).require_trusted()
        if reference_schema:
            await _migration_transaction(conn, sql.read("reference.sql"))
        # Checks before harm: nothing is changed until the mapping fits the app's tables.
        install = Install.of(
            await fit(conn, mapping, installing=True, reference_schema=reference_schema), channel
        )
        queries = Database.dedicated(install, conn)
        # How the job trigger notifies: as asked, else as installed, else the first install's.
        installed = await queries.job_trigger()
        if notify is None:
            notify = installed is None or installed.channel != ""
        if spread is None:
            spread = installed is not None and installed.spread
        spread = _spreadable(install, spread)
        applied = await schema_version(conn, install.schema) or 0
        reinstalled = await drift.mapping_changed(conn, install)
        done = []
        if applied == 0:
            text = install.render(sql.baseline().text) + _record_all_statement(install)
            if fresh:
                # Made here, or the install fails: a schema planted since the check above would
                # otherwise be adopted by the baseline's IF NOT EXISTS.
                text = f"CREATE SCHEMA {identifier(install.schema)};\n{text}"
            # One transaction: the schema and its versions appear together or not at all.
            await _migration_transaction(conn, text)
            done = [m.version for m in sql.migrations()]
        elif not install.mapping.is_reference and applied < MAPPED_SINCE:
            raise ConfigError(
                f"the reactor's schema here is at version {applied}, installed for the reference "
                f"tables; upgrade it to version {MAPPED_SINCE} with the reference mapping "
                "(REACTOR_CONFIG unset) first"
            )
        for migration in sql.migrations():
            if migration.version <= applied or applied == 0:
                continue
            steps = indexes.of_migration(migration.version, install)
            text = install.render(migration.text)
            if not steps:
                text += ";\n" + _record_statement(install, migration)
            await _migration_transaction(conn, text)
            for step in steps:
                await _build(conn, step)
            if steps:
                await _migration_transaction(conn, _record_statement(install, migration))
            done.append(migration.version)
        repeatable = sql.repeatable()
        text = install.render(
            repeatable.text, channel=install.channel if notify else "", spread=spread
        )
        # With the functions it stands for, in their transaction.
        await _migration_transaction(conn, f"{text}\n{drift.record_statement(install)}")
        skipped = []
        for step in indexes.repeatable(install):
            copied = await _copied_by(conn, step) if isinstance(step, Index) else None
            if copied is None or not isinstance(step, Index):
                await _build(conn, step)
                continue
            skipped.append((readable(step.table[0], step.name), copied))
            # One an earlier migrate built before it looked (the (id, id) of a one-to-one job
            # table) is a copy too.
            await _build(conn, DropIndex(step.table[0], step.name))
        # Nothing was made meanwhile by another role: the definer functions are trusted now.
        await queries.require_trusted()
        # After an install, the pass queues what finished before the triggers existed: that is
        # expected, not drift. After a plain re-run, whatever it finds is drift.
        owner = "install" if done else "migrate"
        await queries.reconcile_pass(owner, on_progress=on_progress)
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATE_LOCK,))
    return Migrated(install, done, skipped, reinstalled)


def _spreadable(install: Install, spread: bool) -> bool:
    """``spread``, once the channel is known to take a share's suffix."""
    if spread and share_channels(install.channel) is None:
        raise ConfigError(
            f"the channel {install.channel!r} is too long for --spread: a share's channel "
            f"appends '.{SHARES - 1}', and a channel name is at most 63 bytes; set a shorter "
            "REACTOR_CHANNEL, or migrate with --no-spread"
        )
    return spread


async def _own_schema(conn: AnyConnection, schema: str) -> bool:
    """True when ``schema`` does not exist yet (the install makes it), False when the migrating
    role owns it; UntrustedSchema when another role does: a schema another role made may hold
    what that role wants the definer functions to run."""
    cur = await conn.execute(
        "SELECT pg_get_userbyid(nspowner)::text, current_user::text FROM pg_namespace "
        "WHERE nspname = %s",
        (schema,),
    )
    row = await cur.fetchone()
    if row is None:
        return True
    owner, me = row
    if owner != me:
        raise UntrustedSchema(
            f"schema {schema} exists and belongs to role {owner}, not to {me}, which runs "
            "`reactor migrate`; the reactor installs only into a schema it made itself: run "
            f"`reactor migrate` as {owner} if that role is the install's owner, else drop the "
            f"schema (DROP SCHEMA {readable(schema)} CASCADE) or set reactor_schema to a new one"
        )
    return False


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


async def _migration_transaction(conn: AnyConnection, text: str) -> None:
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
    except psycopg.errors.LockNotAvailable:
        raise DatabaseUnreachable(
            f"migrate could not take a table lock in {_MIGRATE_ATTEMPTS} tries of "
            f"{_MIGRATE_LOCK_TIMEOUT}: a long transaction holds the app's tables; nothing was "
            "changed by the last try, run `reactor migrate` again later"
        ) from None


async def _build(conn: AnyConnection, step: Step) -> None:
    """Build (or drop) an index while the app writes, whatever the table's kind."""
    if isinstance(step, DropIndex):
        if await _relkind(conn, step.qualified) == "I":
            # PostgreSQL drops no partitioned index CONCURRENTLY: it goes in one short
            # transaction, with its partitions' indexes, under the lock timeout that gives way
            # to the app.
            await _migration_transaction(conn, step.drop(concurrently=False))
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


async def _copied_by(conn: AnyConnection, index: Index) -> str | None:
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


def _record_all_statement(install: Install) -> str:
    """Marks every migration applied: what a first install from the baseline leaves."""
    values = ", ".join(f"({m.version}, '{m.name}')" for m in sql.migrations())
    return (
        f"\nINSERT INTO {readable(install.schema, 'schema_version')} (version, name) "
        f"VALUES {values} ON CONFLICT DO NOTHING;"
    )


def _record_statement(install: Install, migration: sql.Migration) -> str:
    return (
        f"INSERT INTO {readable(install.schema, 'schema_version')} (version, name) "
        f"VALUES ({migration.version}, '{migration.name}') ON CONFLICT DO NOTHING;"
    )


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
    await _migration_transaction(conn, index.create(concurrently=False, only=True))
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
            await _build(conn, child)
        await _migration_transaction(
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
