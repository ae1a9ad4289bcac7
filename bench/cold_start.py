"""cold_start: from exec to ready, and to the first write, for a `reactor run` process.

The server is up and migrated, as in the other benchmarks. Each round finishes one job two
hours ago (long past any grace), execs `python -m reactor run` and polls its /readyz every
5 ms until it answers 200; the first write is the run row's created_at (the record statement's
transaction start, by the database clock on this same host) minus the exec time. Then the
process gets SIGTERM and the next round starts. Beside them, the floors those times stand on:
exec to exit of an interpreter that does nothing, and of one that only imports reactor.cli.

Each round is run twice, one right after the other, so both see the same load:

- ``compiled``: every module's bytecode compiled before the rounds, as the image installs it
  (``UV_COMPILE_BYTECODE=1`` in the Dockerfile; pip compiles at install too). The cache is a
  directory of this run's (``PYTHONPYCACHEPREFIX``), filled by a round that is not counted, so
  the checkout is left as it was. The goal is judged on these rounds: they are the shipped
  process.
- ``source``: the checkout as it is, under ``PYTHONDONTWRITEBYTECODE=1``: ``uv sync`` compiles
  nothing unless asked, so the reactor and every dependency are compiled from source at each
  start (the interpreter's standard library has its own bytecode).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import anyio

from bench.conn import Conn, connect, scalar
from bench.processes import ROOT, cpu_by_process, free_port, start_reactor, stop
from bench.result import Context, Result, Table, conditions
from bench.server import open_server

TITLE = "Cold start: exec to /readyz 200 and to the first write of `reactor run`"
GOAL = (
    "exec -> /readyz 200 <= 1 s (median of the rounds, bytecode compiled ahead as the image "
    "installs it)"
)
READY_GOAL_S = 1.0

# The same benchmark on the commit before the start was cut (5306aae: jinja2 and rich loaded
# at start, the expression check's patterns compiled at import), in two runs alternating with
# two of the cut start's on this machine (2 CPUs, shared; load average 2.4-4.3), 2026-12-05.
BEFORE = (
    "Before the start was cut (commit 5306aae, this benchmark, two runs alternating with two of "
    "the cut start's; median [min-max] of 7 rounds each): exec -> /readyz 200 0.52 s "
    "[0.50-0.60] and 0.45 s [0.44-0.48] compiled, 1.08 s [1.02-1.13] and 0.95 s [0.94-1.00] "
    "with no bytecode; CPU until ready 0.43 s and 0.41 s compiled, 0.94 s and 0.90 s with none. "
    "The cut start in those runs: 0.47 s and 0.45 s compiled, 0.95 s and 0.88 s with none; "
    "CPU 0.37 s and 0.35 s, 0.78 s and 0.75 s."
)

TIMEOUT_S = 30.0
POLL_S = 0.005

FINISHED = """
INSERT INTO analysis_jobs (id, run_id, status, doc_html, results, created_at, updated_at)
VALUES (gen_random_uuid(), gen_random_uuid(), 'complete', '<p>cold</p>', '{"verdicts": 1}',
        now() - interval '3 hours', now() - interval '2 hours')
RETURNING id::text
"""

WRITTEN = "SELECT extract(epoch FROM created_at)::float8 FROM analysis_runs WHERE job_id = %s"

# What `reactor run` imports before it connects: the command line, the HTTP servers, the
# replica. Exec to ready less this is the start's own work (the checks, the servers, LISTEN).
RUN_IMPORTS = "import reactor.cli, reactor.ops.http, reactor.runtime.replica"

# The two ways a process finds its modules' bytecode (see the module's docstring).
COMPILED = "compiled"
SOURCE = "source"
MODES = (COMPILED, SOURCE)
MODE_LABEL = {
    COMPILED: "compiled ahead (the image)",
    SOURCE: "none (this checkout)",
}


def python_env(mode: str, cache: Path) -> dict[str, str]:
    """This process's environment without the reactor's settings, the bytecode set per
    ``mode``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("REACTOR_")
        and k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
    }
    if mode == COMPILED:
        env["PYTHONPYCACHEPREFIX"] = str(cache)
    else:
        # The checkout as it is: uv sync wrote no bytecode for the reactor or its dependencies
        # (the interpreter's standard library comes with its own), and none is written now.
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


