"""What page_render times: `reactor status` as the command runs it, the report alone, the page
and its API through the reactor's own handlers (timed inside the server), many tabs at once,
and the render alone; with what each costs the database, by role."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import anyio
import psycopg.conninfo
from aiohttp import web

from bench.conn import Conn, connect, dbname
from bench.stats import ms, safe_div
from reactor import cli, db, status
from reactor.install import REFERENCE_INSTALL
from reactor.testing import dashboard

BUDGET_S = 0.050

# The roles the command, the report alone and the page connect as: pg_stat_statements keys its
# counts by role.
STATUS_ROLE = "bench_status"
REPORT_ROLE = "bench_report"
PAGE_ROLE = "bench_page"
ROLES = (STATUS_ROLE, REPORT_ROLE, PAGE_ROLE)
TABS = 10
SIZED = ("analysis_jobs", "analysis_runs", "reactor.hook_outbox")

BY_ROLE = """
SELECT s.query, sum(s.calls)::bigint,
       sum(s.total_exec_time + s.total_plan_time)::float8,
       sum(s.shared_blks_hit + s.shared_blks_read)::bigint
  FROM pg_stat_statements s
  JOIN pg_database d ON d.oid = s.dbid
  JOIN pg_roles r ON r.oid = s.userid
 WHERE d.datname = %s AND r.rolname = %s
 GROUP BY s.query
"""


class TimedDashboard(dashboard.Dashboard):
    """The reactor's page, unchanged, with each GET handler timed inside the server."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handled: dict[str, float] = {}  # path -> seconds, of the latest request

    async def page(self, request: web.Request) -> web.Response:
        """``GET /``, timed."""
        started = time.perf_counter()
        response = await super().page(request)
        self.handled["/"] = time.perf_counter() - started
        return response

    async def api_status(self, request: web.Request) -> web.Response:
        """``GET /api/status``, timed."""
        started = time.perf_counter()
        response = await super().api_status(request)
        self.handled["/api/status"] = time.perf_counter() - started
        return response


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """``values`` in os.environ for the block (the command reads its settings there)."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


async def _status_command(status_dsn: str) -> float:
    """``reactor status --json`` as the command runs it; its seconds."""
    args = argparse.Namespace(json=True)
    with _environment(DATABASE_URL=status_dsn), contextlib.redirect_stdout(io.StringIO()):
        started = time.perf_counter()
        await cli.cmd_status(args)
        return time.perf_counter() - started


async def get(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as response:
        assert response.status == 200, (url, response.status)
        return await response.text()


async def _timed_get(
    page: TimedDashboard, session: aiohttp.ClientSession, base: str, path: str
) -> tuple[float, float]:
    """(server, round trip) seconds of one GET."""
    started = time.perf_counter()
    await get(session, base + path)
    return page.handled[path], time.perf_counter() - started


async def measure_turns(
    admin_dsn: str,
    dsn: str,
    status_dsn: str,
    page: TimedDashboard,
    session: aiohttp.ClientSession,
    base: str,
    turns: int,
) -> dict[str, Any]:
    """The command and the page, turn by turn, with the database's side of each."""
    times: dict[str, list[float]] = {}

    def note(key: str, seconds: float) -> None:
        times.setdefault(key, []).append(seconds)

    # A warm-up of each, outside the counts.
    await _status_command(status_dsn)
    for path in ("/", "/api/status"):
        page.source.invalidate()
        await get(session, base + path)
    report_dsn = psycopg.conninfo.make_conninfo(dsn, user=REPORT_ROLE)
    async with (
        await connect(admin_dsn, "count") as admin,
        await db.connect(report_dsn, "status", configure_session=False) as conn,
    ):
        status.as_json(await status.collect(conn, REFERENCE_INSTALL, page.settings))  # its warm-up
        await admin.execute("SELECT pg_stat_statements_reset()")
        collections = page.source.collections
        for _ in range(turns):
            note("status command", await _status_command(status_dsn))
            started = time.perf_counter()
            status.as_json(await status.collect(conn, REFERENCE_INSTALL, page.settings))
            note("status collect", time.perf_counter() - started)
            for path, label in (("/", "page"), ("/api/status", "api")):
                page.source.invalidate()
                server, client = await _timed_get(page, session, base, path)
                note(f"{label} cold, server", server)
                note(f"{label} cold, client", client)
                server, client = await _timed_get(page, session, base, path)
                note(f"{label} warm, server", server)
                note(f"{label} warm, client", client)
        collections = page.source.collections - collections
        status_found = await by_role(admin, dbname(dsn), STATUS_ROLE)
        report_found = await by_role(admin, dbname(dsn), REPORT_ROLE)
        page_found = await by_role(admin, dbname(dsn), PAGE_ROLE)
    return {
        "times": times,
        "collections": collections,
        "cost": {
            "status": per_run(status_found, turns),
            "report": per_run(report_found, turns),
            "page": per_run(page_found, collections),
        },
    }


