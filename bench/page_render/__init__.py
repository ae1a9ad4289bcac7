"""page_render: the operator's page and ``reactor status`` on a database with history.

The database holds 1,000,000 finished jobs, each with its run (the newest 14% still carry
doc_html), and 100,000 hook outbox rows: mostly done, some pending, some parked as failed. One
reactor replica runs on it with nothing due; it recorded the last jobs that finished, so its
lateness chart and its list of recent outcomes are filled. The page is served by the reactor's
own aiohttp application (``http.serving_page``) on loopback and fetched by real HTTP GETs,
signed in, so that every action button is drawn.

In one run, turn by turn: ``reactor status --json`` as the command runs it (``cli.cmd_status``:
its connection, its checks, the report, the JSON), the page and ``/api/status`` with the report
collected inside the request (the cache emptied before each), and both again served from the
cached report. Each handler is timed inside the server, end to end; the client's round trip is
timed too; the render alone is timed in-process on the report already fetched.

The database's side is counted by the server: pg_stat_statements, with planning tracked. The
command and the page connect as roles of their own, so their statements are told apart from
each other and from the replica's, and each is divided by how many times it ran (a command, a
collection of the page's report).
"""

from __future__ import annotations

import secrets
from typing import Any

import aiohttp
import psycopg.conninfo

from bench.conn import connect, total_sizes
from bench.page_render.measure import (
    PAGE_ROLE,
    SIZED,
    STATUS_ROLE,
    TABS,
    TimedDashboard,
    get,
    measure_render,
    measure_tabs,
    measure_turns,
)
from bench.page_render.report import Findings, result_of
from bench.page_render.setup import create_roles, drop_roles, load, until_recorded
from bench.result import Context, Result, conditions
from bench.server import open_counting_server
from bench.workload import bench_settings, replicas, wait_for_first_scan
from reactor import db
from reactor.install import REFERENCE_INSTALL
from reactor.testing import Settings, dashboard, http

TITLE = "The operator's page with 1M finished jobs and 100k hook rows, beside `reactor status`"
GOAL = (
    "the page renders in <= 50 ms server time with 1M finished jobs and 100k hook rows "
    "(same run as `status`), and costs the database no more than one `status`"
)


async def run(ctx: Context) -> Result:
    """Load the history and the outbox, run a replica and its page, then measure in turns."""
    quick = ctx.quick
    total = 40_000 if quick else 1_000_000
    window = total * 14 // 100
    hook_rows = 2_000 if quick else 100_000
    failed, pending = hook_rows // 100, hook_rows * 4 // 100
    turns = 5 if quick else 50
    settings: dict[str, Any] = {
        "finished_jobs": total,
        "window": window,
        "hook_rows": hook_rows,
        "hook_rows_failed": failed,
        "hook_rows_pending": pending,
        "hook_rows_done": hook_rows - failed - pending,
        "turns": turns,
        "tabs_at_once": TABS,
        "report_ttl_s": dashboard.REPORT_TTL_S,
    }
    track = {"pg_stat_statements.track_planning": "on"}
    async with open_counting_server(track) as (server, problem):
        cond = await conditions(server, quick=quick)
        if problem is not None:
            raise RuntimeError(problem)
        dsn = await server.app_database("page", with_audit=False)
        async with await connect(dsn, "setup") as conn:
            load_s = await load(conn, total, window, hook_rows, failed, pending)
            sizes = await total_sizes(conn, SIZED)
            await create_roles(conn)
        measured = await _measure(server.admin_dsn, dsn, turns)
        await drop_roles(server.admin_dsn)
    found = Findings(total, window, hook_rows, failed, pending, turns, load_s, sizes, **measured)
    return result_of(found, settings=settings, conditions=cond)


async def _measure(admin_dsn: str, dsn: str, turns: int) -> dict[str, Any]:
    """A replica and its page on ``dsn``, measured in ``turns`` turns, then with many tabs, then
    the render alone."""
    status_dsn = psycopg.conninfo.make_conninfo(dsn, user=STATUS_ROLE)
    page_dsn = psycopg.conninfo.make_conninfo(dsn, user=PAGE_ROLE)
    token = secrets.token_urlsafe(24)
    page_settings = Settings(database_url=page_dsn, http_addr=None, dashboard_token=token)
    async with (
        replicas(bench_settings(dsn, grace=1.0, scan_interval=3600.0), 1) as running,
        db.make_pool(page_dsn, max_size=2) as pool,
    ):
        await wait_for_first_scan(running)
        await until_recorded(dsn)
        reactor = running[0].reactor
        page = TimedDashboard(
            page_settings, db.Database.pooled(REFERENCE_INSTALL, pool), lambda: reactor
        )
        signed_in = {"Cookie": f"{dashboard.COOKIE}={page.auth.issue()}"}
        async with (
            http.serving_page(page, ("127.0.0.1", 0)) as bound,
            aiohttp.ClientSession(headers=signed_in) as session,
        ):
            assert bound is not None
            base = f"http://{bound[0]}:{bound[1]}"
            turns_found = await measure_turns(
                admin_dsn, dsn, status_dsn, page, session, base, turns
            )
            tabs = await measure_tabs(admin_dsn, dsn, page, session, base)
            render = await measure_render(page, turns)
            html = await get(session, base + "/")
            if "sign out" not in html:
                raise RuntimeError("the page was not served signed in")
            html_bytes = len(html)
    return {
        "turns_found": turns_found,
        "tabs": tabs,
        "render": render,
        "html_bytes": html_bytes,
    }