async def run(ctx: Context) -> Result:
    """Start `reactor run` ``rounds`` times on a migrated database in each bytecode mode; time
    readiness and the write."""
    rounds = 2 if ctx.quick else 7
    settings: dict[str, Any] = {
        "rounds": rounds,
        "poll_s": POLL_S,
        "grace_s": 120.0,
        "modes": list(MODES),
    }
    ready: dict[str, list[float]] = {mode: [] for mode in MODES}
    written: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
    floors: dict[tuple[str, str], list[float]] = {}
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-bytecode-") as cache_dir:
        envs = {mode: python_env(mode, Path(cache_dir)) for mode in MODES}
        async with open_server() as server:
            cond = await conditions(server, quick=ctx.quick)
            dsn = await server.app_database("cold_start", with_audit=False)
            async with aiohttp.ClientSession() as session, await connect(dsn, "app") as app:
                # Not counted: it writes the compiled mode's cache of every module a run loads.
                await _one_start(dsn, await scalar(app, FINISHED), app, session, envs[COMPILED])
                for mode in MODES:
                    for label, arguments in (
                        ("interpreter", ["-c", "pass"]),
                        ("import reactor.cli", ["-c", "import reactor.cli"]),
                        ("import run", ["-c", RUN_IMPORTS]),
                    ):
                        floors[mode, label] = await _exec_to_exit(arguments, rounds, envs[mode])
                for _ in range(rounds):
                    for mode in MODES:
                        job_id = await scalar(app, FINISHED)
                        outcome = await _one_start(dsn, job_id, app, session, envs[mode])
                        if isinstance(outcome, str):
                            problems.append(f"{mode}: {outcome}")
                            continue
                        ready[mode].append(outcome[0])
                        written[mode].append(outcome[1])
                        cpu[mode].append(outcome[2])
    table = _table(ready, written, cpu, floors)
    median_ready = _median(ready[COMPILED])
    met = bool(ready[COMPILED]) and median_ready <= READY_GOAL_S and not problems
    notes = _notes(rounds, problems)
    headline = (
        f"exec -> /readyz 200 median {median_ready:.2f} s (goal <= {READY_GOAL_S:g} s), "
        f"exec -> first write median {_median(written[COMPILED]):.2f} s, CPU until ready "
        f"median {_median(cpu[COMPILED]):.2f} s, with bytecode compiled as the image has it; "
        "compiling the reactor and its dependencies at start "
        f"{_median(ready[SOURCE]):.2f} s to ready, CPU {_median(cpu[SOURCE]):.2f} s; "
        "importing reactor.cli "
        f"{_median(floors[COMPILED, 'import reactor.cli']):.2f} s "
        f"({_median(floors[SOURCE, 'import reactor.cli']):.2f} s uncompiled), everything run "
        f"imports {_median(floors[COMPILED, 'import run']):.2f} s "
        f"({_median(floors[SOURCE, 'import run']):.2f} s), a bare "
        f"interpreter {_median(floors[COMPILED, 'interpreter']):.2f} s"
    )
    return Result(
        met=met,
        headline=headline,
        table=table,
        figures=_figures(ready, written, cpu, floors),
        settings=settings,
        conditions=cond,
        notes=notes,
    )


def _table(
    ready: dict[str, list[float]],
    written: dict[str, list[float]],
    cpu: dict[str, list[float]],
    floors: dict[tuple[str, str], list[float]],
) -> Table:
    """Each mode's floors and starts: min, median and max."""
    table = Table(["bytecode", "from exec to", "min", "median", "max", "runs"])
    for mode in MODES:
        for label, values in (
            ("exit of `python -c pass`", floors[mode, "interpreter"]),
            ("exit of `python -c 'import reactor.cli'`", floors[mode, "import reactor.cli"]),
            ("exit of a process importing all `reactor run` does", floors[mode, "import run"]),
            ("/readyz 200 of `reactor run`", ready[mode]),
            ("first write of `reactor run` (run row's created_at)", written[mode]),
            ("CPU `reactor run` used until /readyz 200 (user + system)", cpu[mode]),
        ):
            table.add(MODE_LABEL[mode], label, *_spread(values), len(values))
    return table


