"""The script `reactor migrate --print` prints: what `reactor migrate` would apply, as SQL text
for a migration tool, written without a connection.
"""

from __future__ import annotations

from reactor.db import drift, indexes
from reactor.db.indexes import Index, Step
from reactor.db.migrations import (
    FIRST_INSTALL_WAIT_S,
    INSTALL_LOCK_SINCE,
    MIGRATE_LOCK,
    record_all_statement,
    record_statement,
    spreadable,
)
from reactor.db.online_ddl import LOCK_TIMEOUT
from reactor.install import Install, sql

# In the printed script: the statement after this line runs on its own, outside any
# transaction (CREATE INDEX CONCURRENTLY cannot run inside one, and is the point).
OUTSIDE_TRANSACTION = "-- reactor: outside-transaction"
# The script's first line: every function body is compiled as it is created, whatever the
# database's owner set (`reactor migrate` sets it in each transaction).
CHECK_BODIES = "SET check_function_bodies = on;"
# What `migrate --print` says before an index build: the script is text, written without a
# connection, so it cannot know whether the job table is partitioned or what its partitions are.
_PARTITIONED_NOTE = (
    "-- On a partitioned job table PostgreSQL refuses the next statement: run `reactor migrate`,\n"
    "-- which builds the index ON ONLY the table, CONCURRENTLY on each partition, and attaches\n"
    "-- each with ALTER INDEX ... ATTACH PARTITION; or do those steps with your tool."
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
    # The turn `reactor migrate` takes, taken the same way: before the install_lock table
    # exists, the advisory lock, waited for at most FIRST_INSTALL_WAIT_S (lock_timeout bounds an
    # advisory lock's wait too); once it does, the lease on its row, after the trust guard (the
    # lease is an UPDATE), failing the transaction while a live session holds it.
    advisory = (
        f"SET LOCAL lock_timeout = '{FIRST_INSTALL_WAIT_S:g}s';\n"
        f"SELECT pg_advisory_xact_lock({MIGRATE_LOCK});"
    )
    lease = install.query("script_install_lock", "install_lock.sql") + ";"
    timeout = f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}';"
    parts = [CHECK_BODIES]
    if reference_schema:
        parts += ["BEGIN;", sql.read("reference.sql"), "COMMIT;"]
    guard = install.query("guard", "trust.sql") + ";"
    if applied == 0:
        baseline = sql.baseline()
        parts += [f"-- a first install: the schema at version {baseline.version}", "BEGIN;"]
        parts += [advisory, timeout, guard, install.render(baseline.text).strip()]
        parts += [record_all_statement(install), "COMMIT;"]
    for migration in sql.migrations():
        if migration.version <= applied or applied == 0:
            continue
        parts += [f"-- {migration.version:04d}_{migration.name}", "BEGIN;"]
        if migration.version > INSTALL_LOCK_SINCE:
            parts += [timeout, guard, lease]
        else:
            parts += [advisory, timeout, guard]
        parts.append(install.render(migration.text).strip())
        steps = indexes.of_migration(migration.version, install)
        if not steps:
            parts += [record_statement(install, migration), "COMMIT;"]
            continue
        parts.append("COMMIT;")
        parts += _printed(steps)
        parts.append(record_statement(install, migration))
    parts += ["-- the triggers, repeatable", "BEGIN;", timeout, guard, lease]
    trigger_channel = install.channel if notify else ""
    repeatable = sql.repeatable(install.mapping)
    triggers = install.render(
        repeatable.text, channel=trigger_channel, spread=spreadable(install, spread)
    )
    parts += [triggers.strip(), drift.record_statement(install), "COMMIT;"]
    parts += _printed(indexes.repeatable(install))
    parts += [
        "-- the install lock, given up",
        install.query("release_install_lock", "install_lock.sql") + ";",
    ]
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
