"""migrate_online: installing the reactor into a big live database while the app writes.

An app with many finished jobs (scan_scale's data, without the reactor) keeps its worker
finishing jobs at a steady rate, each in two commits as a real worker does, while tabs save most
runs. ``reactor migrate`` then installs everything: the tables, the triggers, the partial index
(built CONCURRENTLY) and the reconcile pass that queues what history owes. Every one of the
app's statements is timed; the figure is the longest one during the migration.
"""

from __future__ import annotations

import random
import statistics
import time
import uuid
from typing import Any

import anyio

from bench.conn import Conn, connect, dbname, scalar
from bench.history import load_history
from bench.result import Context, Result, Table, conditions
from bench.server import Server, open_server
from bench.stats import ms
from bench.workload import APP, RESULTS
from reactor import db
from reactor.install import sql
from reactor.testing import REFERENCE

TITLE = "reactor migrate on a big live database"
GOAL = (
    "the worker's longest commit stall during the migration <= 1 s, nothing left unqueued, on "
    "a plain job table and on one in 12 partitions"
)

RATE = 100.0  # jobs finished per second
SAVE_RATIO = 0.7
AROUND_S = 3.0  # seconds of traffic before and after the migration
PARTITIONS = 12

UNQUEUED = """
SELECT count(*) FROM analysis_jobs j
 WHERE j.status IN ('complete', 'failed') AND j.results <> '{}'::jsonb
   AND j.doc_html IS NOT NULL AND j.deleted_at IS NULL
   AND NOT EXISTS (SELECT 1 FROM analysis_runs r WHERE r.id = j.run_id)
   AND NOT EXISTS (SELECT 1 FROM reactor.pending p WHERE p.job_id = j.id)
"""

# reference.sql's analysis_jobs (run first) made partitioned by month of created_at: one
# partition for each of the last 12 months, this one included; the oldest also takes anything
# before it, the newest anything after. Its primary key must include the partition key.
PARTITIONED_JOBS = f"""
ALTER TABLE analysis_jobs RENAME TO analysis_jobs_plain;
ALTER TABLE analysis_jobs_plain RENAME CONSTRAINT analysis_jobs_pkey TO analysis_jobs_plain_pkey;
CREATE TABLE analysis_jobs (LIKE analysis_jobs_plain INCLUDING DEFAULTS,
                            PRIMARY KEY (id, created_at))
    PARTITION BY RANGE (created_at);
DROP TABLE analysis_jobs_plain;
DO $$
DECLARE
    this_month timestamptz := date_trunc('month', now());
    n int := {PARTITIONS};
BEGIN
    FOR i IN 0 .. n - 1 LOOP
        EXECUTE format(
            'CREATE TABLE analysis_jobs_m%s PARTITION OF analysis_jobs '
            'FOR VALUES FROM (%s) TO (%s)',
            lpad(i::text, 2, '0'),
            CASE WHEN i = 0 THEN 'MINVALUE'
                 ELSE quote_literal(this_month - (n - 1 - i) * interval '1 month') END,
            CASE WHEN i = n - 1 THEN 'MAXVALUE'
                 ELSE quote_literal(this_month - (n - 2 - i) * interval '1 month') END);
    END LOOP;
END $$;
"""

# Seconds from the oldest partition's first day to the newest job (two hours ago), over which
# the partitioned case spreads its history.
HISTORY_SPAN = f"""
SELECT extract(epoch FROM now() - interval '2 hours'
                          - (date_trunc('month', now()) - interval '{PARTITIONS - 1} months'))
"""

CASES = {"plain": "plain table", "partitioned": f"{PARTITIONS} partitions"}