def _notes(rounds: int, problems: list[str]) -> list[str]:
    """How the starts were timed, what the modes and the floors are, and any problem."""
    return [
        f"{rounds} rounds, one after the other, each a fresh process on the same migrated "
        "database with one finished job already past its grace; /readyz polled every "
        f"{POLL_S * 1000:g} ms from this process (the figure is at most that much late). Each "
        "round starts one process of each bytecode mode, back to back, so both see the same "
        "load; the goal is judged on the compiled one, which is how the image runs.",
        "Bytecode: compiled ahead, every module's cached bytecode read at start, as in the "
        "image (UV_COMPILE_BYTECODE=1) or after a pip install; or none, the reactor and its "
        "dependencies compiled from source at each start, as this checkout (installed by "
        "`uv sync`, which compiles nothing unless asked: `uv sync --compile-bytecode`) runs "
        "under PYTHONDONTWRITEBYTECODE=1. The compiled mode's cache is this run's own "
        "directory (PYTHONPYCACHEPREFIX), filled by one round that is not counted.",
        "Ready means the database answered a health check, the record statements can write, "
        "LISTEN is up and a probe notification sent from another session came back over it.",
        "The process's CPU until ready is read from /proc (10 ms ticks) when /readyz first "
        "answers 200: on a shared machine it moves less with the load than the wall times.",
        "The floors are exec to exit in the same run: an interpreter that does nothing, one "
        "that imports the command line module, and one that imports everything `reactor run` "
        "imports before it connects (the command line, the HTTP servers, the replica): exec "
        "to ready less the last is the start's own work (hooks parsed, ports bound, the "
        "start-up checks, the pool, LISTEN and its probe, the first health check).",
        BEFORE,
        *problems,
    ]


def _figures(
    ready: dict[str, list[float]],
    written: dict[str, list[float]],
    cpu: dict[str, list[float]],
    floors: dict[tuple[str, str], list[float]],
) -> dict[str, Any]:
    """Every timing, by mode."""
    figures: dict[str, Any] = {}
    for mode in MODES:
        suffix = "" if mode == COMPILED else "_source"
        figures |= {
            f"ready_s{suffix}": ready[mode],
            f"first_write_s{suffix}": written[mode],
            f"cpu_to_ready_s{suffix}": cpu[mode],
            f"interpreter_s{suffix}": floors[mode, "interpreter"],
            f"import_cli_s{suffix}": floors[mode, "import reactor.cli"],
            f"import_run_s{suffix}": floors[mode, "import run"],
        }
    return figures


async def _one_start(
    dsn: str, job_id: str, app: Conn, session: aiohttp.ClientSession, python: Mapping[str, str]
) -> tuple[float, float, float] | str:
    port = free_port()
    env = dict(python)
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
    process = await start_reactor(env)
    ready_at: float | None = None
    ready_cpu: float | None = None
    written_at: float | None = None
    try:
        with anyio.move_on_after(TIMEOUT_S):
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
                await anyio.sleep(POLL_S)
    finally:
        await stop(process, within_s=10)
    if ready_at is None or written_at is None or ready_cpu is None:
        return f"a round did not see {'/readyz 200' if ready_at is None else 'the write'}"
    return ready_at - started, written_at - started, ready_cpu


async def _exec_to_exit(arguments: list[str], rounds: int, env: Mapping[str, str]) -> list[float]:
    took = []
    for _ in range(rounds):
        started = time.perf_counter()
        await anyio.run_process([sys.executable, *arguments], cwd=ROOT, env=env)
        took.append(time.perf_counter() - started)
    return took


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _spread(values: list[float]) -> list[str]:
    if not values:
        return ["-", "-", "-"]
    return [f"{v:.3f} s" for v in (min(values), statistics.median(values), max(values))]
