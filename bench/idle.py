"""idle: statements per minute that one replica sends when there is no work at all.

Counted by the server, not by the client: pg_stat_statements is loaded (shared_preload_libraries)
and its calls are summed per database. The reactor replica and the article's sweep run side by
side, each in a database of its own, over the same window, after one reset of the counters.
The pool's connection checks (an empty query per checkout, which pg_stat_statements does not
see) are counted from the pool's own statistics and shown separately.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import psycopg

from bench import baseline
from bench.common import (
    Conn,
    Context,
    Result,
    Server,
    Table,
    conditions,
    connect,
    dbname,
    open_server,
    ratio,
    safe_div,
    scalar,
)
from bench.workload import bench_settings, replicas, wait_for_first_scan

TITLE = "Idle cost: statements per minute from one replica with no work"
GOAL = "<= the article's sweep (same scan interval)"

BY_QUERY = """
SELECT s.query, sum(s.calls)::bigint
  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
 WHERE d.datname = %s
 GROUP BY s.query ORDER BY 2 DESC
"""


async def run(ctx: Context) -> Result:
    """Run one replica and one sweeper with nothing to do; count what reaches the server."""
    quick = ctx.quick
    interval = 2.0 if quick else 30.0
    window = 6.0 if quick else 180.0
    settings: dict[str, Any] = {
        "scan_interval_s": interval,
        "baseline_tick_s": interval,
        "window_s": window,
        "replicas": 1,
        "probe_interval_s": 5.0,
    }
    async with open_server({"shared_preload_libraries": "pg_stat_statements"}) as server:
        cond = await conditions(server, quick=quick)
        if quick:
            cond["note"] = (
                f"--quick: scan interval and sweep tick shortened to {interval:g} s and the "
                f"window to {window:g} s; the reactor's 5 s probes are not shortened"
            )
        available = await _stat_statements(server)
        if available is not None:
            return _unmeasured(cond, settings, available)
        reactor_db = await server.app_database("idle_reactor", with_audit=False)
        sweep_db = await server.app_database("idle_sweep", with_audit=False)
        names = {"reactor": dbname(reactor_db), "sweep": dbname(sweep_db)}
        sweep = baseline.Sweep(sweep_db, grace=120, tick=interval, phase=0.0)
        async with (
            replicas(bench_settings(reactor_db, scan_interval=interval), 1) as running,
            anyio.create_task_group() as tg,
        ):
            await tg.start(sweep.run)
            await wait_for_first_scan(running)
            await anyio.sleep(1.0)
            pool = running[0].pool
            async with await connect(server.admin_dsn, "count") as admin:
                await admin.execute("SELECT pg_stat_statements_reset()")
                checks_before = pool.get_stats().get("requests_num", 0)
                scans_before = running[0].reactor.scans
                sweeps_before = sweep.sweeps
                started = time.monotonic()
                await anyio.sleep(window)
                elapsed = time.monotonic() - started
                counts = {who: await _by_query(admin, name) for who, name in names.items()}
            checks = pool.get_stats().get("requests_num", 0) - checks_before
            scans = running[0].reactor.scans - scans_before
            sweeps = sweep.sweeps - sweeps_before
            tg.cancel_scope.cancel()

    minutes = elapsed / 60
    reactor_total = sum(counts["reactor"].values()) / minutes
    sweep_total = sum(counts["sweep"].values()) / minutes
    share = safe_div(reactor_total, sweep_total)
    met = reactor_total <= sweep_total
    table = Table(
        [
            "sender",
            "statements/min",
            "pool checks/min (not in the count)",
            "scans or sweeps/min",
            "vs sweep",
        ]
    )
    table.add(
        "reactor replica",
        f"{reactor_total:.1f}",
        f"{checks / minutes:.1f}",
        f"{scans / minutes:.1f}",
        ratio(share),
    )
    table.add("article sweep", f"{sweep_total:.1f}", "-", f"{sweeps / minutes:.1f}", ratio(1.0))
    top = sorted(counts["reactor"].items(), key=lambda item: -item[1])
    notes = [
        "The reactor's statements over the window, per minute: "
        + "; ".join(f"{calls / minutes:.1f} x `{_short(query)}`" for query, calls in top[:8])
        + ".",
        "The sweep's: "
        + "; ".join(
            f"{calls / minutes:.1f} x `{_short(query)}`"
            for query, calls in sorted(counts["sweep"].items(), key=lambda i: -i[1])
        )
        + ".",
    ]
    if not met:
        notes.append(
            "Above the sweep: the replica proves its LISTEN connection every probe interval "
            "(SELECT 1 on it, plus a probe NOTIFY through the pool that must come back) and the "
            "watch loop runs its health query at the same rate; each pool checkout also sends "
            "an empty query. What would close it: let any notification received count as the "
            "liveness proof (probe only after a silent interval), fold the health query into "
            "the probe's round trip, and check pool connections only after they sat idle "
            "(psycopg_pool's check=None plus max_idle) rather than on every checkout."
        )
    headline = (
        f"reactor {reactor_total:.1f} statements/min (+{checks / minutes:.1f} pool checks) vs "
        f"the sweep's {sweep_total:.1f}: {ratio(share)}"
    )
    return Result(
        name="idle",
        title=TITLE,
        goal=GOAL,
        met=met,
        headline=headline,
        table=table,
        figures={
            "minutes": minutes,
            "reactor_per_min": reactor_total,
            "sweep_per_min": sweep_total,
            "pool_checks_per_min": checks / minutes,
            "by_query": {
                who: {q: c / minutes for q, c in found.items()} for who, found in counts.items()
            },
        },
        settings=settings,
        conditions=cond,
        notes=notes,
    )


async def _stat_statements(server: Server) -> str | None:
    """None when pg_stat_statements works here; else why not."""
    try:
        async with await connect(server.admin_dsn, "count") as conn:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            await scalar(conn, "SELECT count(*) FROM pg_stat_statements")
    except psycopg.Error as error:
        return f"pg_stat_statements is not available on this server: {error}".splitlines()[0]
    return None


async def _by_query(conn: Conn, name: str) -> dict[str, int]:
    cur = await conn.execute(BY_QUERY, (name,))
    return {query: int(calls) for query, calls in await cur.fetchall()}


def _short(query: str) -> str:
    text = " ".join(query.split())
    return text if len(text) <= 60 else text[:57] + "..."


def _unmeasured(cond: dict[str, Any], settings: dict[str, Any], why: str) -> Result:
    return Result(
        name="idle",
        title=TITLE,
        goal=GOAL,
        met=None,
        headline=why,
        table=Table(["sender", "statements/min"], [["reactor replica", "-"], ["sweep", "-"]]),
        figures={},
        settings=settings,
        conditions=cond,
        notes=[why + "; run without DATABASE_URL to use the embedded server, which loads it."],
    )
