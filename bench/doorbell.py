"""doorbell: does the default install, ringing its bell under load, beat the notify-only trigger?

A NOTIFY takes a cluster-wide lock at commit and holds it through the commit's WAL flush, so
concurrent notifying commits cannot share a flush (group commit): they queue on the lock. The
job trigger skips its NOTIFY while its channel's doorbell is awake, which a replica keeps it
while the jobs come fast and it polls the queue itself (reactor/insurance/doorbell.py). This
measures the default install as `reactor migrate` installs it, with its replica listening and
ringing the bell as it would in production, against the notify-only trigger (the floor of a
notifying install) and against the default install with the bell's read taken out of its
function (every finishing commit notifies, as before the doorbell), at 1, 2 and 4 concurrent
finishing clients.

The job life, the durable commits, the listening replica, the rounds from an empty table after a
checkpoint and the rotating order (rows of a Williams square) are app_cost's. 'notify_again' is
the notify-only trigger a second time under another name: its ratio is the noise of a
comparison of like with like on this machine. Throughput on a shared disk swings too widely
for a few per cent to show, so each round also samples what the clients' sessions wait on: the
share of them found waiting for the NOTIFY's lock is what the bell gives back.
"""

from __future__ import annotations

import re
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import psycopg

from bench import pgbench
from bench.app_cost.installs import Config, Installed
from bench.app_cost.rounds import (
    DOCUMENTS,
    JOB_LIFE,
    SERVER,
    documents_app,
    set_orders,
)
from bench.conn import connect, scalar
from bench.result import Context, Result, Table, conditions
from bench.server import Server, open_server
from bench.stats import percentile, ratio, safe_div
from bench.workload import bench_settings, replicas, wait_for_first_scan

TITLE = "The doorbell: job lives with the NOTIFY skipped while the replicas poll"
GOAL = (
    "with 2 or more concurrent finishing clients, the default install (its replica ringing the "
    "doorbell) at or above the notify-only trigger: median of per-set ratios >= 1.00"
)

CLIENTS = (1, 2, 4)
QUICK_CLIENTS = (2,)
SETS = 8
ROUND_S = 3
QUICK_ROUND_S = 1
FLOOR = "notify_only"
NOISE = "notify_again"

# The bell's read in the installed job function, taken out for the 'unbelled' install.
BELL_READ = re.compile(r"IF NOT EXISTS \(SELECT 1 FROM \S+\.doorbell b\n[^\n]*\) THEN")
# How often the clients' sessions are sampled: far shorter than a durable commit's flush.
SAMPLE_S = 0.01
SESSION_WAITS = """
SELECT wait_event_type, wait_event FROM pg_stat_activity
 WHERE application_name = 'pgbench' AND state = 'active'
"""
WAL_WAITS = {("IO", "WalSync"), ("IO", "WalWrite"), ("LWLock", "WALWrite")}


async def run(ctx: Context) -> Result:
    """Every client count in turn: sets of rounds, every install once per set."""
    quick = ctx.quick
    round_s = QUICK_ROUND_S if quick else ROUND_S
    sets = 1 if quick else SETS
    clients = QUICK_CLIENTS if quick else CLIENTS
    async with open_server(SERVER) as server:
        cond = await conditions(server, quick=quick)
        async with documents_app(server, "doorbell") as (dsn, conn, reactor):
            function = f"{reactor.schema}.job_changed_v1"
            installed = str(
                await scalar(conn, "SELECT pg_get_functiondef(%s::regproc)", (function,))
            )
        unbelled, reads = BELL_READ.subn("IF true THEN", installed)
        if reads != 1:
            raise RuntimeError(f"{function} no longer reads its doorbell so: update this bench")
        configs = _configs(installed, unbelled)
        orders = set_orders(list(configs), sets)
        rounds = await _rounds(server, dsn, reactor, configs, orders, clients, round_s)
    summary = {
        count: {name: _summary(rounds, count, name) for name in configs} for count in clients
    }
    table = _table(summary, configs, clients)
    pays = {count: summary[count]["default"]["median"] >= 1.0 for count in clients if count >= 2}
    # One set is no median: a quick run never says it is met.
    met = sets > 1 and bool(pays) and all(pays.values())
    notes = _notes(rounds, pays, clients, round_s, sets)
    headline = "; ".join(
        f"{count} clients: default {_spread(summary[count]['default'])}, unbelled "
        f"{_spread(summary[count]['unbelled'])}, noise {_spread(summary[count][NOISE])}"
        for count in clients
    )
    return Result(
        met=met,
        headline=headline,
        table=table,
        figures={"rounds": rounds, "summary": {str(k): v for k, v in summary.items()}},
        settings={"clients": list(clients), "round_s": round_s, "sets": sets, **SERVER},
        conditions=cond,
        notes=notes,
    )


