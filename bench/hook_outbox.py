"""hook_outbox: the hook runner's periodic queries with millions of settled rows in the outbox.

Every replica runs the health query every probe interval and the hook claim whenever it looks
for work; ``reactor status`` and the retention job run on their own schedules. Settled rows
(done, superseded, cancelled) stay for the retention window (7 days by default), so a busy app
keeps millions of them. Each query is timed on an empty outbox and on one holding 5,000,000
done rows (a week of two hooks at about 4 runs a second, none yet past the retention), with
nothing pending in either: the steady state of an idle runner. For scale, the health query is
also timed as it ran before migration 0009, without the partial index of parked rows. The
buffers each query touches, from EXPLAIN (ANALYZE, BUFFERS), are recorded too: unlike times,
they do not depend on how busy the machine is. Last, the retention job's delete is timed on
rows past the retention.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.conn import Conn, connect, scalar, timed
from bench.plans import explain, plan_nodes
from bench.result import Context, Result, Table, conditions
from bench.server import open_server
from bench.stats import ms, ratio, safe_div, size_text, slow_enough
from reactor import db
from reactor.install import REFERENCE_INSTALL

TITLE = "Hook outbox: periodic queries with 5M settled rows against an empty outbox"
GOAL = (
    "the health query and the hook claim with 5,000,000 done rows within 2x (or 1 ms) of an "
    "empty outbox"
)

RETENTION_S = 7 * 86400.0
BATCH = 1000

# One INSERT ... SELECT: two hooks per run, updated_at spread over the retention window so that
# nothing is due for deletion yet. Ids are sequential, which keeps the primary key's inserts
# cheap; the queries under test never look at them.
LOAD = """
INSERT INTO reactor.hook_outbox
       (run_id, job_id, hook, status, attempts, available_at, created_at, updated_at)
SELECT ('00000000-0000-4000-8000-' || lpad(to_hex((g + 1) / 2), 12, '0'))::uuid,
       ('00000000-0000-4000-9000-' || lpad(to_hex((g + 1) / 2), 12, '0'))::uuid,
       CASE WHEN g %% 2 = 0 THEN 'judge' ELSE 'ops' END,
       'done', 1, t, t, t + interval '2 seconds'
  FROM generate_series(1, %(rows)s) g,
       LATERAL (SELECT now() - (%(rows)s - g) * %(spread)s * interval '1 second' AS t) ts
