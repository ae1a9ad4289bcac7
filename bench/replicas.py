"""replicas: what adding replicas costs the database, and how fast a killed owner's jobs move.

For 1, 2, 3 and 5 in-process replicas in turn, the worker finishes jobs at 100/s while tabs save
70% of them inside the grace window. pg_stat_statements counts what reached the server: the
record statements (timer claims and scans, both write runs) per finished job, and the database
time of everything the replicas sent per 1,000 finished jobs.

Then three replicas run as real processes, and one is killed with SIGKILL while the worker keeps
going: the lateness of the jobs that fell due while it was dead shows the takeover delay.

The job trigger is installed with ``reactor migrate --spread``, as a fleet's should be.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from bench.conn import connect, dbname, scalar
from bench.result import Context, Result, Table, conditions
from bench.server import open_server
from bench.stats import ms, ratio, safe_div
from bench.workload import (
    APP_STATEMENTS,
    bench_settings,
    insert_jobs,
    is_record_statement,
    play,
    replicas,
    wait_for_first_scan,
    wait_until_recorded,
)
from reactor.install import REFERENCE_INSTALL
from reactor.testing import LIVENESS_PROBES, Settings, audit

TITLE = "Replicas: record statements and database time per job, and a killed owner's takeover"
GOAL = (
    "<= 1.00 record statements per finished job at every replica count; all replicas' database "
    "time per 1,000 jobs at 5 replicas within 1.2x of 1; a killed owner's jobs late by at most "
    "the takeover delay + 1 s"
)

RATE = 100.0
SAVE_RATIO = 0.7
GRACE_S = 2.0
COUNTS = (1, 2, 3, 5)

# Statements of the app (worker and tabs) and of this harness, left out of the replicas' time.
_NOT_REPLICAS = (*APP_STATEMENTS, "pg_stat", "SELECT pg_stat")

ROOT = Path(__file__).resolve().parent.parent

BY_QUERY = """
SELECT s.query, sum(s.calls)::bigint, sum(s.total_exec_time)::float8
  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
 WHERE d.datname = %s
 GROUP BY s.query
