"""trigger_overhead's rounds: pgbench playing the worker on one configuration at a time, with a
replica listening on each database, after the jobs they update are in place."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio

from bench import pgbench
from bench.conn import Conn, connect, scalar
from bench.server import Server
from bench.stats import safe_div
from bench.trigger_overhead.scripts import CLIENTS, FINISH_SCRIPT, PROGRESS_JOBS, PROGRESS_SCRIPT
from bench.trigger_overhead.second import (
    SECOND_FINISH_SCRIPT,
    SECOND_FINISHABLE_JOBS,
    SECOND_JOBS,
    SECOND_PROGRESS_JOBS,
    SECOND_PROGRESS_SCRIPT,
    second_replica,
)
from bench.trigger_overhead.triggers import Triggers
from bench.workload import bench_settings, replicas, wait_for_first_scan


def write_scripts(scripts: Path) -> Path:
    """pgbench's scripts, for both mappings, written in ``scripts``."""
    (scripts / "progress.sql").write_text(PROGRESS_SCRIPT)
    (scripts / "finish.sql").write_text(FINISH_SCRIPT)
    (scripts / "second_progress.sql").write_text(SECOND_PROGRESS_SCRIPT)
    (scripts / "second_finish.sql").write_text(SECOND_FINISH_SCRIPT)
    return scripts


async def load_progress_jobs(dsn: str, second_dsn: str) -> tuple[Triggers, Triggers]:
    """The running jobs the progress updates touch, in both databases; their triggers as
    installed."""
    async with await connect(dsn, "setup") as conn:
        await conn.execute(
            "INSERT INTO analysis_jobs (id, run_id, status, doc_html) "
            "SELECT md5('p' || g)::uuid, gen_random_uuid(), 'running', "
            "       repeat('<p>citation</p>', 100) "
            "FROM generate_series(1, %s) g",
            (PROGRESS_JOBS,),
        )
        await conn.execute("VACUUM ANALYZE analysis_jobs")
        triggers = await Triggers.read(conn)
    async with await connect(second_dsn, "setup") as conn:
        await conn.execute(SECOND_PROGRESS_JOBS, (PROGRESS_JOBS,))
        await conn.execute(f"VACUUM ANALYZE {SECOND_JOBS}")
        second_triggers = await Triggers.read(conn, SECOND_JOBS)
    return triggers, second_triggers


async def load_finishable_jobs(
    dsn: str, second_dsn: str, per_client: int, order: list[str]
) -> None:
    """``per_client`` running jobs for each client to finish in each round of ``order``, in the
    database of the round's mapping."""
    async with await connect(dsn, "setup") as conn:
        await conn.execute(
            "INSERT INTO analysis_jobs (id, run_id, status, doc_html) "
            "SELECT md5('f' || c || '-' || k)::uuid, gen_random_uuid(), 'running', "
            "       '<p>short</p>' "
            "FROM generate_series(0, %s - 1) c, generate_series(1, %s) k",
            (CLIENTS, per_client * sum(not c.startswith("second ") for c in order)),
        )
        await conn.execute("VACUUM ANALYZE analysis_jobs")
    async with await connect(second_dsn, "setup") as conn:
        await conn.execute(
            SECOND_FINISHABLE_JOBS,
            (CLIENTS, per_client * sum(c.startswith("second ") for c in order)),
        )
        await conn.execute(f"VACUUM ANALYZE {SECOND_JOBS}")


async def run_rounds(
    server: Server,
    apps: dict[str, tuple[str, Triggers, list[str]]],
    order: list[str],
    scripts: Path,
    round_s: int,
    per_client: int,
) -> tuple[list[dict[str, Any]], int]:
    """Every round of ``order``, each configuration put in place on its mapping's database
    (``apps``, by prefix), with a replica listening on each; the rounds, and the notifications
    the reference's replica accepted."""
    dsn, second_dsn = apps[""][0], apps["second "][0]
    rounds: list[dict[str, Any]] = []
    done_rounds = {prefix: 0 for prefix in apps}
    async with (
        replicas(bench_settings(dsn, grace=3600.0, scan_interval=3600.0), 1) as running,
        second_replica(second_dsn),
    ):
        await wait_for_first_scan(running)
        for config in order:
            prefix = "second " if config.startswith("second ") else ""
            app_dsn, installed, files = apps[prefix]
            async with await connect(app_dsn, "setup") as conn:
                await installed.install(conn, config.removeprefix(prefix))
                await conn.execute(f"VACUUM {installed.table}")
                done_before = await finished_count(conn, installed.table)
            # This process is the reference's listening replica (pgbench is a child of
            # its own): its CPU time over the round is what the replica took.
            cpu = time.process_time()
            k0 = done_rounds[prefix] * per_client
            tps = await pgbench_tps(server, app_dsn, scripts, files, round_s, k0)
            done_rounds[prefix] += 1
            cpu = time.process_time() - cpu
            async with await connect(app_dsn, "check") as conn:
                finished = await finished_count(conn, installed.table) - done_before
            rounds.append(
                {
                    "config": config,
                    "tps": tps,
                    "terminal": finished,
                    "terminal_share": safe_div(finished, tps * round_s),
                    "replica_cpu_share": cpu / round_s,
                }
            )
        notified = int(running[0].reactor.metrics.notifications.labels("accepted")._value.get())
    return rounds, notified


async def pgbench_tps(
    server: Server, dsn: str, scripts: Path, files: list[str], seconds: int, k0: int
) -> float:
    argv = [
        str(server.bin_dir / "pgbench"), "-n", "-M", "prepared", "-c", str(CLIENTS), "-j", "2",
        "-T", str(seconds), "-D", f"k={k0}",
        *(arg for name in files for arg in ("-f", str(scripts / name))),
        dsn,
    ]  # fmt: skip
    _, tps = pgbench.report(await anyio.run_process(argv, check=False))
    return tps


async def finished_count(conn: Conn, table: str) -> int:
    state = "state = 'done'" if table == SECOND_JOBS else "status = 'complete'"
    return int(await scalar(conn, f"SELECT count(*) FROM {table} WHERE {state}"))
