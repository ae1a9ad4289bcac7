"""app_cost: what installing the reactor costs the app's worker, a whole job's life at a time.

pgbench plays the worker, measured from outside the reactor's process: each transaction of its
script is one job's life as the worker drives it, five commits in a row: the insert with a
32 KiB document, three progress updates that add verdicts to results (status stays 'running'),
and the finishing update that sets status 'complete'. Commits are durable (fsync on, as in
production), so the figure is what the app pays per job, not what a throwaway cluster does.
One reactor replica listens throughout every round, as in production.

Several installs on analysis_jobs are compared in one run (CONFIGS): none of the reactor's
triggers or indexes; a trigger that does nothing but notify on the transition into a terminal
status, the floor PostgreSQL sets for any install that notifies; the triggers and the walk index
exactly as `reactor migrate` left them (read back from the catalog, so whatever SQL the code
under test installs is what is measured), divided by that floor; the same with the job triggers
installed not to notify (`reactor migrate --no-notify`), divided by none; and 'none' a second
time under another name. Two more, for a measurement only: the default and the quiet install
with the queue, reactor.pending, made UNLOGGED right after the install (its rows, their index
entries and the replica's deletes then write no WAL), each divided by the same floor as its
logged twin and compared with that twin's round of the same set: how much of the gap to the
floor is the queue row's WAL. Durable commits on a shared VM's disk and CPUs can
vary by a factor of two between two rounds a few seconds apart, so a single comparison means
little: the second 'none' states the noise floor, and an effect is only an effect where it
stands clear of it.

The rounds run in sets: every install once per set, back to back, in an order that rotates from
set to set as the rows of a Williams square, so that each install runs in every position and
after every other install equally often. Each install is compared with its floor's round of its
own set; the median of those per-set ratios and their interquartile range are the figure. Each
round starts from an empty table after a checkpoint, so no install inherits another's table or
dirty pages. Per round the server also counts the WAL written, the share of the app's updates that
were HOT (an index whose key or predicate names a column an update changes makes that update
write index entries), and the time spent in the job trigger's function (track_functions).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from bench.app_cost.installs import CONFIGS, Installed
from bench.app_cost.report import Findings, result_of
from bench.app_cost.rounds import (
    CLIENTS,
    DOC_BYTES,
    DOCUMENTS,
    JOB_LIFE,
    QUICK_ROUND_S,
    ROUND_S,
    SERVER,
    SETS,
    UPDATES_PER_LIFE,
    documents_app,
    one_round,
    record_check,
    set_orders,
)
from bench.conn import scalar
from bench.result import Context, Result, conditions
from bench.server import Server, open_server
from bench.workload import (
    bench_settings,
    replicas,
    wait_for_first_scan,
)

TITLE = "The reactor's cost to the app's worker, per job's life, with durable commits"
GOAL = (
    "job lives/s as `reactor migrate` installs it >= 0.99x of a trigger that only notifies (the "
    "floor of a notifying install; median of per-set ratios); installed not to notify >= 0.99x "
    "of no trigger; also: WAL per life <= 1.10x, HOT share >= 0.95 of none's, the job trigger "
    "<= 25 us per finishing update"
)


async def run(ctx: Context) -> Result:
    """Set up one database, then run the sets of rounds, every install once per set."""
    quick = ctx.quick
    round_s = QUICK_ROUND_S if quick else ROUND_S
    sets = 1 if quick else SETS
    orders = set_orders(list(CONFIGS), sets)
    settings: dict[str, Any] = {
        "clients": CLIENTS,
        "round_s": round_s,
        "sets": sets,
        "configs": ", ".join(CONFIGS),
        "document_bytes": DOC_BYTES,
        "commits_per_job_life": 1 + UPDATES_PER_LIFE,
        "listening_replicas": 1,
        "queue_unlogged": ", ".join(n for n, c in CONFIGS.items() if c.queue_unlogged),
        **SERVER,
    }
    async with open_server(SERVER) as server:
        cond = await conditions(server, quick=quick)
        async with documents_app(server, "app_cost") as (dsn, conn, reactor):
            track_functions = str(await scalar(conn, "SHOW track_functions"))
        rounds = await _rounds(server, dsn, reactor, orders, round_s)
        # Uncounted: the installs with the queue unlogged still get their jobs recorded.
        checks = [
            await record_check(dsn, reactor, config)
            for config in CONFIGS.values()
            if config.queue_unlogged
        ]
    found = Findings(rounds, orders, checks, reactor, track_functions, round_s, sets)
    return result_of(found, settings=settings, conditions=cond)


async def _rounds(
    server: Server, dsn: str, reactor: Installed, orders: list[list[str]], round_s: int
) -> list[dict[str, Any]]:
    """Every set's rounds in its order, after one uncounted, with a replica listening."""
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-pgbench-") as tmp:
        script = Path(tmp) / "job_life.sql"
        script.write_text(JOB_LIFE.format(documents=DOCUMENTS))
        async with replicas(bench_settings(dsn, grace=3600.0, scan_interval=3600.0), 1) as running:
            await wait_for_first_scan(running)
            # A round that is not counted: the fresh cluster's first rounds create the WAL
            # segments that later rounds recycle, and would be slower for it.
            await one_round(server, dsn, script, reactor, "default", round_s)
            for number, order in enumerate(orders, 1):
                for position, name in enumerate(order, 1):
                    found = await one_round(server, dsn, script, reactor, name, round_s)
                    rounds.append({"set": number, "position": position, **found})
    return rounds