"""


async def run(ctx: Context) -> Result:
    """Each replica count on a fresh database, then the kill."""
    jobs = 100 if ctx.quick else 3000
    # Quick: two counts and 1 s probes, only to show the benchmark runs.
    counts = (1, 3) if ctx.quick else COUNTS
    probe = 1.0 if ctx.quick else Settings.probe_interval
    settings: dict[str, Any] = {
        "replica_counts": list(counts),
        "jobs_per_count": jobs,
        "worker_jobs_per_s": RATE,
        "tab_save_ratio": SAVE_RATIO,
        "grace_s": GRACE_S,
        "probe_interval_s": probe,
    }
    measured: list[dict[str, Any]] = []
    async with open_server({"shared_preload_libraries": "pg_stat_statements"}) as server:
        cond = await conditions(server, quick=ctx.quick)
        async with await connect(server.admin_dsn, "setup") as admin:
            await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        for count in counts:
            dsn = await server.app_database(f"replicas{count}", with_audit=False, spread=True)
            measured.append(await _measure(server.admin_dsn, dsn, count, jobs, probe))
        kill_dsn = await server.app_database("replicas_kill", with_audit=True, spread=True)
        kill = await _kill(kill_dsn, 8 if ctx.quick else 60, probe)

    per_job = {m["replicas"]: m["record_statements_per_job"] for m in measured}
    db_ms = {m["replicas"]: m["db_ms_per_1000_jobs"] for m in measured}
    growth = safe_div(db_ms[counts[-1]], db_ms[counts[0]])
    takeover = (LIVENESS_PROBES + 1) * probe
    met = (
        all(v <= 1.0 for v in per_job.values())
        and growth <= 1.2
        and kill["victims_max_lateness_s"] <= takeover + 1.0
    )
    table = Table(
        [
            "replicas",
            "record statements per job",
            "of which scans",
            "DB time per 1,000 jobs",
            "vs 1 replica",
            "deadlines left to their owner",
        ]
    )
    for m in measured:
        table.add(
            m["replicas"],
            f"{m['record_statements_per_job']:.3f}",
            m["scans"],
            ms(m["db_ms_per_1000_jobs"] / 1000),
            ratio(safe_div(m["db_ms_per_1000_jobs"], db_ms[counts[0]])),
            m["left_to_owner"],
        )
    notes = _notes(jobs, kill, takeover)
    headline = (
        "record statements per job "
        + ", ".join(f"{per_job[n]:.3f} at {n}" for n in counts)
        + f"; DB time per 1,000 jobs {ratio(growth)} at {counts[-1]} vs 1; a killed owner's "
        f"jobs at most {kill['victims_max_lateness_s']:.1f} s late (takeover delay {takeover:g} s)"
    )
    return Result(
        met=met,
        headline=headline,
        table=table,
        figures={"counts": measured, "kill": kill, "db_growth": growth, "takeover_s": takeover},
        settings=settings,
        conditions=cond,
        notes=notes,
    )


def _notes(jobs: int, kill: dict[str, Any], takeover: float) -> list[str]:
    """The load, what is counted, and the kill."""
    return [
        f"{jobs:,} jobs per replica count, finished at {RATE:.0f}/s, tabs saving "
        f"{SAVE_RATIO:.0%} inside the {GRACE_S:g} s grace; replicas in this process with the "
        "default probe interval, started and seeing each other before the worker begins.",
        "Record statements are the claim-and-write statements (timer and scan) as "
        "pg_stat_statements counts them; database time is the total execution time of every "
        "statement the replicas sent (health checks, hooks, reconcile steps included), "
        "measured by the server.",
        f"Kill -9: 3 `reactor run` processes, the worker at {RATE:.0f}/s for "
        f"{kill['seconds']:g} s, one process killed a third of the way in. "
        f"{kill['victim_jobs']} jobs fell due while it was dead and before the others saw it "
        f"gone; the latest was recorded {kill['victims_max_lateness_s']:.2f} s after its "
        f"deadline, against a takeover delay of {takeover:g} s (a heartbeat "
        f"{LIVENESS_PROBES} probe intervals old, seen at the next check). Verdict: "
        f"{kill['verdict']}.",
    ]


async def _measure(admin_dsn: str, dsn: str, count: int, jobs: int, probe: float) -> dict[str, Any]:
    async with await connect(dsn, "setup") as conn:
        ids = await insert_jobs(conn, jobs, doc_bytes=2000)
    settings = bench_settings(dsn, grace=GRACE_S, probe_interval=probe, probe_timeout=probe)
    async with replicas(settings, count) as running:
        await wait_for_first_scan(running)
        with anyio.fail_after(30):
            while any(len(r.reactor.membership.live) != count for r in running):  # noqa: ASYNC110
                await anyio.sleep(0.1)
        scans_before = sum(r.reactor.scans for r in running)
        async with await connect(admin_dsn, "count") as admin:
            await admin.execute("SELECT pg_stat_statements_reset()")
            await play(dsn, ids, rate=RATE, save_ratio=SAVE_RATIO, tab_delay=(0.1, GRACE_S * 0.8))
            async with await connect(dsn, "check") as conn:
                missing = await wait_until_recorded(conn, within=60)
            rows = await (await admin.execute(BY_QUERY, (dbname(dsn),))).fetchall()
        scans = sum(r.reactor.scans for r in running) - scans_before
        left = sum(
            r.reactor.metrics.registry.get_sample_value("reactor_deadlines_left_to_owner_total")
            or 0
            for r in running
        )
    records = sum(calls for query, calls, _ in rows if is_record_statement(query))
    replica_ms = sum(t for query, _, t in rows if not query.lstrip().startswith(_NOT_REPLICAS))
    return {
        "replicas": count,
        "jobs": jobs,
        "unrecorded_after": missing,
        "record_statements": records,
        "record_statements_per_job": records / jobs,
        "scans": scans,
        "db_ms": replica_ms,
        "db_ms_per_1000_jobs": replica_ms / jobs * 1000,
        "left_to_owner": int(left),
    }


async def _kill(dsn: str, seconds: float, probe: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTOR_")}
    env.update(
        {
            "DATABASE_URL": dsn,
            "REACTOR_GRACE_SECONDS": str(GRACE_S),
            "REACTOR_HTTP_ADDR": "",
            "REACTOR_DASHBOARD_ADDR": "",
            "REACTOR_LOG_FORMAT": "json",
            "REACTOR_LOG_LEVEL": "WARNING",
            "REACTOR_PROBE_INTERVAL_SECONDS": str(probe),
            "REACTOR_PROBE_TIMEOUT_SECONDS": str(probe),
        }
    )
    procs = [
        await anyio.open_process(
            [sys.executable, "-m", "reactor", "run"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(3)
    ]
    try:
        async with await connect(dsn, "setup") as conn:
            await audit.install(conn, REFERENCE_INSTALL.mapping)
            ids = await insert_jobs(conn, int(seconds * RATE), doc_bytes=2000)
            with anyio.fail_after(60):
                while int(await scalar(conn, "SELECT count(*) FROM reactor.replicas")) < 3:  # noqa: ASYNC110
                    await anyio.sleep(0.2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: play(dsn, ids, rate=RATE, save_ratio=SAVE_RATIO, tab_delay=(0.1, 1.6))
            )
            await anyio.sleep(seconds / 3)
            killed_at = time.time()
            procs[0].send_signal(signal.SIGKILL)
        async with await connect(dsn, "check") as conn:
            missing = await wait_until_recorded(conn, within=60)
            verdict = await audit.verdict(conn, REFERENCE_INSTALL.mapping, GRACE_S)
            # The jobs that fell due after the kill and were recorded late: the victim's share.
            late = await (
                await conn.execute(
                    "SELECT extract(epoch FROM a.at - j.updated_at)::float8 - %s "
                    "FROM run_audit a JOIN analysis_jobs j ON j.id = a.job_id "
                    "WHERE a.saved_by = 'worker' AND j.updated_at + make_interval(secs => %s) "
                    "> to_timestamp(%s)",
                    (GRACE_S, GRACE_S, killed_at),
                )
            ).fetchall()
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        with anyio.move_on_after(30, shield=True):
            for proc in procs:
                await proc.wait()
    lateness = sorted(x for (x,) in late)
    slow = [x for x in lateness if x > 0.5]
    return {
        "seconds": seconds,
        "unrecorded_after": missing,
        "victim_jobs": len(slow),
        "victims_max_lateness_s": lateness[-1] if lateness else 0.0,
        "verdict": "clean" if verdict.clean else str(verdict.as_dict()),
    }
