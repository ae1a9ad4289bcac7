"""handoffs: how late jobs are while the set of replicas changes, measured from outside.

Every replica is a real ``reactor run`` process with a 2 s grace, logging JSON lines to a file of
its own; the worker (a child process) finishes jobs at a steady rate while tabs save 70% of them
inside the grace. Lateness is the audit row of the reactor's write minus ``updated_at + grace``,
both by the database clock. Three scenarios, each on a fresh database:

- rolling deploys: 3 replicas at 50 jobs/s; three times a new process starts, and once its
  ``/readyz`` says ready the oldest gets SIGTERM and is waited for, as an orchestrator does;
- eager deploys: the same with 1 replica and with 3, but the SIGTERM comes 0.5, 1 and 1.5 s
  after the new process starts (the first well before it can be ready, the last about when it
  is on this box), ready or not, and the app touches 30% of the finished jobs 0.6 grace after
  their finish (their deadline moves, with no notification);
- killed for good: 3 replicas at 50 jobs/s, one SIGKILLed a third of the way in and never
  restarted; the others must take its jobs over within a probe interval (its LISTEN session is
  gone at their next check), so the bound is the probe interval + 1 s;
- a fleet at 333 jobs/s: 1 replica, then 3, then 5, so that what more replicas cost shows as
  lateness and as the replicas' CPU time per 1,000 jobs (read from /proc, with the server's and
  the box's load average, so that a figure says whether the algorithm or the box was slow);
  then 5 again with the trigger installed with ``reactor migrate --spread`` (each replica hears
  only the jobs of the shares it owns, and nobody rings the doorbell).

The job trigger is installed as ``reactor migrate`` installs it: it notifies one channel, so
that every replica hears every job until one of them rings the doorbell, from which on the
replicas poll the queue (docs/how-it-works.md).

Each run is checked as the other benchmarks check theirs: every job that needed a run has
exactly one, none was written before its grace, none clobbered a tab's save, every replica
stopped by SIGTERM exited 0 and took its heartbeat with it.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.conn import connect
from bench.handoffs.findings import Findings, n_replicas, p99_mark
from bench.handoffs.notes import notes
from bench.handoffs.scale import (
    DEPLOY_GOAL_S,
    EAGER_MAX_S,
    FLEET_GOAL_S,
    FULL,
    GRACE_S,
    QUICK,
    RATE,
    SAVE_RATIO,
    TAB_DELAY_S,
    WINDOW_S,
)
from bench.handoffs.scenarios import run_scenarios
from bench.result import Context, Result, Table, conditions
from bench.server import open_server
from bench.stats import ms, ratio

TITLE = "Handoffs: lateness through rolling deploys, a replica killed for good, and a fleet"
GOAL = (
    "rolling deploys: p99 <= 20 ms over the run and over the jobs due within 2 s of a SIGTERM; "
    "eager deploys with touched jobs: p99 <= 20 ms and max <= 1 s; "
    "killed for good: every job due after the kill late by at most the probe interval + 1 s; "
    "333 jobs/s: p99 <= 10 ms at 1, 3 and 5 replicas; the replicas' CPU per 1,000 jobs at 5 "
    "within 1.2x of 1"
)


async def run(ctx: Context) -> Result:
    """The three scenarios, each on a fresh database of one server."""
    scale = QUICK if ctx.quick else FULL
    settings: dict[str, Any] = {
        "grace_s": GRACE_S,
        "tab_save_ratio": SAVE_RATIO,
        "tab_delay_s": list(TAB_DELAY_S),
        "window_s": WINDOW_S,
        **asdict(scale),
        "jobs_per_s": RATE,
    }
    logs = Path(tempfile.mkdtemp(prefix="bench-handoffs-"))
    async with open_server({"shared_preload_libraries": "pg_stat_statements"}) as server:
        cond = await conditions(server, quick=ctx.quick)
        async with await connect(server.admin_dsn, "setup") as admin:
            await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        scenarios = await run_scenarios(server, logs, scale)
    found = Findings(scale, scenarios, logs)
    if not (found.problems or found.anomalies):
        shutil.rmtree(logs, ignore_errors=True)
    return Result(
        met=found.met,
        headline=_headline(found),
        table=_table(found),
        figures=_figures(found),
        settings=settings,
        conditions=cond,
        notes=notes(found, quick=ctx.quick),
    )


def _table(found: Findings) -> Table:
    """Lateness per scenario, against its goal."""
    table = Table(["scenario", "reactor-written runs", "p50", "p99", "max", "goal"])

    def row(label: str, s: dict[str, float], goal: str) -> None:
        table.add(label, s["n"], ms(s["p50"]), ms(s["p99"]), ms(s["max"]), goal)

    row(
        "rolling deploys: whole run",
        found.deploy["all"],
        p99_mark(found.deploy["all"]["p99"], DEPLOY_GOAL_S),
    )
    row(
        f"rolling deploys: due within {WINDOW_S:g} s of a SIGTERM",
        found.deploy["around_sigterm"],
        p99_mark(found.deploy["around_sigterm"]["p99"], DEPLOY_GOAL_S),
    )
    for e in found.eagers:
        held = "met" if e["all"]["max"] <= EAGER_MAX_S else "missed"
        row(
            f"eager deploys, touched jobs, {n_replicas(e['replicas'])}",
            e["all"],
            p99_mark(e["all"]["p99"], DEPLOY_GOAL_S) + f"; max <= {EAGER_MAX_S:g} s: {held}",
        )
    row(
        "killed for good: due after the kill",
        found.kill["after_kill"],
        f"max <= {found.kill['bound_s']:g} s: {'met' if found.kill_ok else 'missed'}",
    )
    for f in found.fleets:
        row(
            f"{found.scale.fleet_rate:g} jobs/s, {n_replicas(f['replicas'])}",
            f["lateness"],
            p99_mark(f["lateness"]["p99"], FLEET_GOAL_S)
            + (
                f"; {ratio(found.growth)} of {found.small}'s"
                if f["replicas"] == found.large
                else ""
            ),
        )
    row(
        f"{found.scale.fleet_rate:g} jobs/s, {n_replicas(found.large)}, trigger spread (--spread)",
        found.spread["lateness"],
        "-",
    )
    return table


def _headline(found: Findings) -> str:
    """The scenarios in one line."""
    return (
        f"deploys p99 {ms(found.deploy['all']['p99'])} (around a SIGTERM "
        f"{ms(found.deploy['around_sigterm']['p99'])}); after a kill at most "
        f"{found.kill['after_kill']['max']:.2f} s late (bound {found.kill['bound_s']:g} s)"
        + "; eager deploys max "
        + ", ".join(f"{e['all']['max']:.2f} s at {e['replicas']}" for e in found.eagers)
        + f"; {found.scale.fleet_rate:g}/s p99 "
        + ", ".join(f"{ms(f['lateness']['p99'])} at {f['replicas']}" for f in found.fleets)
        + f"; replicas' CPU per 1,000 jobs {ratio(found.cpu_growth)} at {found.large} of "
        f"{found.first}'s" + (f"; {len(found.problems)} problem(s)" if found.problems else "")
    )


def _figures(found: Findings) -> dict[str, Any]:
    """Every figure of every scenario, as the results file keeps them."""
    spread_cpu, growth, cpu_growth = (
        found.spread["cpu_per_1000_jobs"],
        found.growth,
        found.cpu_growth,
    )
    return {
        "deploy": {k: found.deploy[k] for k in ("all", "around_sigterm", "steps")},
        "eager": {
            str(e["replicas"]): {
                "all": e["all"],
                "steps": e["steps"],
                "touched": e["outcome"].play.touched,
            }
            for e in found.eagers
        },
        "kill": {
            k: found.kill[k]
            for k in (
                "after_kill",
                "bound_s",
                "killed_after_s",
                "late_over_half_s",
                "record_statements_per_job",
            )
        },
        "fleet": {
            str(f["replicas"]): {
                "lateness": f["lateness"],
                "record_statements_per_job": f["record_statements_per_job"],
                "cpu_per_1000_jobs": f["cpu_per_1000_jobs"],
            }
            for f in found.fleets
        },
        "spread": {
            "lateness": found.spread["lateness"],
            "record_statements_per_job": found.spread["record_statements_per_job"],
            "cpu_per_1000_jobs": spread_cpu,
        },
        "fleet_p99_ratio": growth,
        "fleet_cpu_ratio": cpu_growth,
        "verdicts": {n: s["outcome"].verdict.as_dict() for n, s in found.scenarios.items()},
        "worker_behind_s": {n: s["outcome"].play.behind_s for n, s in found.scenarios.items()},
        "problems": found.problems,
        "anomalies": found.anomalies,
        "logs": str(found.logs) if found.problems or found.anomalies else None,
    }
