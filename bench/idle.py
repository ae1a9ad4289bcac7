"""idle: statements per minute that one replica sends when there is no work at all.

Counted by the server, not by the client: pg_stat_statements is loaded (shared_preload_libraries)
and its calls are summed per database. Side by side, each in a database of its own, over the same
window after one reset of the counters: a reactor replica in each mode (the trigger notifying,
the default; the trigger installed not to notify, where the replica polls the queue) and the
article's sweep. The window is one reconcile interval, so the full pass the contract asks for in
every interval is in the count. The pool's connection checks (an empty query, which
pg_stat_statements does not see) are counted at the pool and added. Beside them, over the same
window, a `reactor run` process on a database of its own: its CPU, read from /proc, and its
statements.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
import anyio.abc
from psycopg_pool import AsyncConnectionPool

from bench import baseline
from bench.conn import Conn, connect, dbname
from bench.processes import cpu_by_process, free_port, reactor_env, start_reactor, stop
from bench.result import Context, Result, Table, conditions
from bench.server import Server, open_server, stat_statements_problem
from bench.stats import ratio, safe_div
from bench.workload import bench_settings, replicas, wait_for_first_scan
from reactor.testing import Settings

TITLE = "Idle cost: statements per minute from one replica with no work"
GOAL = (
    "<= 8 statements/min per replica at the default intervals, pool checks included; "
    "<= 2 ms of CPU per second for a `reactor run` process"
)
BUDGET = 8.0
CPU_BUDGET_MS = 2.0

BY_QUERY = """
SELECT s.query, sum(s.calls)::bigint
  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
 WHERE d.datname = %s
 GROUP BY s.query ORDER BY 2 DESC