async def run(ctx: Context) -> Result:
    """Load the app's history, then migrate under the worker's traffic; once on a plain job
    table, once on a partitioned one."""
    total = 60_000 if ctx.quick else 10_000_000
    window = 8_400 if ctx.quick else 1_400_000
    settings: dict[str, Any] = {
        "finished_jobs": total,
        "window": window,
        "worker_jobs_per_s": RATE,
        "tab_save_ratio": SAVE_RATIO,
        "traffic_before_and_after_s": 1.0 if ctx.quick else AROUND_S,
        "partitions": PARTITIONS,
    }
    async with open_server() as server:
        cond = await conditions(server, quick=ctx.quick)
        around = 1.0 if ctx.quick else AROUND_S
        found = {case: await _case(server, case, total, window, around) for case in CASES}

    met = all(f["longest_stall_s"] <= 1.0 and f["unqueued"] == 0 for f in found.values())
    table = Table(["measure", *(f"{label}" for label in CASES.values())])
    for label, key, shown in (
        ("migrate wall time", "migrate_s", lambda v: f"{v:.1f} s"),
        ("worker statements during it", "statements_during", str),
        ("longest app statement during it", "longest_stall_s", ms),
        ("p99 app statement during it", "p99_stall_s", ms),
        ("longest app statement before it", "longest_before_s", ms),
        ("jobs needing a run left unqueued", "unqueued", str),
        ("jobs queued by the install", "queued_by_install", str),
        ("loading the history", "load_s", lambda v: f"{v:.0f} s"),
    ):
        table.add(label, *(shown(found[case][key]) for case in CASES))
    plain, parts = found["plain"], found["partitioned"]
    notes = [
        f"{total:,} finished jobs of which {window:,} still hold doc_html, all with a run but a "
        "few that finish during the test; the reactor is not installed.",
        f"The partitioned job table: reference.sql's analysis_jobs range-partitioned by month "
        f"of created_at into {PARTITIONS} partitions (the last {PARTITIONS} months, this one "
        "included), primary key (id, created_at); the history is spread over those months "
        "(this month holds only its first days, like a real one), analysis_runs stays plain. "
        "Rows per partition: "
        + ", ".join(f"{n:,}" for n in parts["partition_rows"])
        + ". The worker's statements name jobs by id alone, as the app's do, so each looks into "
        "every partition's key index.",
        f"The worker finishes {RATE:.0f} jobs/s (an insert as running, then an update to "
        f"complete, each its own commit) and a tab saves {SAVE_RATIO:.0%} of them at once; "
        "every statement is timed from the client.",
        "migrate applies each migration in its own transaction that waits at most 1 s for a "
        "lock, builds the walk index CONCURRENTLY (on the partitioned table: ON ONLY the "
        "parent, then CONCURRENTLY on each partition and ATTACHed), and ends with a reconcile "
        "pass in chunks.",
    ]
    headline = (
        f"migrate took {plain['migrate_s']:.1f} s on {total:,} jobs; the worker's longest "
        f"statement meanwhile {ms(plain['longest_stall_s'])}; {plain['unqueued']} job(s) left "
        f"unqueued. In {PARTITIONS} partitions: {parts['migrate_s']:.1f} s, longest "
        f"{ms(parts['longest_stall_s'])}, {parts['unqueued']} left unqueued"
    )
    return Result(
        met=met,
        headline=headline,
        table=table,
        figures={**plain, "partitioned": parts},
        settings=settings,
        conditions=cond,
        notes=notes,
    )


async def _case(
    server: Server, case: str, total: int, window: int, around: float
) -> dict[str, Any]:
    """One database of history, migrated while the worker writes; its figures."""
    dsn = server.dsn_for(await server.create_database(f"migrate_{case}"))
    async with await connect(dsn, "setup") as conn:
        load_s = await _load(conn, total, window, partitioned=case == "partitioned")
    stalls: list[tuple[float, float]] = []  # (when, seconds) of every app statement
    window_s: list[float] = []
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_worker, dsn, stalls, stop)
        await anyio.sleep(around)
        async with await db.connect(dsn, "migrate") as conn:
            started = time.monotonic()
            await db.migrate(conn, REFERENCE, reference_schema=False)
            window_s = [started, time.monotonic()]
        await anyio.sleep(around)
        stop.set()
    async with await connect(dsn, "check") as conn:
        unqueued = int(await scalar(conn, UNQUEUED))
        pending = int(await scalar(conn, "SELECT count(*) FROM reactor.pending"))
        cur = await conn.execute(
            "SELECT count(*) FROM analysis_jobs GROUP BY tableoid ORDER BY tableoid::regclass::text"
        )
        partition_rows = [int(row[0]) for row in await cur.fetchall()]
    await server.drop_database(dbname(dsn))
    begin, end = window_s
    during = [s for at, s in stalls if begin <= at <= end]
    before = [s for at, s in stalls if at < begin]
    return {
        "migrate_s": end - begin,
        "longest_stall_s": max(during, default=0.0),
        "p99_stall_s": _p99(during),
        "longest_before_s": max(before, default=0.0),
        "statements_during": len(during),
        "unqueued": unqueued,
        "queued_by_install": pending,
        "load_s": load_s,
        "partition_rows": partition_rows,
    }


def _p99(values: list[float]) -> float:
    if len(values) < 2:
        return max(values, default=0.0)
    return statistics.quantiles(values, n=100, method="inclusive")[98]


async def _load(conn: Conn, total: int, window: int, *, partitioned: bool) -> float:
    started = time.monotonic()
    await conn.execute(sql.read("reference.sql"))
    if not partitioned:
        await load_history(conn, total, window)
    else:
        await conn.execute(PARTITIONED_JOBS)
        span = float(await scalar(conn, HISTORY_SPAN))
        await load_history(conn, total, window, spacing=span / total, job_key="id, created_at")
    await conn.execute("VACUUM (FREEZE, ANALYZE) analysis_jobs")
    await conn.execute("VACUUM (FREEZE, ANALYZE) analysis_runs")
    return time.monotonic() - started


async def _worker(dsn: str, stalls: list[tuple[float, float]], stop: anyio.Event) -> None:
    """Finish RATE jobs a second until stopped; time every statement."""
    rng = random.Random(7)
    async with await connect(dsn, "worker") as conn:

        async def timed(query: str, params: dict[str, Any]) -> None:
            started = time.monotonic()
            await conn.execute(query, params)
            stalls.append((started, time.monotonic() - started))

        next_at = time.monotonic()
        while not stop.is_set():
            job = uuid.uuid4()
            await timed(*APP.create(jobs=[job], document="<p>live</p>"))
            await timed(*APP.finish(job, verdicts=RESULTS))
            if rng.random() < SAVE_RATIO:
                await timed(*APP.tab_save(job))
            next_at += 1 / RATE
            await anyio.sleep(max(0.0, next_at - time.monotonic()))
