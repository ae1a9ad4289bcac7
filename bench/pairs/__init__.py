"""pairs: many job/artifact pairs served by one process, against a fleet per pair.

Three pairs live in each of two databases: the reference tables (pair a, reactor schema
``reactor``) and two copies of them (pairs b and c, schemas ``reactor_b`` and ``reactor_c``),
each with its own job trigger channel. In one database one replica serves all three from one
process (``open_replica``: one pool, a Reactor per pair); in the other, a fleet per pair: three
replicas of one pair, each with its own pool, which is what three processes cost the database.

Idle: both run side by side with no work. After each pair's first scan and a warm-up, the
pg_stat_statements counters are reset and, over one window, each database's statements are
counted by the server, the pools' connection checks (an empty query pg_stat_statements does not
see) at the pools, and at the end of the window the client connections open to each database.

Load: then, in the one-process database, a load generator in a child process (its own event
loop, as the app's) finishes pre-inserted running jobs at the same rate on every pair, and the
lateness of each run, its write time by the audit trigger minus ``updated_at + grace`` (both by
the database clock), is read per pair. Last, pair c's runs table is dropped, so every record
statement of c's fails, and the same load runs again on all three pairs (c's finished jobs keep
its reactor failing and retrying throughout): pairs a and b must record everything, as late as
before.

``python -m bench.pairs`` is the load generator: it reads a JSON spec on stdin.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from functools import partial
from typing import Any

import anyio

from bench.conn import connect
from bench.idle import counting_pool_checks
from bench.pairs.idle import Idle, count_idle
from bench.pairs.load import Phase, load_phase
from bench.pairs.plan import (
    BROKEN,
    DOC_BYTES,
    PAIRS,
)
from bench.pairs.reactors import pair_database, record_errors, running, wait_for_first_scans
from bench.pairs.report import result_of
from bench.result import Context, Result, Table, conditions, unmeasured
from bench.server import Server, open_counting_server
from bench.workload import bench_settings
from reactor.testing import (
    Pair,
    Reactor,
    Settings,
    open_replica,
)

TITLE = "Many job/artifact pairs, one sidecar: connections, idle cost and lateness per pair"
GOAL = (
    "3 pairs in one process: connections <= one pair's + 1; <= 14 idle statements/min; "
    "lateness p99 <= 10 ms per pair at 100 jobs/s each; a broken pair leaves the others' "
    "lateness unchanged"
)


async def run(ctx: Context) -> Result:
    """Idle cost of one process against a fleet per pair, then lateness per pair under load,
    healthy and with one pair broken."""
    quick = ctx.quick
    defaults = Settings()
    grace = 0.5 if quick else 1.0
    rate = 20.0 if quick else 100.0
    load_s = 3.0 if quick else 30.0
    window = 6.0 if quick else 120.0
    warm = 1.0 if quick else 2 * defaults.probe_interval
    settings: dict[str, Any] = {
        "pairs": len(PAIRS),
        "idle_window_s": window,
        "warm_up_s": warm,
        "probe_interval_s": defaults.probe_interval,
        "scan_interval_s": defaults.scan_interval,
        "reconcile_interval_s": defaults.reconcile_interval,
        "grace_s": grace,
        "rate_per_pair_per_s": rate,
        "load_s": load_s,
        "jobs_per_pair_per_phase": int(rate * load_s),
        "doc_bytes": DOC_BYTES,
        "broken_pair": BROKEN,
    }
    shortened = (
        f"--quick: idle window {window:g} s, {rate:g} jobs/s per pair for {load_s:g} s, "
        f"grace {grace:g} s; probe and scan intervals are not shortened"
    )
    async with open_counting_server() as (server, problem):
        cond = await conditions(server, quick=quick, note=shortened if quick else None)
        if problem is not None:
            table = Table(["measure", "one process"], [["idle statements/min", "-"]])
            return unmeasured(table, settings=settings, conditions=cond, why=problem)
        idle, healthy, broken, broken_errors, broken_queued = await _measure(
            server, grace=grace, rate=rate, load_s=load_s, window=window, warm=warm
        )
    return result_of(
        settings=settings,
        cond=cond,
        idle=idle,
        healthy=healthy,
        broken=broken,
        broken_errors=broken_errors,
        broken_queued=broken_queued,
        window=window,
    )


async def _measure(
    server: Server, *, grace: float, rate: float, load_s: float, window: float, warm: float
) -> tuple[dict[str, Idle], Phase, Phase, float, int]:
    """Both setups idle side by side, then the load on the one process, healthy and with a
    pair broken: the idle costs, the two phases, the broken pair's failed records and what it
    left queued."""
    one_dsn, one_installs = await pair_database(server, "pairs_one")
    fleet_dsn, fleet_installs = await pair_database(server, "pairs_fleet")
    one_settings = bench_settings(one_dsn, grace=grace)
    fleet_settings = bench_settings(fleet_dsn, grace=grace)
    with counting_pool_checks() as checks:
        async with (
            open_replica(
                one_settings, [Pair(one_installs[p], one_settings) for p in PAIRS]
            ) as replica,
            running([replica]),
        ):
            one = dict(zip(PAIRS, replica.reactors.values(), strict=True))
            async with AsyncExitStack() as fleet_stack:
                processes = [
                    await fleet_stack.enter_async_context(
                        open_replica(fleet_settings, [Pair(fleet_installs[p], fleet_settings)])
                    )
                    for p in PAIRS
                ]
                await fleet_stack.enter_async_context(running(processes))
                fleet = {
                    p: next(iter(process.reactors.values()))
                    for p, process in zip(PAIRS, processes, strict=True)
                }
                await wait_for_first_scans([*one.values(), *fleet.values()])
                # Past the start-up statements.
                await anyio.sleep(warm)
                idle = await count_idle(
                    server,
                    {"one": one_dsn, "fleet": fleet_dsn},
                    {"one": [one["a"]], "fleet": list(fleet.values())},
                    checks,
                    window,
                )
            # The fleet is stopped: the load phases run on the one process alone.
            load = partial(
                load_phase,
                one_dsn,
                one_installs,
                grace=grace,
                rate=rate,
                load_s=load_s,
                postmaster=await server.postmaster_pid(),
            )
            healthy = await load(PAIRS, PAIRS)
            broken, broken_errors, broken_queued = await _broken_phase(load, one_dsn, one[BROKEN])
    return idle, healthy, broken, broken_errors, broken_queued


async def _broken_phase(
    load: Callable[[Sequence[str], Sequence[str]], Awaitable[Phase]], one_dsn: str, reactor: Reactor
) -> tuple[Phase, float, int]:
    """The load again once pair BROKEN's runs table is dropped; the phase on the others, the
    broken pair's failed records, and its jobs still queued at the end."""
    async with await connect(one_dsn, "break") as conn:
        await conn.execute(f"DROP TABLE analysis_runs_{BROKEN} CASCADE")
    errors_before = record_errors(reactor)
    # Its every record fails and is retried: a warning each from the reactor, and
    # one from psycopg for each aborted pipeline, which are noise here.
    quiet = [logging.getLogger(name) for name in ("reactor", "psycopg")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        measured = tuple(p for p in PAIRS if p != BROKEN)
        broken = await load(PAIRS, measured)
        broken_errors = record_errors(reactor) - errors_before
        async with await connect(one_dsn, "check") as conn:
            cur = await conn.execute(f"SELECT count(*) FROM reactor_{BROKEN}.pending")
            row = await cur.fetchone()
            broken_queued = int(row[0]) if row else 0
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)
    return broken, broken_errors, broken_queued
