"""One round of app_cost: pgbench playing the worker for a few seconds on one install, from an
empty table, and what the server counted meanwhile; and the record check after the rounds."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from bench import pgbench
from bench.app_cost.installs import (
    CONFIGS,
    QUEUE_FOREIGN_KEYS,
    QUEUE_PERSISTENCE,
    Config,
    Installed,
)
from bench.conn import Conn, connect, dbname, scalar
from bench.server import Server
from bench.workload import (
    APP,
    RESULTS,
    bench_settings,
    insert_jobs,
    replicas,
    wait_for_first_scan,
    wait_until_recorded,
)

CLIENTS = 2
DOCUMENTS = 16
DOC_BYTES = 32 * 1024
# Durable commits: the embedded cluster's defaults turn fsync off for tests.
DURABLE = {"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on"}
SERVER = {
    **DURABLE,
    # Times PL/pgSQL functions, the job trigger's among them (pg_stat_user_functions).
    "track_functions": "pl",
    # Every round starts from an empty table, so vacuum has nothing to carry from one round to
    # the next; a worker arriving at a random moment in some rounds would only add its own I/O
    # and WAL to whichever install happened to be running.
    "autovacuum": "off",
}

# Fourteen sets: a Williams square over seven installs is fourteen rows (the square and its
# mirror).
SETS = 14
ROUND_S = 5
QUICK_ROUND_S = 2

# One job's life; each statement commits on its own, as the worker's do. -M prepared turns :job
# into a parameter.
JOB_LIFE = """\\set n random(1, {documents})
INSERT INTO analysis_jobs (id, run_id, status, doc_html)
SELECT gen_random_uuid(), gen_random_uuid(), 'running', d.doc FROM bench_docs d WHERE d.i = :n
RETURNING id AS job \\gset
UPDATE analysis_jobs SET results = coalesce(results, '{{}}'::jsonb)
       || '{{"citations": {{"verdict": "ok", "checked": 41}}}}', updated_at = now()
 WHERE id = :job;
UPDATE analysis_jobs SET results = results
       || '{{"links": {{"verdict": "warn", "broken": 2}}}}', updated_at = now()
 WHERE id = :job;
UPDATE analysis_jobs SET results = results
       || '{{"style": {{"verdict": "ok", "notes": ["passive voice"]}}}}', updated_at = now()
 WHERE id = :job;
UPDATE analysis_jobs SET status = 'complete', updated_at = now() WHERE id = :job;
"""
UPDATES_PER_LIFE = 4

UPDATE_COUNTS = """
SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'analysis_jobs'::regclass
"""

# The job trigger's own time: total_time includes what it calls (the queue insert, the NOTIFY's
# queueing), so only the trigger function is summed, never its callees as well.
TRIGGER_TIME = """
SELECT coalesce(sum(total_time), 0), coalesce(sum(calls), 0) FROM pg_stat_user_functions
 WHERE (schemaname = %s AND funcname LIKE 'job\\_changed%%')
    OR (schemaname = 'public' AND funcname = 'bench_notify_only')
"""

# The record check: jobs finished with an unlogged queue, recorded by a replica of short grace.
CHECK_JOBS = 20
CHECK_GRACE_S = 0.5

PGBENCH_SESSIONS = """
SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = 'pgbench'
"""


@dataclass(frozen=True)
class Counters:
    """The server's running totals that a round is the difference of."""

    wal: int  # pg_current_wal_lsn() as a number of bytes
    updates: int
    hot: int
    trigger_ms: float
    trigger_calls: int


async def add_documents(conn: Conn) -> None:
    """The documents the job lives write (``bench_docs``), made once in each database."""
    await conn.execute(
        "CREATE TABLE bench_docs AS SELECT i, bench_doc(i, %s) AS doc"
        " FROM generate_series(1, %s) i",
        (DOC_BYTES, DOCUMENTS),
    )


@asynccontextmanager
async def documents_app(server: Server, name: str) -> AsyncIterator[tuple[str, Conn, Installed]]:
    """The app's database ``name`` on ``server`` (no audit) with its documents, its DSN, a
    setup connection to it, and what `reactor migrate` installed on its tables."""
    dsn = await server.app_database(name, with_audit=False)
    async with await connect(dsn, "setup") as conn:
        await add_documents(conn)
        yield dsn, conn, await Installed.read(conn)


