"""cold_start: from exec to ready, and to the first write, for a `reactor run` process.

The server is up and migrated, as in the other benchmarks. Each round finishes one job two
hours ago (long past any grace), execs `python -m reactor run` and polls its /readyz every
5 ms until it answers 200; the first write is the run row's created_at (the record statement's
transaction start, by the database clock on this same host) minus the exec time. Then the
process gets SIGTERM and the next round starts. Beside them, the floors those times stand on:
exec to exit of an interpreter that does nothing, and of one that only imports reactor.cli.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import anyio

from bench.conn import Conn, connect, scalar
from bench.processes import cpu_by_process
from bench.result import Context, Result, Table, conditions
from bench.server import open_server

TITLE = "Cold start: exec to /readyz 200 and to the first write of `reactor run`"
GOAL = "exec -> /readyz 200 <= 1 s (median of the rounds)"
READY_GOAL = 1.0

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 30.0
POLL = 0.005

FINISHED = """
INSERT INTO analysis_jobs (id, run_id, status, doc_html, results, created_at, updated_at)
VALUES (gen_random_uuid(), gen_random_uuid(), 'complete', '<p>cold</p>', '{"verdicts": 1}',
        now() - interval '3 hours', now() - interval '2 hours')
RETURNING id::text
"""

WRITTEN = "SELECT extract(epoch FROM created_at)::float8 FROM analysis_runs WHERE job_id = %s"


async def run(ctx: Context) -> Result:
    """Start `reactor run` ``rounds`` times on a migrated database; time readiness and the write."""
    rounds = 2 if ctx.quick else 7
    settings: dict[str, Any] = {"rounds": rounds, "poll_s": POLL, "grace_s": 120.0}
    async with open_server() as server:
        cond = await conditions(server, quick=ctx.quick)
        dsn = await server.app_database("cold_start", with_audit=False)
        floors = {
            "interpreter": await _exec_to_exit(["-c", "pass"], rounds),
            "import reactor.cli": await _exec_to_exit(["-c", "import reactor.cli"], rounds),
        }
        ready: list[float] = []
        written: list[float] = []
        cpu: list[float] = []
        problems: list[str] = []
        async with aiohttp.ClientSession() as session, await connect(dsn, "app") as app:
            for _ in range(rounds):
                job_id = await scalar(app, FINISHED)
                outcome = await _one_start(dsn, job_id, app, session)
                if isinstance(outcome, str):
                    problems.append(outcome)
                    continue
                ready.append(outcome[0])
                written.append(outcome[1])
                cpu.append(outcome[2])
    table = Table(["from exec to", "min", "median", "max", "runs"])
    for label, values in (
        ("exit of `python -c pass`", floors["interpreter"]),
        ("exit of `python -c 'import reactor.cli'`", floors["import reactor.cli"]),
        ("/readyz 200 of `reactor run`", ready),
        ("first write of `reactor run` (run row's created_at)", written),
        ("CPU `reactor run` used until /readyz 200 (user + system)", cpu),
    ):
        table.add(label, *_spread(values), len(values))
    median_ready = statistics.median(ready) if ready else float("nan")
    median_write = statistics.median(written) if written else float("nan")
    met = bool(ready) and median_ready <= READY_GOAL and not problems
    notes = [
        f"{rounds} rounds, one after the other, each a fresh process on the same migrated "
        "database with one finished job already past its grace; /readyz polled every "
        f"{POLL * 1000:g} ms from this process (the figure is at most that much late).",
        "Ready means the database answered a health check, the record statements can write, "
        "LISTEN is up and a probe notification sent from another session came back over it.",
        "The process's CPU until ready is read from /proc (10 ms ticks) when /readyz first "
        "answers 200: on a shared machine it moves less with the load than the wall times.",
        "The floors are exec to exit in the same rounds: an interpreter that does nothing, and "
        "one that imports the command line module and exits.",
        *problems,
    ]
    headline = (
        f"exec -> /readyz 200 median {median_ready:.2f} s (goal <= {READY_GOAL:g} s), "
        f"exec -> first write median {median_write:.2f} s, CPU until ready median "
        f"{statistics.median(cpu) if cpu else float('nan'):.2f} s; importing reactor.cli "
        f"{statistics.median(floors['import reactor.cli']):.2f} s, a bare interpreter "
        f"{statistics.median(floors['interpreter']):.2f} s"
    )
    return Result(
        met=met,
        headline=headline,
        table=table,
        figures={
            "ready_s": ready,
            "first_write_s": written,
            "cpu_to_ready_s": cpu,
            "interpreter_s": floors["interpreter"],
            "import_cli_s": floors["import reactor.cli"],
        },
        settings=settings,
        conditions=cond,
        notes=notes,
    )


async def _one_start(
    dsn: str, job_id: str, app: Conn, session: aiohttp.ClientSession
) -> tuple[float, float, float] | str:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTOR_")}
    env.update(
        {
            "DATABASE_URL": dsn,
            "REACTOR_HTTP_ADDR": f"127.0.0.1:{port}",
            "REACTOR_DASHBOARD_ADDR": "",
            "REACTOR_LOG_FORMAT": "json",
            "REACTOR_LOG_LEVEL": "warning",
        }
    )
    url = f"http://127.0.0.1:{port}/readyz"
    started = time.time()
    process = await anyio.open_process(
        [sys.executable, "-m", "reactor", "run"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ready_at: float | None = None
    ready_cpu: float | None = None
    written_at: float | None = None
    try:
        with anyio.move_on_after(TIMEOUT):
            while process.returncode is None and (ready_at is None or written_at is None):
                if ready_at is None:
                    try:
                        async with session.get(url) as response:
                            if response.status == 200:
                                ready_at = time.time()
                                ready_cpu = cpu_by_process([process.pid]).get(process.pid)
                    except (aiohttp.ClientError, OSError):
                        pass
                if written_at is None:
                    cur = await app.execute(WRITTEN, (job_id,))
                    row = await cur.fetchone()
                    written_at = None if row is None else float(row[0])
                await anyio.sleep(POLL)
    finally:
        if process.returncode is None:
            process.terminate()
        with anyio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
    if ready_at is None or written_at is None or ready_cpu is None:
        return f"a round did not see {'/readyz 200' if ready_at is None else 'the write'}"
    return ready_at - started, written_at - started, ready_cpu


async def _exec_to_exit(arguments: list[str], rounds: int) -> list[float]:
    took = []
    for _ in range(rounds):
        started = time.perf_counter()
        await anyio.run_process([sys.executable, *arguments], cwd=ROOT)
        took.append(time.perf_counter() - started)
    return took


def _spread(values: list[float]) -> list[str]:
    if not values:
        return ["-", "-", "-"]
    return [f"{v:.3f} s" for v in (min(values), statistics.median(values), max(values))]


def _free_port() -> int:
    # The kernel picks a port nobody holds; the reactor binds it a moment later.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
