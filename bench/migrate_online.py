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

from bench.common import (
    Conn,
    Context,
    Result,
    Table,
    conditions,
    connect,
    ms,
    open_server,
    scalar,
)
from bench.history import load_history
from bench.workload import FINISH, RESULTS, TAB_SAVE
from reactor import db, sql
from reactor.config import Settings

TITLE = "reactor migrate on a big live database"
GOAL = "the worker's longest commit stall during the migration <= 1 s, nothing left unqueued"

RATE = 100.0  # jobs finished per second
SAVE_RATIO = 0.7
AROUND = 3.0  # seconds of traffic before and after the migration

UNQUEUED = """
SELECT count(*) FROM analysis_jobs j
 WHERE j.status IN ('complete', 'failed') AND j.results <> '{}'::jsonb
   AND j.doc_html IS NOT NULL AND j.deleted_at IS NULL
   AND NOT EXISTS (SELECT 1 FROM analysis_runs r WHERE r.id = j.run_id)
   AND NOT EXISTS (SELECT 1 FROM reactor.pending p WHERE p.job_id = j.id)
"""


async def run(ctx: Context) -> Result:
    """Load the app's history, then migrate under the worker's traffic."""
    total = 60_000 if ctx.quick else 10_000_000
    window = 8_400 if ctx.quick else 1_400_000
    settings: dict[str, Any] = {
        "finished_jobs": total,
        "window": window,
        "worker_jobs_per_s": RATE,
        "tab_save_ratio": SAVE_RATIO,
        "traffic_before_and_after_s": AROUND,
    }
    async with open_server() as server:
        cond = await conditions(server, quick=ctx.quick)
        dsn = server.dsn_for(await server.create_database("migrate"))
        async with await connect(dsn, "setup") as conn:
            load_s = await _load(conn, total, window)
        stalls: list[tuple[float, float]] = []  # (when, seconds) of every app statement
        window_s: list[float] = []
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_worker, dsn, stalls, stop)
            await anyio.sleep(AROUND)
            async with await db.connect(dsn, "migrate") as conn:
                started = time.monotonic()
                await db.migrate(conn, Settings.channel, reference_schema=False)
                window_s = [started, time.monotonic()]
            await anyio.sleep(AROUND)
            stop.set()
        async with await connect(dsn, "check") as conn:
            unqueued = int(await scalar(conn, UNQUEUED))
            pending = int(await scalar(conn, "SELECT count(*) FROM reactor.pending"))

    begin, end = window_s
    during = [s for at, s in stalls if begin <= at <= end]
    before = [s for at, s in stalls if at < begin]
    longest = max(during, default=0.0)
    met = longest <= 1.0 and unqueued == 0
    table = Table(["measure", "value"])
    table.add("migrate wall time", f"{end - begin:.1f} s")
    table.add("worker statements during it", len(during))
    table.add("longest app statement during it", ms(longest))
    table.add("p99 app statement during it", ms(_p99(during)))
    table.add("longest app statement before it", ms(max(before, default=0.0)))
    table.add("jobs needing a run left unqueued", unqueued)
    table.add("jobs queued by the install", pending)
    notes = [
        f"{total:,} finished jobs of which {window:,} still hold doc_html, all with a run but a "
        f"few that finish during the test; the reactor is not installed. Loading took "
        f"{load_s:.0f} s.",
        f"The worker finishes {RATE:.0f} jobs/s (an insert as running, then an update to "
        f"complete, each its own commit) and a tab saves {SAVE_RATIO:.0%} of them at once; "
        "every statement is timed from the client.",
        "migrate applies each migration in its own transaction that waits at most 1 s for a "
        "lock, builds the walk index CONCURRENTLY, and ends with a reconcile pass in chunks.",
    ]
    headline = (
        f"migrate took {end - begin:.1f} s on {total:,} jobs; the worker's longest statement "
        f"meanwhile {ms(longest)}; {unqueued} job(s) left unqueued"
    )
    return Result(
        name="migrate_online",
        title=TITLE,
        goal=GOAL,
        met=met,
        headline=headline,
        table=table,
        figures={
            "migrate_s": end - begin,
            "longest_stall_s": longest,
            "p99_stall_s": _p99(during),
            "longest_before_s": max(before, default=0.0),
            "statements_during": len(during),
            "unqueued": unqueued,
            "queued_by_install": pending,
            "load_s": load_s,
        },
        settings=settings,
        conditions=cond,
        notes=notes,
    )


def _p99(values: list[float]) -> float:
    if len(values) < 2:
        return max(values, default=0.0)
    return statistics.quantiles(values, n=100, method="inclusive")[98]


async def _load(conn: Conn, total: int, window: int) -> float:
    started = time.monotonic()
    await conn.execute(sql.read("reference.sql"))
    await load_history(conn, total, window)
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
            job = str(uuid.uuid4())
            await timed(
                "INSERT INTO analysis_jobs (id, run_id, status, doc_html) "
                "VALUES (%(id)s, gen_random_uuid(), 'running', '<p>live</p>')",
                {"id": job},
            )
            await timed(FINISH, {"id": job, "results": RESULTS})
            if rng.random() < SAVE_RATIO:
                await timed(TAB_SAVE, {"id": job})
            next_at += 1 / RATE
            await anyio.sleep(max(0.0, next_at - time.monotonic()))