"""

# (label, file, query name): every statement a replica or an operator runs on a schedule.
QUERIES: tuple[tuple[str, str, str], ...] = (
    ("health query (every probe interval, every replica)", "queries.sql", "health"),
    ("hook claim, nothing due", "queries.sql", "claim_hooks"),
    ("next hook due", "queries.sql", "next_hook_in"),
    ("reactor status: hooks", "status.sql", "status_hooks"),
    ("reactor hooks list", "hooks.sql", "list_hooks"),
    ("retention, nothing expired", "hooks.sql", "purge_hooks"),
)

PARAMS: dict[str, Any] = {
    **db.health_params(REFERENCE_INSTALL, 120.0, db.HealthCheck("bench", 15.0, RETENTION_S)),
    "hooks": ["judge", "ops"],
    "limit": 4,
    "lease": 150.0,
    "max_attempts": 40,
    "batch": BATCH,
    "failed_only": False,
}


async def run(ctx: Context) -> Result:
    """Time every periodic query on an empty outbox, load the settled rows, time them again."""
    quick = ctx.quick
    rows = 50_000 if quick else 5_000_000
    reps = 7 if quick else 25
    expired = 2_000 if quick else 10_000
    settings: dict[str, Any] = {
        "done_rows": rows,
        "hooks": PARAMS["hooks"],
        "retention_s": RETENTION_S,
        "purge_batch": BATCH,
        "repetitions": reps,
        "expired_rows_purged": expired,
    }
    async with open_server() as server:
        cond = await conditions(server, quick=quick)
        empty_dsn = await server.app_database("hooks_empty", with_audit=False)
        full_dsn = await server.app_database("hooks_full", with_audit=False)
        async with (
            await connect(empty_dsn, "empty") as empty_conn,
            await connect(full_dsn, "full") as conn,
        ):
            await empty_conn.execute("VACUUM ANALYZE reactor.hook_outbox")
            started = time.monotonic()
            await conn.execute(LOAD, {"rows": rows, "spread": RETENTION_S * 0.95 / rows})
            load_s = time.monotonic() - started
            started = time.monotonic()
            await conn.execute("VACUUM (FREEZE, ANALYZE) reactor.hook_outbox")
            vacuum_s = time.monotonic() - started
            count = int(await scalar(conn, "SELECT count(*) FROM reactor.hook_outbox"))
            sizes = await _sizes(conn)
            empty, full = await _measure(empty_conn, conn, reps)
            before = await _before_0009(empty_conn, conn, reps)
            purge = await _purge(conn, expired)
    table = _table(empty, full, before, count)

    def flat(label: str) -> bool:
        before, after = empty[label]["median_s"], full[label]["median_s"]
        return bool(after <= max(2 * before, before + 0.001))

    health, claim = QUERIES[0][0], QUERIES[1][0]
    met = flat(health) and flat(claim)
    headline = (
        f"with {count:,} done rows the health query takes {ms(full[health]['median_s'])} "
        f"against {ms(empty[health]['median_s'])} empty "
        f"({ratio(safe_div(full[health]['median_s'], empty[health]['median_s']))}), the claim "
        f"{ms(full[claim]['median_s'])} against {ms(empty[claim]['median_s'])} "
        f"({ratio(safe_div(full[claim]['median_s'], empty[claim]['median_s']))})"
    )
    notes = _notes(count, load_s, vacuum_s, sizes, reps, full, expired, purge)
    return Result(
        met=met,
        headline=headline,
        table=table,
        figures={
            "empty": empty,
            "full": full,
            "rows": count,
            "load_s": load_s,
            "vacuum_s": vacuum_s,
            "sizes_bytes": sizes,
            "purge": purge,
            "health_before_0009": before,
        },
        settings=settings,
        conditions=cond,
        notes=notes,
    )


def _table(
    empty: dict[str, dict[str, Any]],
    full: dict[str, dict[str, Any]],
    before: dict[str, float],
    count: int,
) -> Table:
    """Each query on the empty outbox and on the loaded one."""
    table = Table(
        [
            "query",
            "empty outbox",
            f"{count:,} done rows",
            "ratio",
            "buffers, empty",
            f"buffers, {count:,} rows",
        ]
    )
    for label, *_ in QUERIES:
        table.add(
            label,
            ms(empty[label]["median_s"]),
            ms(full[label]["median_s"]),
            ratio(safe_div(full[label]["median_s"], empty[label]["median_s"])),
            empty[label]["buffers"],
            full[label]["buffers"],
        )

    table.add(
        BEFORE,
        ms(before["empty_s"]),
        ms(before["full_s"]),
        ratio(safe_div(before["full_s"], before["empty_s"])),
        "",
        "",
    )
    return table


def _notes(
    count: int,
    load_s: float,
    vacuum_s: float,
    sizes: dict[str, int],
    reps: int,
    full: dict[str, dict[str, Any]],
    expired: int,
    purge: dict[str, float],
) -> list[str]:
    """How the outbox was loaded and the queries timed, their plans, and the purge."""
    return [
        f"{count:,} done rows loaded by one INSERT ... SELECT generate_series in {load_s:.0f} s, "
        f"then VACUUM (FREEZE, ANALYZE) in {vacuum_s:.0f} s. Sizes: "
        + ", ".join(f"{k} {size_text(v)}" for k, v in sizes.items())
        + ".",
        f"Two databases on one server, one empty, one loaded; each query was run on both in "
        f"turn, {reps} times after a warm-up, and the medians compared. Times are client-side "
        "wall clock for the whole statement (one round trip and planning included). Buffers: "
        "shared blocks hit plus read, from EXPLAIN (ANALYZE, BUFFERS) of the same statement.",
        "Each query reads a partial index of the rows it is about (open, parked or settled), "
        "never the settled rows' heap: plans "
        + "; ".join(f"{label}: {', '.join(full[label]['scans'])}" for label, *_ in QUERIES)
        + ".",
        f"Retention: {expired:,} rows aged past the retention were deleted in batches of "
        f"{BATCH:,} (one statement each, locking its rows SKIP LOCKED): median "
        f"{ms(purge['median_batch_s'])} per batch, {ms(purge['total_s'])} in all.",
    ]


async def _measure(
    empty_conn: Conn, full_conn: Conn, reps: int
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Each query on both outboxes, alternating run by run so that a busy spell of the shared
    machine weighs on both sides alike; medians after a warm-up of each."""
    empty: dict[str, dict[str, Any]] = {}
    full: dict[str, dict[str, Any]] = {}
    for label, filename, name in QUERIES:
        query = REFERENCE_INSTALL.query(name, filename)
        times: dict[int, list[float]] = {0: [], 1: []}
        conns = (empty_conn, full_conn)
        for i in range(reps + 1):
            for side, conn in enumerate(conns):
                took = await _timed(conn, query)
                if i > 0:  # the first round warms both up
                    times[side].append(took)
            if i > 0 and slow_enough(times[1]):
                break  # a slow query gets fewer runs
        for side, found in enumerate((empty, full)):
            found[label] = {
                "median_s": statistics.median(times[side]),
                "runs": len(times[side]),
                **await _explain(conns[side], query),
            }
    return empty, full


