"""outage: how soon after the database is back a pooled call that waited through the outage
gets its answer.

Records, scans and probes all go through the pool. When the server goes away, the pool finds
its connections broken and reconnects in the background; a call waiting meanwhile is served by
the first attempt that succeeds once the server is back. psycopg_pool spaces the attempts of
each lost connection 1, 2, 4, 8 s... apart for as long as its ``reconnect_timeout`` allows, so
the wait after the server is back grew with the outage. The reactor's pool ends each series
after a few seconds and starts the next at once while calls wait.

Each round stops the embedded server, puts one call into each pool while it is down, sleeps
the downtime, starts the server, and times each call from the start's return to its answer.
Both pools wait through the same outage, so a round compares them like for like.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
from psycopg_pool import AsyncConnectionPool

from bench.result import Context, Result, Table, conditions, not_ours_to_stop
from bench.server import open_server
from bench.stats import ms, summarize
from reactor import db
from reactor.demo import EmbeddedPostgres

TITLE = "How soon a pooled call that waited through an outage is answered"
GOAL = "within 1.5 s of the server being back, at every downtime (the old pool: 1, 2, 4, 8 s...)"

VARIANTS = ("before (psycopg_pool's backoff)", "now")
GOAL_SECONDS = 1.5


def _backoff_pool(dsn: str) -> AsyncConnectionPool[db.AnyConnection]:
    # The reactor's pool as it was: psycopg_pool's backoff left to run for a day. Its calls
    # wait longer than the reactor's 15 s, so that the longest outage is measured, not refused.
    pool = db.make_pool(dsn, max_size=2)
    pool.reconnect_timeout = 86400
    pool.timeout = 60.0
    return pool


async def run(ctx: Context) -> Result:
    """Time both pools through outages of each length, round after round."""
    downtimes = (2.0, 5.0) if ctx.quick else (2.0, 5.0, 10.0)
    rounds = 1 if ctx.quick else 3
    settings: dict[str, Any] = {"downtimes_s": downtimes, "rounds": rounds}
    waits: dict[float, dict[str, list[float]]] = {d: {v: [] for v in VARIANTS} for d in downtimes}
    async with open_server() as server:
        cond = await conditions(server, quick=ctx.quick)
        embedded = server.embedded
        if embedded is None:
            table = Table(["downtime", *VARIANTS])
            return not_ours_to_stop(table, settings=settings, conditions=cond)
        dsn = await server.app_database("outage", with_audit=False)
        # Every failed attempt is a warning of psycopg_pool's; the figures are what matters.
        pool_log = logging.getLogger("psycopg.pool")
        level = pool_log.level
        pool_log.setLevel(logging.ERROR)
        pools = {VARIANTS[0]: _backoff_pool(dsn), VARIANTS[1]: db.make_pool(dsn, max_size=2)}
        for pool in pools.values():
            await pool.open(wait=True)
        try:
            for _ in range(rounds):
                for downtime in downtimes:
                    answered = await _outage(embedded, pools, downtime)
                    for variant, seconds in answered.items():
                        waits[downtime][variant].append(seconds)
        finally:
            for pool in pools.values():
                await pool.close()
            pool_log.setLevel(level)

    table = Table(["downtime", *(f"{v}: mean / max" for v in VARIANTS)])
    figures: dict[str, Any] = {}
    for downtime, by_variant in waits.items():
        stats = {v: summarize(by_variant[v]) for v in VARIANTS}
        figures[f"{downtime:g}s"] = stats
        table.add(f"{downtime:g} s", *(f"{ms(s['mean'])} / {ms(s['max'])}" for s in stats.values()))
    worst_now = max(max(by_variant[VARIANTS[1]]) for by_variant in waits.values())
    worst_before = max(max(by_variant[VARIANTS[0]]) for by_variant in waits.values())
    return Result(
        met=worst_now <= GOAL_SECONDS,
        headline=f"answered at most {worst_now:.2f} s after the server was back (before: "
        f"{worst_before:.2f} s)",
        table=table,
        figures=figures,
        settings=settings,
        conditions=cond,
        notes=[
            "Each cell is the time from the server's start returning (it accepts connections "
            "then) to the waiting call's answer: a `SELECT 1` on a connection the pool made "
            "after the outage.",
            "Downtime is counted from the stop's return to the start's call; the call enters "
            "each pool right after the stop, so the pool's first attempt fails at once.",
        ],
    )


async def _outage(
    embedded: EmbeddedPostgres,
    pools: dict[str, AsyncConnectionPool[db.AnyConnection]],
    downtime: float,
) -> dict[str, float]:
    await anyio.to_thread.run_sync(embedded.stop)
    answered: dict[str, float] = {}
    started = 0.0

    async def call(variant: str, pool: AsyncConnectionPool[db.AnyConnection]) -> None:
        async with pool.connection() as conn:
            await conn.execute("SELECT 1")
        answered[variant] = time.monotonic() - started

    async with anyio.create_task_group() as tg:
        for variant, pool in pools.items():
            tg.start_soon(call, variant, pool)
        await anyio.sleep(downtime)
        await anyio.to_thread.run_sync(embedded.start)
        started = time.monotonic()
    return answered
