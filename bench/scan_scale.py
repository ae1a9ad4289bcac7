"""scan_scale: the fallback scan's cost with many finished jobs and nothing due.

The table holds many finished jobs; only the newest ones (the app's 24-hour window) still carry
``doc_html`` (the app trims it after that), and every finished job has its run except 100 that
are inside their grace window (they need a run but are not due). The reactor's scan
(``record_oldest``) and its health query, which every replica runs every probe interval, are
timed against the article's query on primary keys only (no partial index), and against the same
query on the partial index of the reactor's earlier design (``analysis_jobs_reactor_due_idx``,
built here for the measurement and dropped again). The window then shrinks the way the app's
trim shrinks it (``UPDATE ... SET doc_html = NULL`` and vacuum), and everything is timed again.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench import baseline
from bench.conn import Conn, connect, scalar, timed, total_sizes
from bench.history import load_history
from bench.plans import explain, plan_nodes
from bench.result import Context, Result, Table, conditions
from bench.server import open_server
from bench.stats import SLOW_S, ms, ratio, safe_div, size_text, slow_enough
from bench.workload import APP
from reactor import db
from reactor.install import REFERENCE_INSTALL
from reactor.testing import REFERENCE

TITLE = "Fallback scan cost with many finished jobs, nothing due"
GOAL = (
    "<= 5 ms and flat as the 24-hour window grows (the largest window within 2x, or 1 ms, of "
    "the smallest)"
)

# The partial index of the reactor's earlier design (migration 0004, dropped by 0006), built
# only to time the article's query on it.
DUE_INDEX = """
CREATE INDEX analysis_jobs_reactor_due_idx ON analysis_jobs (updated_at, id)
 WHERE status IN ('complete', 'failed') AND deleted_at IS NULL AND doc_html IS NOT NULL
   AND results IS NOT NULL AND results <> '{}'::jsonb
"""

GRACE_S = 3600.0  # the 100 pending jobs stay inside it for the whole measurement
PENDING = 100


async def run(ctx: Context) -> Result:
    """Load once at the largest window, then trim the window down step by step."""
    quick = ctx.quick
    total = 60_000 if quick else 10_000_000
    windows = [30_000, 8_400, 600] if quick else [5_000_000, 1_400_000, 100_000]
    reps = 7 if quick else 15
    settings: dict[str, Any] = {
        "finished_jobs": total,
        "windows": windows,
        "needing_a_run": PENDING,
        "grace_s": GRACE_S,
        "batch_size": 500,
        "repetitions": reps,
        "doc_html": "small (~40 bytes) inside the window, NULL outside",
    }
    measured: list[dict[str, Any]] = []
    async with open_server() as server:
        cond = await conditions(server, quick=quick)
        dsn = server.dsn_for(await server.create_database("scan"))
        async with await connect(dsn, "setup") as conn:
            # Bulk-loaded without indexes or triggers, then indexed as the migrations do.
            started = time.monotonic()
            await db.migrate(conn, REFERENCE, reference_schema=True)
            await load_history(conn, total, windows[0], past_triggers=True)
            await _finish_pending(conn)
            load_s = time.monotonic() - started
            sizes = await total_sizes(conn, ("analysis_jobs", "analysis_runs", "reactor.pending"))
            for window in windows:
                if window != windows[0]:
                    await _trim(conn, total, window)
                measured.append(await _measure(conn, window, reps))

    measured.sort(key=lambda m: m["window"])
    reactor_times = [m["record_oldest"] for m in measured]
    flat = reactor_times[-1] <= max(2 * reactor_times[0], reactor_times[0] + 0.001)
    met = max(reactor_times) <= 0.005 and flat
    table = _table(measured)
    growth = safe_div(reactor_times[-1], reactor_times[0])
    notes = _notes(total, load_s, sizes, reps, reactor_times, growth, measured)
    headline = (
        f"reactor scan {ms(reactor_times[0])} at {measured[0]['window']:,} to "
        f"{ms(reactor_times[-1])} at {measured[-1]['window']:,} jobs in the window; the "
        f"article's query on primary keys {ms(measured[0]['article_pk_only'])} to "
        f"{ms(measured[-1]['article_pk_only'])}"
    )
    return Result(
        met=met,
        headline=headline,
        table=table,
        figures={
            "windows": measured,
            "load_s": load_s,
            "sizes_bytes": sizes,
            "growth_largest_vs_smallest": growth,
        },
        settings=settings,
        conditions=cond,
        notes=notes,
    )


def _table(measured: list[dict[str, Any]]) -> Table:
    """The reactor's queries and the article's at each window."""
    table = Table(
        [
            "window (jobs with doc_html)",
            "reactor scan",
            "reactor health query",
            "article, PK only",
            "article, on the earlier design's partial index",
            "article PK only / reactor",
        ]
    )
    for m in measured:
        table.add(
            f"{m['window']:,}",
            ms(m["record_oldest"]),
            ms(m["health"]),
            ms(m["article_pk_only"]),
            ms(m["article_partial_index"]),
            ratio(safe_div(m["article_pk_only"], m["record_oldest"])),
        )
    return table


def _notes(
    total: int,
    load_s: float,
    sizes: dict[str, int],
    reps: int,
    reactor_times: list[float],
    growth: float,
    measured: list[dict[str, Any]],
) -> list[str]:
    """What was loaded, how the queries were timed, and what each one reads."""
    health = [m["health"] for m in measured]
    return [
        f"{total:,} finished jobs (every tenth failed), all with a run except {PENDING} inside "
        f"their grace; loading took {load_s:.0f} s. Sizes at the largest window: "
        + ", ".join(f"{k} {size_text(v)}" for k, v in sizes.items())
        + ".",
        f"Medians of {reps} runs after a warm-up; a query slower than {SLOW_S:g} s is run at "
        "least 3 times, as long as 3 s allows. Times are client-side wall clock for the whole "
        "statement, so they include one round trip and planning.",
        "The reactor scans its pending queue (reactor.pending: jobs that became eligible and "
        "have no run yet, fed by the trigger in the finishing transaction), not the window: "
        f"{ms(min(reactor_times))} to {ms(max(reactor_times))} across the windows "
        f"({ratio(growth)} from the smallest to the largest); its health query "
        f"{ms(min(health))} to {ms(max(health))}.",
        "The article's query must look at every finished job that still has its document: on "
        "primary keys only that is a sequential scan of analysis_jobs and an anti-join with "
        "analysis_runs; on the earlier design's partial index it walks the whole window, with "
        "nothing due, before it can say so.",
    ]


async def _finish_pending(conn: Conn) -> None:
    """The jobs that need a run: finished now, through the reactor's triggers."""
    cur = await conn.execute(*APP.create(count=PENDING, document="<p>pending</p>"))
    pending = [job for job, _ in await cur.fetchall()]
    await conn.execute(*APP.finish(*pending, verdicts='{"verdicts": 1}'))
    await conn.execute("VACUUM (FREEZE, ANALYZE) analysis_jobs")
    await conn.execute("VACUUM (FREEZE, ANALYZE) analysis_runs")
    await conn.execute("VACUUM ANALYZE reactor.pending")