async def measure_tabs(
    admin_dsn: str, dsn: str, page: TimedDashboard, session: aiohttp.ClientSession, base: str
) -> dict[str, Any]:
    """Many tabs on an expired report, then requests inside its lifetime."""
    async with await connect(admin_dsn, "count") as admin:
        await admin.execute("SELECT pg_stat_statements_reset()")
        page.source.invalidate()
        collections = page.source.collections
        slowest = 0.0

        async def tab() -> None:
            nonlocal slowest
            started = time.perf_counter()
            await get(session, base + "/")
            slowest = max(slowest, time.perf_counter() - started)

        async with anyio.create_task_group() as tg:
            for _ in range(TABS):
                tg.start_soon(tab)
        collections = page.source.collections - collections
        found = per_run(await by_role(admin, dbname(dsn), PAGE_ROLE), 1)
        await admin.execute("SELECT pg_stat_statements_reset()")
        warm = 0
        with anyio.move_on_after(dashboard.REPORT_TTL_S / 2):
            while warm < 2 * TABS:
                await get(session, base + ("/" if warm % 2 else "/api/status"))
                warm += 1
        warm_found = await by_role(admin, dbname(dsn), PAGE_ROLE)
        warm_calls = sum(calls for calls, _, _ in warm_found.values())
    return {
        "collections": collections,
        "calls": found["calls"],
        "db_s": found["db_s"],
        "slowest_s": slowest,
        "warm_requests": warm,
        "warm_calls": warm_calls,
    }


async def measure_render(page: TimedDashboard, reps: int) -> float:
    """Median seconds of render_page on the report already fetched, signed in."""
    snapshot, body = await page.document()
    session = page.auth.issue()
    times = []
    for _ in range(reps + 1):
        started = time.perf_counter()
        dashboard.render_page(
            snapshot,
            body["replica"],
            actions="yes",
            form_token=page.auth.form_token(session),
            note=None,
            now=page.source.clock(),
        )
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


Found = dict[str, tuple[int, float, int]]  # query -> (calls, seconds, buffers)


async def by_role(conn: Conn, database: str, role: str) -> Found:
    cur = await conn.execute(BY_ROLE, (database, role))
    return {
        query: (int(calls), float(total_ms) / 1000, int(buffers))
        for query, calls, total_ms, buffers in await cur.fetchall()
    }


def per_run(found: Found, runs: int) -> dict[str, Any]:
    return {
        "calls": safe_div(sum(c for c, _, _ in found.values()), runs),
        "db_s": safe_div(sum(s for _, s, _ in found.values()), runs),
        "buffers": safe_div(sum(b for _, _, b in found.values()), runs),
        "statements": sorted(
            (
                {
                    "query": _short(query),
                    "calls": safe_div(calls, runs),
                    "db_s": safe_div(seconds, runs),
                    "buffers": safe_div(buffers, runs),
                }
                for query, (calls, seconds, buffers) in found.items()
            ),
            key=lambda s: -s["db_s"],
        ),
    }


def breakdown(cost: dict[str, Any]) -> str:
    return "; ".join(
        f"{s['calls']:.0f} x `{s['query']}` {ms(s['db_s'])}, {s['buffers']:.0f} buffers"
        for s in cost["statements"]
    )


def _short(query: str) -> str:
    text = " ".join(query.split())
    return text if len(text) <= 60 else text[:57] + "..."