BEFORE = "health query as before migration 0009 (no parked-rows index)"


async def _before_0009(empty_conn: Conn, full_conn: Conn, reps: int) -> dict[str, float]:
    """The health query without hook_outbox_failed_idx, dropped in a transaction rolled back."""
    query = REFERENCE_INSTALL.query("health")
    found = {}
    for key, conn in (("empty_s", empty_conn), ("full_s", full_conn)):
        async with conn.transaction(force_rollback=True):
            await conn.execute("DROP INDEX reactor.hook_outbox_failed_idx")
            await _timed(conn, query)  # warm-up
            times: list[float] = []
            while len(times) < reps and not slow_enough(times):
                times.append(await _timed(conn, query))
        found[key] = statistics.median(times)
    return found


async def _timed(conn: Conn, query: str) -> float:
    took, _ = await timed(conn, query, PARAMS)
    return took


async def _explain(conn: Conn, query: str) -> dict[str, Any]:
    # EXPLAIN ANALYZE runs the statement: the claim and the purge change nothing here (nothing
    # is due, nothing has expired), so it leaves the outbox as it was.
    plan = await explain(conn, query, PARAMS)
    top = plan["Plan"]
    return {
        "buffers": int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0)),
        "execution_ms": plan.get("Execution Time"),
        "scans": sorted({_scan(node) for node in plan_nodes(top) if _is_outbox(node)}),
    }


def _is_outbox(node: dict[str, Any]) -> bool:
    return node.get("Relation Name") == "hook_outbox"


def _scan(node: dict[str, Any]) -> str:
    """A scan of the outbox, e.g. 'Index Only Scan using hook_outbox_open_idx'."""
    index = node.get("Index Name")
    return f"{node['Node Type']}" + (f" using {index}" if index else "")


async def _purge(conn: Conn, expired: int) -> dict[str, Any]:
    """Age the oldest rows past the retention, then delete them batch by batch, timed."""
    await conn.execute(
        "UPDATE reactor.hook_outbox SET updated_at = updated_at - interval '8 days' WHERE id <= %s",
        (expired,),
    )
    await conn.execute("VACUUM ANALYZE reactor.hook_outbox")
    query = REFERENCE_INSTALL.query("purge_hooks", "hooks.sql")
    batches: list[float] = []
    deleted_total = 0
    while True:
        started = time.perf_counter()
        cur = await conn.execute(query, PARAMS)
        row = await cur.fetchone()
        batches.append(time.perf_counter() - started)
        assert row is not None
        deleted_total += int(row[0])
        if row[0] < BATCH:
            break
    assert deleted_total == expired, (deleted_total, expired)
    return {
        "deleted": deleted_total,
        "batches": len(batches),
        "median_batch_s": statistics.median(batches),
        "total_s": sum(batches),
    }


async def _sizes(conn: Conn) -> dict[str, int]:
    names = (
        "reactor.hook_outbox",
        "reactor.hook_outbox_pkey",
        "reactor.hook_outbox_id_idx",
        "reactor.hook_outbox_open_idx",
        "reactor.hook_outbox_failed_idx",
        "reactor.hook_outbox_settled_idx",
    )
    found = {}
    for name in names:
        size_of = "pg_total_relation_size" if name == "reactor.hook_outbox" else "pg_relation_size"
        found[name.removeprefix("reactor.")] = int(
            await scalar(conn, f"SELECT {size_of}(%s::regclass)", (name,))
        )
    return found