async def _trim(conn: Conn, total: int, window: int) -> None:
    """The app's trim: documents older than the window's oldest job lose their doc_html."""
    await conn.execute(
        "UPDATE analysis_jobs SET doc_html = NULL WHERE doc_html IS NOT NULL "
        "AND updated_at < (SELECT updated_at FROM analysis_jobs WHERE id = md5('j' || %s)::uuid)",
        (total - window + 1,),
    )
    await conn.execute("VACUUM ANALYZE analysis_jobs")


async def _measure(conn: Conn, window: int, reps: int) -> dict[str, Any]:
    params: dict[str, Any] = {
        **db.health_params(REFERENCE_INSTALL, GRACE_S, db.HealthCheck("bench", 15.0, 86400.0)),
        "limit": 500,
        "hooks": [],
        "ids": [],
        "only": None,
        "skip": [],
        "max_bytes": db.BATCH_BYTES,
    }
    found = int(await scalar(conn, "SELECT count(*) FROM analysis_jobs WHERE doc_html IS NOT NULL"))
    result: dict[str, Any] = {"window": window, "jobs_with_doc": found}
    result["record_oldest"] = await _median(
        conn, REFERENCE_INSTALL.query("record_oldest"), params, reps
    )
    result["health"] = await _median(conn, REFERENCE_INSTALL.query("health"), params, reps)
    result["explain_record_oldest"] = await _explain(
        conn, REFERENCE_INSTALL.query("record_oldest"), params
    )
    article = {"grace": int(GRACE_S), "limit": 500}
    result["article_pk_only"] = await _median(conn, baseline.ARTICLE_QUERY, article, reps)
    await conn.execute(DUE_INDEX)
    await conn.execute("ANALYZE analysis_jobs")
    try:
        result["article_partial_index"] = await _median(conn, baseline.ARTICLE_QUERY, article, reps)
        result["explain_article_partial_index"] = await _explain(
            conn, baseline.ARTICLE_QUERY, article
        )
    finally:
        await conn.execute("DROP INDEX analysis_jobs_reactor_due_idx")
    return result


async def _median(conn: Conn, query: str, params: dict[str, Any], reps: int) -> float:
    """Median wall time; a slow query gets fewer runs (at least 3, its first one included)."""
    times = []
    for i in range(reps + 1):
        took, rows = await timed(conn, query, params)
        times.append(took)
        if i == 0:
            # The health query always answers one row; a scan must find nothing due.
            assert query == REFERENCE_INSTALL.query("health") or not rows, "due rows"
            if times[0] < SLOW_S:
                times.clear()  # a warm-up, not a sample
        if slow_enough(times):
            break
    return statistics.median(times)


async def _explain(conn: Conn, query: str, params: dict[str, Any]) -> dict[str, Any]:
    plan = await explain(conn, query, params)
    top = plan["Plan"]
    return {
        "execution_ms": plan.get("Execution Time"),
        "shared_hit": top.get("Shared Hit Blocks"),
        "shared_read": top.get("Shared Read Blocks"),
        "scans": sorted({shown for node in plan_nodes(top) if (shown := _scan(node))}),
    }


def _scan(node: dict[str, Any]) -> str:
    """A scan or join node, e.g. 'Seq Scan on analysis_runs', 'Hash Anti Join'; else ''."""
    kind = node.get("Node Type", "")
    if "Scan" in kind and "Relation Name" in node:
        return f"{kind} on {node['Relation Name']}"
    if "Join" in kind or kind in ("Nested Loop", "Hash Join", "Merge Join"):
        return f"{kind} ({node.get('Join Type', '')})"
    return ""