def set_orders(names: Sequence[str], sets: int) -> list[list[str]]:
    """The order of each set: the rows of a Williams square over ``names``, in turn.

    In a Williams square every name is once in each position, and follows every other name
    exactly once (for an odd count, the square and its mirror together), so neither a slot
    in the set nor a predecessor's after-effects favour any install.
    """
    n = len(names)
    first = [0]
    for step in range(1, n):
        first.append((step + 1) // 2 if step % 2 else n - step // 2)
    rows = [[(k + shift) % n for k in first] for shift in range(n)]
    if n % 2:
        rows += [list(reversed(row)) for row in rows]
    return [[names[k] for k in rows[i % len(rows)]] for i in range(sets)]


async def one_round(
    server: Server, dsn: str, script: Path, reactor: Installed, name: str, seconds: int
) -> dict[str, Any]:
    """One round of ``seconds`` on install ``name``, from an empty table; what it measured."""
    async with await connect(dsn, "setup") as conn:
        await conn.execute(f"TRUNCATE analysis_jobs, {reactor.schema}.pending")
        await reactor.install(conn, CONFIGS[name])
        await conn.execute("CHECKPOINT")
        before = await _counters(conn, reactor.schema)
    # The replica runs in this process and pgbench in a child of its own: this process's CPU
    # time over the round is what the replica took from the box.
    cpu = time.process_time()
    lives, tps = await _pgbench(server, dsn, script, seconds)
    cpu = time.process_time() - cpu
    async with await connect(dsn, "check") as conn:
        await _settle(conn, dbname(dsn), before, lives)
        after = await _counters(conn, reactor.schema)
    return {
        "config": name,
        "tps": tps,
        "lives": lives,
        "wal_bytes": after.wal - before.wal,
        "updates": after.updates - before.updates,
        "hot": after.hot - before.hot,
        "trigger_ms": after.trigger_ms - before.trigger_ms,
        "trigger_calls": after.trigger_calls - before.trigger_calls,
        "replica_cpu_share": cpu / seconds,
    }


async def record_check(dsn: str, reactor: Installed, config: Config) -> dict[str, Any]:
    """Whether jobs finished with ``config`` in place get recorded: CHECK_JOBS jobs finished
    one by one by the worker, then a replica with a short grace (and scan interval) given
    30 s to record them all; with what was left in the queue afterwards."""
    queue = f"{reactor.schema}.pending"
    async with await connect(dsn, "check") as conn:
        await conn.execute(f"TRUNCATE analysis_jobs, {queue}")
        await reactor.install(conn, config)
        persistence = str(await scalar(conn, QUEUE_PERSISTENCE, (queue,)))
        cur = await conn.execute(QUEUE_FOREIGN_KEYS, {"queue": queue})
        keys = ", ".join(f"{n} ({a} -> {b})" for n, a, b in await cur.fetchall())
        ids = await insert_jobs(conn, CHECK_JOBS, doc_bytes=2000)
        settings = bench_settings(dsn, grace=CHECK_GRACE_S, scan_interval=1.0)
        async with replicas(settings, 1) as running:
            await wait_for_first_scan(running)
            for job in ids:
                await conn.execute(*APP.finish(job, verdicts=RESULTS))
            missing = await wait_until_recorded(conn, within=30)
        left = int(await scalar(conn, f"SELECT count(*) FROM {queue}"))
    return {
        "config": config.label.split(":")[0],
        "persistence": persistence,
        "jobs": len(ids),
        "missing": missing,
        "left_in_queue": left,
        "foreign_keys": keys,
    }


async def _counters(conn: Conn, schema: str) -> Counters:
    wal = int(await scalar(conn, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))
    cur = await conn.execute(UPDATE_COUNTS)
    row = await cur.fetchone()
    assert row is not None
    cur = await conn.execute(TRIGGER_TIME, (schema,))
    timed = await cur.fetchone()
    assert timed is not None
    return Counters(wal, int(row[0]), int(row[1]), float(timed[0]), int(timed[1]))


async def _settle(conn: Conn, database: str, before: Counters, lives: int) -> None:
    """Wait until every pgbench session has flushed its statistics.

    A backend flushes them as it exits (before it leaves pg_stat_activity), which may come a
    moment after pgbench returns: wait until the sessions are gone and the round's updates are
    all counted (a life cut off by the end of the round may add a few more).
    """
    expected = before.updates + lives * UPDATES_PER_LIFE
    with anyio.move_on_after(10):
        # The server has no event for either: poll.
        while int(await scalar(conn, PGBENCH_SESSIONS, (database,))) > 0:  # noqa: ASYNC110
            await anyio.sleep(0.05)
        while int(await scalar(conn, UPDATE_COUNTS)) < expected:  # noqa: ASYNC110
            await anyio.sleep(0.1)


async def _pgbench(server: Server, dsn: str, script: Path, seconds: int) -> tuple[int, float]:
    """(job lives completed, job lives per second)."""
    argv = [
        str(server.bin_dir / "pgbench"), "-n", "-M", "prepared", "-c", str(CLIENTS),
        "-j", str(CLIENTS), "-T", str(seconds), "-f", str(script), dsn,
    ]  # fmt: skip
    return pgbench.report(await anyio.run_process(argv, check=False))