"""

MODES = {
    "notify": "reactor replica, trigger notifying (default)",
    "quiet": "reactor replica, trigger not notifying (polls the queue)",
}


@contextmanager
def counting_pool_checks() -> Iterator[Counter[int]]:
    """Count the connection checks each pool runs (keyed by the pool's id)."""
    checks: Counter[int] = Counter()
    original = AsyncConnectionPool.check_connection

    async def check(conn: Any) -> None:
        checks[id(getattr(conn, "_pool", None))] += 1
        await original(conn)

    AsyncConnectionPool.check_connection = staticmethod(check)  # type: ignore[method-assign]
    try:
        yield checks
    finally:
        AsyncConnectionPool.check_connection = original  # type: ignore[method-assign]


async def run(ctx: Context) -> Result:
    """Run one replica per mode and one sweeper with nothing to do; count what reaches the
    server."""
    quick = ctx.quick
    defaults = Settings()
    interval = 2.0 if quick else defaults.scan_interval
    window = 6.0 if quick else defaults.reconcile_interval
    settings: dict[str, Any] = {
        "scan_interval_s": interval,
        "baseline_tick_s": interval,
        "window_s": window,
        "replicas_per_mode": 1,
        "probe_interval_s": defaults.probe_interval,
        "poll_interval_s": defaults.poll_interval,
        "reconcile_interval_s": defaults.reconcile_interval,
        "grace_s": defaults.grace,
    }
    async with open_server({"shared_preload_libraries": "pg_stat_statements"}) as server:
        cond = await conditions(server, quick=quick)
        if quick:
            cond["note"] = (
                f"--quick: scan interval and sweep tick shortened to {interval:g} s and the "
                f"window to {window:g} s; the probes and polls are not shortened"
            )
        available = await stat_statements_problem(server)
        if available is not None:
            return _unmeasured(cond, settings, available)
        databases = {
            "notify": await server.app_database("idle_notify", with_audit=False),
            "quiet": await server.app_database("idle_quiet", with_audit=False, notify=False),
            "sweep": await server.app_database("idle_sweep", with_audit=False),
            "process": await server.app_database("idle_process", with_audit=False),
        }
        window_found = await _measure(server, databases, interval, window, quick=quick)
    return _result(settings, cond, window_found)


@dataclass(frozen=True)
class Window:
    """What reached the server over the window: statements by sender and query, pool checks,
    scans, polls and sweeps, and the `reactor run` process's CPU seconds before and after."""

    elapsed: float
    cpu_before: float
    cpu_after: float
    counts: dict[str, dict[str, int]]
    pool_checks: dict[str, int]
    scans: dict[str, int]
    polls: dict[str, int]
    sweeps: int


async def _measure(
    server: Server, databases: dict[str, str], interval: float, window: float, *, quick: bool
) -> Window:
    """One replica per mode, the sweep and a `reactor run` process, each on its database; what
    reached the server over ``window`` seconds once they are past their start."""
    defaults = Settings()
    names = {who: dbname(dsn) for who, dsn in databases.items()}
    sweep = baseline.Sweep(databases["sweep"], grace=120, tick=interval, phase=0.0)
    with counting_pool_checks() as checks:
        async with AsyncExitStack() as stack:
            running = {
                mode: (
                    await stack.enter_async_context(
                        replicas(bench_settings(databases[mode], scan_interval=interval), 1)
                    )
                )[0]
                for mode in MODES
            }
            tg = await stack.enter_async_context(anyio.create_task_group())
            await tg.start(sweep.run)
            process = await stack.enter_async_context(_reactor_process(databases["process"]))
            await wait_for_first_scan(list(running.values()))
            # Past the start-up statements (a quick run only checks the plumbing).
            await anyio.sleep(1.0 if quick else 2 * defaults.probe_interval)
            async with await connect(server.admin_dsn, "count") as admin:
                await admin.execute("SELECT pg_stat_statements_reset()")
                checks.clear()
                scans_before = {mode: r.reactor.scans for mode, r in running.items()}
                sweeps_before = sweep.sweeps
                started = time.monotonic()
                cpu_before = cpu_by_process([process.pid])[process.pid]
                await anyio.sleep(window)
                cpu_after = cpu_by_process([process.pid]).get(process.pid, cpu_before)
                elapsed = time.monotonic() - started
                counts = {who: await _by_query(admin, name) for who, name in names.items()}
            pool_checks = {mode: checks[id(r.pool)] for mode, r in running.items()}
            scans = {mode: r.reactor.scans - scans_before[mode] for mode, r in running.items()}
            polls = {mode: r.reactor.polls for mode, r in running.items()}
            sweeps = sweep.sweeps - sweeps_before
            tg.cancel_scope.cancel()
    return Window(elapsed, cpu_before, cpu_after, counts, pool_checks, scans, polls, sweeps)


def _result(settings: dict[str, Any], cond: dict[str, Any], seen: Window) -> Result:
    """The replica's statements and CPU against the budgets and the sweep."""
    defaults = Settings()
    elapsed, counts, pool_checks = seen.elapsed, seen.counts, seen.pool_checks
    minutes = elapsed / 60
    cpu_ms_per_s = (seen.cpu_after - seen.cpu_before) * 1000 / elapsed
    per_min = {who: sum(found.values()) / minutes for who, found in counts.items()}
    total = {mode: per_min[mode] + pool_checks[mode] / minutes for mode in MODES}
    sweep_total = per_min["sweep"]
    met = total["notify"] <= BUDGET and cpu_ms_per_s <= CPU_BUDGET_MS
    # The health check is the statement that writes the heartbeat.
    checks_per_min = (
        sum(calls for query, calls in counts["notify"].items() if "reactor.replicas" in query)
        / minutes
    )
    rest_per_min = total["notify"] - checks_per_min
    table = _table(seen, per_min, total, sweep_total)
    notes = _notes(seen, cpu_ms_per_s, checks_per_min, rest_per_min, met=met)
    headline = (
        f"`reactor run` {cpu_ms_per_s:.2f} ms CPU/s (goal <= {CPU_BUDGET_MS:g}); "
        f"reactor {total['notify']:.2f} statements/min in all, pool checks included (goal <= "
        f"{BUDGET:g}), {checks_per_min:.2f} of them its health check; the sweep "
        f"{sweep_total:.2f}; without NOTIFY, polling every {defaults.poll_interval:g} s: "
        f"{total['quiet']:.0f}/min"
    )
    return Result(
        met=met,
        headline=headline,
        table=table,
        figures={
            "minutes": minutes,
            "per_min": per_min,
            "pool_checks_per_min": {mode: c / minutes for mode, c in pool_checks.items()},
            "total_per_min": total,
            "health_checks_per_min": checks_per_min,
            "process_cpu_ms_per_s": cpu_ms_per_s,
            "sweep_per_min": sweep_total,
            "by_query": {
                who: {q: c / minutes for q, c in found.items()} for who, found in counts.items()
            },
        },
        settings=settings,
        conditions=cond,
        notes=notes,
    )


def _table(
    seen: Window, per_min: dict[str, float], total: dict[str, float], sweep_total: float
) -> Table:
    """Each sender's statements per minute, against the sweep's."""
    minutes, pool_checks, scans, sweeps = (
        seen.elapsed / 60,
        seen.pool_checks,
        seen.scans,
        seen.sweeps,
    )
    table = Table(
        [
            "sender",
            "statements/min",
            "pool checks/min",
            "in all /min",
            "scans or sweeps/min",
            "vs sweep",
        ]
    )
    for mode, label in MODES.items():
        table.add(
            label,
            f"{per_min[mode]:.2f}",
            f"{pool_checks[mode] / minutes:.2f}",
            f"{total[mode]:.2f}",
            f"{scans[mode] / minutes:.2f}",
            ratio(safe_div(total[mode], sweep_total)),
        )
    table.add(
        "`reactor run` process, trigger notifying (CPU below)",
        f"{per_min['process']:.2f}", "-", f"{per_min['process']:.2f}", "-",
        ratio(safe_div(per_min["process"], per_min["sweep"])),
    )  # fmt: skip
    table.add(
        "article sweep", f"{sweep_total:.2f}", "-", f"{sweep_total:.2f}",
        f"{sweeps / minutes:.2f}", ratio(1.0),
    )  # fmt: skip
    return table


def _notes(
    seen: Window, cpu_ms_per_s: float, checks_per_min: float, rest_per_min: float, *, met: bool
) -> list[str]:
    """What each sender sent, the process's CPU, the polls, and what a missed budget is made of."""
    defaults = Settings()
    counts, minutes, elapsed, polls = seen.counts, seen.elapsed / 60, seen.elapsed, seen.polls
    notes = [
        f"What each sender's statements were, per minute: {_statements(counts, minutes)}.",
        "The default replica's one periodic statement is its health check, run on its LISTEN "
        "connection: the heartbeat, the liveness proof of that connection and, after a silent "
        "interval, the probe notification, in one round trip; once per probe interval, and "
        "every second one while the check finds nothing to change (nothing queued, no hook "
        "row open, the replicas and the trigger as before) and the grace leaves room. "
        "Periodic scans are skipped while that check sees nothing overdue; the hook retention "
        "runs only when the check sees expired rows; the reconcile's pass once per interval "
        "is one statement on an empty table.",
        f"CPU of the `reactor run` process over the window: {cpu_ms_per_s:.2f} ms per second "
        f"(goal <= {CPU_BUDGET_MS:g}), user plus system from /proc, in clock ticks of "
        f"{1000 / os.sysconf('SC_CLK_TCK'):g} ms: the figure is within "
        f"{1000 / os.sysconf('SC_CLK_TCK') / elapsed:.3f} ms/s.",
        f"In the no-NOTIFY mode the replica polls the queue every {defaults.poll_interval:g} s "
        f"({polls['quiet']} polls in all): the price of sparing the app's commits the "
        "NOTIFY, and of keeping the timers precise without it.",
    ]
    if not met:
        notes.append(
            f"Above a budget ({BUDGET:g}/min, {CPU_BUDGET_MS:g} ms CPU/s): the health check "
            f"is {checks_per_min:.2f}/min at the default {defaults.probe_interval:g} s probe "
            f"interval, and everything else came to {rest_per_min:.2f}/min (the statements "
            "above besides the check, and the pool checks). The CPU is wake-ups, not "
            "statements: measured apart with strace, an idle `reactor run` wakes about 14 times "
            "a second, 10 of them psycopg's notifies() waiting on the LISTEN socket in 100 ms "
            "slices and 4 the poll duty's turn on that connection (a no-op while notifications "
            "arrive); reading the socket with one wait until the next duty would leave the "
            "health check's few."
        )
    return notes


@asynccontextmanager
async def _reactor_process(dsn: str) -> AsyncIterator[anyio.abc.Process]:
    """A `reactor run` process at the default settings on ``dsn``, ready on entry; SIGTERM on
    the way out."""
    port = free_port()
    env = reactor_env(
        {
            "DATABASE_URL": dsn,
            "REACTOR_HTTP_ADDR": f"127.0.0.1:{port}",
            "REACTOR_DASHBOARD_ADDR": "",
            "REACTOR_LOG_LEVEL": "warning",
        }
    )
    process = await start_reactor(env)
    try:
        async with aiohttp.ClientSession() as session:
            with anyio.fail_after(60):
                while True:
                    try:
                        async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                            if response.status == 200:
                                break
                    except (aiohttp.ClientError, OSError):
                        pass
                    await anyio.sleep(0.05)
        yield process
    finally:
        await stop(process, within_s=30)


def _statements(counts: dict[str, dict[str, int]], minutes: float) -> str:
    parts = []
    for who, found in counts.items():
        top = sorted(found.items(), key=lambda item: -item[1])[:6]
        listed = "; ".join(f"{calls / minutes:.2f} x `{_short(query)}`" for query, calls in top)
        parts.append(f"{who}: {listed or 'none'}")
    return " - ".join(parts)


async def _by_query(conn: Conn, name: str) -> dict[str, int]:
    cur = await conn.execute(BY_QUERY, (name,))
    return {query: int(calls) for query, calls in await cur.fetchall()}


def _short(query: str) -> str:
    text = " ".join(query.split())
    return text if len(text) <= 60 else text[:57] + "..."


def _unmeasured(cond: dict[str, Any], settings: dict[str, Any], why: str) -> Result:
    return Result(
        met=None,
        headline=why,
        table=Table(["sender", "statements/min"], [["reactor replica", "-"], ["sweep", "-"]]),
        figures={},
        settings=settings,
        conditions=cond,
        notes=[why + "; run without DATABASE_URL to use the embedded server, which loads it."],
    )