def _configs(installed: str, unbelled: str) -> dict[str, Config]:
    """The installs compared: the notify-only floor twice, the default, and the default with the
    bell's read taken out (``unbelled``, the job function as ``installed`` without it)."""
    return {
        FLOOR: Config("the notify-only trigger", "notify_only", False, FLOOR),
        NOISE: Config("the notify-only trigger again: the noise", "notify_only", False, FLOOR),
        # The function is put back as installed: the unbelled round replaced it.
        "default": Config(
            "as `reactor migrate` installs it, the replica ringing its doorbell",
            "with",
            True,
            FLOOR,
            (installed,),
        ),
        "unbelled": Config(
            "the default with the bell's read taken out: every finish notifies",
            "with",
            True,
            FLOOR,
            (unbelled,),
        ),
    }


async def _rounds(
    server: Server,
    dsn: str,
    reactor: Installed,
    configs: dict[str, Config],
    orders: list[list[str]],
    clients: Sequence[int],
    round_s: int,
) -> list[dict[str, Any]]:
    """Every client count in turn, its sets of rounds in their orders, a replica listening."""
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-pgbench-") as tmp:
        script = Path(tmp) / "job_life.sql"
        script.write_text(JOB_LIFE.format(documents=DOCUMENTS))
        settings = bench_settings(dsn, grace=3600.0, scan_interval=3600.0)
        async with replicas(settings, 1) as running:
            await wait_for_first_scan(running)
            # Uncounted: the fresh cluster's first round creates the WAL segments.
            await _round(server, dsn, script, reactor, configs["default"], 2, round_s)
            for count in clients:
                for number, order in enumerate(orders, 1):
                    for name in order:
                        tps, waits = await _round(
                            server, dsn, script, reactor, configs[name], count, round_s
                        )
                        rounds.append(
                            {
                                "clients": count,
                                "set": number,
                                "config": name,
                                "tps": tps,
                                "seconds": round_s,
                                **waits,
                            }
                        )
    return rounds


def _table(
    summary: dict[int, dict[str, dict[str, Any]]],
    configs: dict[str, Config],
    clients: Sequence[int],
) -> Table:
    """Each install at each client count, against the notify-only floor."""
    table = Table(
        [
            "clients",
            "install",
            "mean lives/s",
            "vs notify-only: median [IQR]",
            "waiting: NOTIFY lock",
            "waiting: WAL",
            "replica CPU",
        ]
    )
    for count in clients:
        for name, config in configs.items():
            s = summary[count][name]
            table.add(
                count,
                f"{name}: {config.label}",
                f"{s['mean']:,.1f}",
                "1 (floor)" if name == FLOOR else _spread(s),
                f"{s['notify_lock_share']:.1%}",
                f"{s['wal_share']:.1%}",
                f"{s['cpu_share']:.1%}",
            )
    return table


def _notes(
    rounds: list[dict[str, Any]],
    pays: dict[int, bool],
    clients: Sequence[int],
    round_s: int,
    sets: int,
) -> list[str]:
    """How the rounds ran, what the waits are, and where the default paid its way."""
    return [
        f"pgbench -M prepared, {', '.join(map(str, clients))} client(s), {round_s} s per round, "
        f"{sets} set(s) per client count in rotating order; app_cost's job life (five commits, "
        "a 32 KiB document), fsync, full_page_writes and synchronous_commit on, one reactor "
        "replica listening. Each install's figure is the median of its per-set ratios to "
        "the notify-only round of the same set, with their interquartile range.",
        "'default' is the install as `reactor migrate` makes it, and the replica is the "
        "default replica: it rings the doorbell once it hears 20 job notifications in a "
        "second, renews it at each poll (every 0.25 s) while the jobs keep coming, and reads "
        "the queue by deadline meanwhile, on the same two cores. 'unbelled' is the same "
        "function without the bell's read: what every finishing commit paid before the bell. "
        "Each round starts from a fallen-silent bell, so its first commits notify.",
        f"Waits: every {SAMPLE_S * 1000:g} ms a sampler reads pg_stat_activity for pgbench's "
        "active sessions; 'waiting: NOTIFY lock' is the share of those found waiting for a "
        "heavyweight lock on an object (the database's, which a notifying commit takes before "
        "its commit record and holds through the flush), 'waiting: WAL' for the WAL's flush "
        "(IO WalSync/WalWrite, LWLock WALWrite). The first is what a bell could give back, "
        "at most. 'replica CPU' is this process's CPU time over the round (the listening "
        "replica, and the sampler alike in every round) per second, of one core: on a "
        "2-core machine what it takes, PostgreSQL and pgbench lack.",
        "Default at or above notify-only at: "
        + ", ".join(f"{count} clients {'yes' if ok else 'no'}" for count, ok in pays.items())
        + ".",
        "Rounds (lives/s): "
        + "; ".join(f"{r['clients']}c set {r['set']} {r['config']} {r['tps']:,.0f}" for r in rounds)
        + ".",
    ]


