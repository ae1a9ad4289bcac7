"""trigger_overhead: the worker's commit throughput with the notify triggers vs without them.

pgbench plays the worker: several connections commit single-row UPDATEs as fast as they can;
90% are progress updates of running jobs (the update trigger's WHEN clause rules them out
before its function is called) and 10% are terminal transitions, each
finishing a job that was running (the trigger fires: it queues the job in reactor.pending and
notifies). A reactor replica listens throughout, as in production. The two configurations
alternate ABBA, so drift (table growth, cache warmth) cancels out.

The same rounds run, interleaved with those, on the second mapping (tests/mappings/second.sql
and second.toml: another schema, quoted camelCase names, a bigint id, an enum status, naive UTC
times), with and without its triggers, in a database of its own; its listening replica is a
``reactor run`` process with REACTOR_CONFIG naming that mapping, since one process runs one
mapping.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

from bench.result import Context, Result, conditions
from bench.server import open_server
from bench.trigger_overhead.report import Findings, result_of
from bench.trigger_overhead.rounds import (
    load_finishable_jobs,
    load_progress_jobs,
    pgbench_tps,
    run_rounds,
    write_scripts,
)
from bench.trigger_overhead.scripts import CLIENTS, PROGRESS_JOBS
from bench.trigger_overhead.second import second_database
from bench.trigger_overhead.server_cost import server_cost

TITLE = "Notify trigger overhead on the worker's commit throughput"
GOAL = (
    "throughput as `reactor migrate` installs the triggers >= 0.90x of a trigger that only "
    "notifies (the floor of a notifying install); installed not to notify >= 0.90x of no trigger"
)


async def run(ctx: Context) -> Result:
    """Calibrate, create enough jobs to finish, then alternate the configurations."""
    quick = ctx.quick
    round_s = 1 if quick else 10
    # A palindrome, so that drift weighs on every configuration alike; its two halves measure
    # every configuration twice the same way, so the ratio of a configuration's second round to
    # its first is the noise of a comparison of like with like.
    half = ["with", "second with", "without", "notify_only", "second without", "quiet"]
    block = half + half[::-1]
    order = block * (1 if quick else 3)
    settings: dict[str, Any] = {
        "clients": CLIENTS,
        "pgbench_threads": 2,
        "round_s": round_s,
        "order": " ".join(order),
        "mix": "90% progress updates, 10% terminal transitions",
        "progress_jobs": PROGRESS_JOBS,
        "listening_replicas": 1,
    }
    async with open_server() as server:
        cond = await conditions(server, quick=quick)
        dsn = await server.app_database("triggers", with_audit=False)
        second_dsn = await second_database(server)
        with tempfile.TemporaryDirectory(prefix="bench-pgbench-") as tmp:
            scripts = write_scripts(Path(tmp))
            triggers, second_triggers = await load_progress_jobs(dsn, second_dsn)
            # Calibrate on progress updates alone, to know how many jobs the rounds will finish.
            calibration = await pgbench_tps(
                server, dsn, scripts, ["progress.sql"], min(round_s, 3), 0
            )
            per_client = math.ceil(calibration * round_s * 0.1 / CLIENTS * 3) + 100
            await load_finishable_jobs(dsn, second_dsn, per_client, order)
            settings["finishable_jobs_per_client_round"] = per_client
            apps = {
                "": (dsn, triggers, ["progress.sql@9", "finish.sql@1"]),
                "second ": (
                    second_dsn,
                    second_triggers,
                    ["second_progress.sql@9", "second_finish.sql@1"],
                ),
            }
            rounds, notified = await run_rounds(server, apps, order, scripts, round_s, per_client)
        cost = await server_cost(server, 2_000 if quick else 20_000, 1 if quick else 3)
    found = Findings(
        rounds, len(half), triggers, second_triggers, notified, cost, calibration, round_s, quick
    )
    return result_of(found, settings=settings, conditions=cond)
