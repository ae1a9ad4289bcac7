"""The handoffs scenarios, each on a database of its own: rolling and eager deploys, a replica
killed for good, and fleets of growing size."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.abc

from bench.handoffs.fleet import Fleet, Replica
from bench.handoffs.measure import Outcome, Usage, anomalies_of, read_outcome, setup
from bench.handoffs.scale import (
    ANOMALY_S,
    EAGER_SIGTERM_AFTER_S,
    GRACE_S,
    RATE,
    SAVE_RATIO,
    TAB_DELAY_S,
    TOUCH_AT,
    TOUCH_RATIO,
    WINDOW_S,
    Scale,
)
from bench.loadgen import play_elsewhere
from bench.server import Server
from bench.stats import safe_div, summarize
from bench.workload import Play


async def _load(
    dsn: str, ids: Sequence[str], rate: float, played: list[Play], *, touch: bool = False
) -> None:
    touches = {"touch_ratio": TOUCH_RATIO, "touch_delay": TOUCH_AT * GRACE_S} if touch else {}
    played.append(
        await play_elsewhere(
            dsn, list(ids), rate=rate, save_ratio=SAVE_RATIO, tab_delay=TAB_DELAY_S, **touches
        )
    )


async def _deploys(
    server: Server, logs: Path, scale: Scale, replicas: int, *, eager: bool = False
) -> dict[str, Any]:
    """Start a replica, SIGTERM the oldest; ``scale.deploys`` times. The SIGTERM waits for the
    new replica's readiness, or, ``eager``, comes EAGER_SIGTERM_AFTER_S its start while the app
    touches jobs."""
    delays = itertools.cycle(EAGER_SIGTERM_AFTER_S)
    label = f"eager{replicas}" if eager else "deploy"
    seconds = scale.eager_seconds if eager else scale.deploy_seconds
    dsn, ids = await setup(server, f"handoffs_{label}", int(seconds * RATE))
    fleet = Fleet(dsn, logs, label, "INFO", scale.probe)
    replaced: list[tuple[Replica, Replica, float]] = []  # (new, oldest, its SIGTERM's time)
    played: list[Play] = []
    async with aiohttp.ClientSession() as session:
        try:
            await fleet.start(replicas, session)
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(_load, dsn, ids, RATE, played, touch=eager))
                await anyio.sleep(scale.deploy_lead)
                for _ in range(scale.deploys):
                    new = await fleet.spawn()
                    oldest = next(r for r in fleet.replicas if r.running and r is not new)
                    if eager:
                        tg.start_soon(fleet.ready, new, session)
                        await anyio.sleep(new.started_at + next(delays) - time.time())
                    else:
                        await fleet.ready(new, session)
                    sigterm_at = time.time()
                    await fleet.terminate(oldest)
                    replaced.append((new, oldest, sigterm_at))
                    await anyio.sleep(scale.deploy_gap)
                if played:
                    fleet.problems.append("the load ended before the last deploy did")
            # Read once the task group is done: an eager deploy's new replica may have become
            # ready after its predecessor's SIGTERM.
            steps: list[dict[str, Any]] = [
                {
                    "new": new.name,
                    "ready_at": new.started_at + (new.ready_s or math.nan),
                    "new_ready_s": new.ready_s,
                    "stopped": oldest.name,
                    "sigterm_at": sigterm_at,
                    "stop_s": oldest.stop_s,
                }
                for new, oldest, sigterm_at in replaced
            ]
            outcome = await read_outcome(server, dsn, ids, played[0], fleet)
        finally:
            await fleet.close()
    terms = [s["sigterm_at"] for s in steps]
    return {
        "replicas": replicas,
        "outcome": outcome,
        "steps": steps,
        "all": summarize(outcome.lateness()),
        "around_sigterm": summarize(_around(outcome, terms)),
        "anomalies": anomalies_of(outcome, fleet),
    }


def _around(outcome: Outcome, moments: Sequence[float]) -> list[float]:
    """Lateness of the jobs due within WINDOW_S of any of ``moments`` (each job once)."""
    return [
        late
        for due, late in outcome.late.values()
        if any(abs(due - moment) <= WINDOW_S for moment in moments)
    ]


async def _kill(server: Server, logs: Path, scale: Scale) -> dict[str, Any]:
    """SIGKILL the oldest replica a third of the way in, never to come back.

    A third of the way in is past the victim's second health check in both scales: only from
    its second check on does its heartbeat name its LISTEN session, which is what lets the
    others drop it at their next check rather than when its heartbeat ages out.
    """
    dsn, ids = await setup(server, "handoffs_kill", int(scale.kill_seconds * RATE))
    fleet = Fleet(dsn, logs, "kill", "INFO", scale.probe)
    played: list[Play] = []
    async with aiohttp.ClientSession() as session:
        try:
            await fleet.start(scale.kill_replicas, session)
            async with anyio.create_task_group() as tg:
                tg.start_soon(_load, dsn, ids, RATE, played)
                await anyio.sleep(scale.kill_seconds / 3)
                victim = fleet.replicas[0]
                killed_at = time.time()
                fleet.kill(victim)
            outcome = await read_outcome(server, dsn, ids, played[0], fleet)
        finally:
            await fleet.close()
    bound = scale.probe + 1.0
    after = {job: (due, late) for job, (due, late) in outcome.late.items() if due > killed_at}
    # Past the bound, or seconds late once the others should long have taken over.
    slow = [
        (job, late)
        for job, (due, late) in after.items()
        if late > bound or (due > killed_at + bound and late > ANOMALY_S)
    ]
    return {
        "outcome": outcome,
        "killed": victim.name,
        "killed_after_s": killed_at - victim.started_at,
        "after_kill": summarize([late for _, late in after.values()]),
        "late_over_half_s": sum(1 for _, late in after.values() if late > 0.5),
        "bound_s": bound,
        "record_statements_per_job": safe_div(outcome.record_calls, outcome.play.finished),
        "anomalies": anomalies_of(outcome, fleet, slow),
    }


async def _fleet(
    server: Server, logs: Path, count: int, scale: Scale, *, spread: bool = False
) -> dict[str, Any]:
    """``count`` replicas under the fleet's rate; ``spread``: the trigger notifies each share on
    a channel of its own (else every replica hears every job)."""
    rate = scale.fleet_rate
    label = f"handoffs_fleet{count}" + ("_spread" if spread else "")
    dsn, ids = await setup(server, label, int(scale.fleet_seconds * rate), spread=spread)
    # Warning level: at 333 jobs/s an info line per recorded run costs the replicas CPU that
    # the measurement is about; the in-process benchmarks quiet the reactor the same way.
    fleet = Fleet(dsn, logs, label.removeprefix("handoffs_"), "WARNING", scale.probe)
    usage = Usage(fleet, await server.postmaster_pid())
    played: list[Play] = []
    async with aiohttp.ClientSession() as session:
        try:
            await fleet.start(count, session)
            usage.start()
            await _load(dsn, ids, rate, played)
            outcome = await read_outcome(server, dsn, ids, played[0], fleet, usage)
        finally:
            await fleet.close()
    return {
        "replicas": count,
        "outcome": outcome,
        "lateness": summarize(outcome.lateness()),
        "cpu_per_1000_jobs": usage.per_thousand(outcome.play.finished),
        "record_statements_per_job": safe_div(outcome.record_calls, outcome.play.finished),
        "anomalies": anomalies_of(outcome, fleet),
    }


async def run_scenarios(server: Server, logs: Path, scale: Scale) -> dict[str, dict[str, Any]]:
    """Every scenario, one after the other (or side by side), each on a database of its own."""
    jobs: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
        "deploy": partial(_deploys, server, logs, scale, scale.deploy_replicas),
        **{
            f"eager{n}": partial(_deploys, server, logs, scale, n, eager=True)
            for n in scale.eager_replicas
        },
        "kill": partial(_kill, server, logs, scale),
        **{f"fleet{n}": partial(_fleet, server, logs, n, scale) for n in scale.fleet_counts},
        # The largest fleet again with a trigger that spreads: what --spread saves, or costs.
        "spread": partial(_fleet, server, logs, scale.fleet_counts[-1], scale, spread=True),
    }
    found: dict[str, dict[str, Any]] = {}

    async def one(name: str) -> None:
        found[name] = await jobs[name]()

    if scale.side_by_side:
        async with anyio.create_task_group() as tg:
            for name in jobs:
                tg.start_soon(one, name)
    else:
        for name in jobs:
            await one(name)
    return {name: found[name] for name in jobs}