def _summary(rounds: list[dict[str, Any]], clients: int, name: str) -> dict[str, Any]:
    mine = [r for r in rounds if r["clients"] == clients]
    floor = {r["set"]: r["tps"] for r in mine if r["config"] == FLOOR}
    ratios = [safe_div(r["tps"], floor[r["set"]]) for r in mine if r["config"] == name]
    return {
        "mean": statistics.fmean(r["tps"] for r in mine if r["config"] == name),
        "ratios": ratios,
        "median": statistics.median(ratios),
        "q1": percentile(ratios, 0.25),
        "q3": percentile(ratios, 0.75),
        # Of the clients' sessions seen active, the share waiting for the NOTIFY's lock, and
        # for the WAL.
        **{
            f"{wait}_share": safe_div(
                sum(r.get(wait, 0) for r in mine if r["config"] == name),
                sum(r.get("sampled", 0) for r in mine if r["config"] == name),
            )
            for wait in ("notify_lock", "wal")
        },
        "cpu_share": safe_div(
            sum(r.get("cpu_ms", 0) for r in mine if r["config"] == name) / 1000,
            sum(r["seconds"] for r in mine if r["config"] == name),
        ),
    }


def _spread(s: dict[str, Any]) -> str:
    return f"{ratio(s['median'])} [{s['q1']:.2f}-{s['q3']:.2f}]"


async def _round(
    server: Server,
    dsn: str,
    script: Path,
    reactor: Installed,
    config: Config,
    clients: int,
    seconds: int,
) -> tuple[float, Counter[str]]:
    """Job lives per second over one round of ``config``, from an empty table, and what the
    clients' sessions were found waiting on (:func:`_sample`)."""
    async with await connect(dsn, "setup") as conn:
        for attempt in range(5):
            try:
                await conn.execute(f"TRUNCATE analysis_jobs, {reactor.schema}.pending")
                break
            except psycopg.errors.DeadlockDetected:
                # The listening replica's statement took the same locks the other way round:
                # the server chose this one; the next attempt finds them free.
                if attempt == 4:
                    raise
        await reactor.install(conn, config)
        await conn.execute("CHECKPOINT")
    argv = [
        str(server.bin_dir / "pgbench"), "-n", "-M", "prepared", "-c", str(clients),
        "-j", str(clients), "-T", str(seconds), "-f", str(script), dsn,
    ]  # fmt: skip
    waits: Counter[str] = Counter()
    over = anyio.Event()
    # The replica runs in this process (the sampler too, alike in every round) and pgbench in a
    # child: this process's CPU time over the round is what the replica took from the box.
    cpu = time.process_time()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_sample, dsn, waits, over)
        done = await anyio.run_process(argv, check=False)
        # Not cancelled: a query cancelled in flight costs its connection and a warning.
        over.set()
    waits["cpu_ms"] = round((time.process_time() - cpu) * 1000)
    _, tps = pgbench.report(done)
    return tps, waits


async def _sample(dsn: str, waits: Counter[str], over: anyio.Event) -> None:
    """Count, every SAMPLE_S until ``over``, what pgbench's sessions wait on: 'sampled' is
    every session seen, 'notify_lock' one waiting for the NOTIFY's commit lock (a heavyweight
    lock on an object: the database's, which a notifying commit holds through its flush),
    'wal' one waiting on the WAL (its flush, or the lock of whoever flushes)."""
    async with await connect(dsn, "sampler") as conn:
        while not over.is_set():
            cur = await conn.execute(SESSION_WAITS)
            for kind, event in await cur.fetchall():
                waits["sampled"] += 1
                if (kind, event) == ("Lock", "object"):
                    waits["notify_lock"] += 1
                elif (kind, event) in WAL_WAITS:
                    waits["wal"] += 1
            await anyio.sleep(SAMPLE_S)
