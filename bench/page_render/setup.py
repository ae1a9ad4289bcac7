"""page_render's database: the history and the outbox loaded, the roles each side connects as,
and the replica's first records awaited."""

from __future__ import annotations

import time

import anyio

from bench.conn import Conn, connect, scalar
from bench.history import load_history
from bench.page_render.measure import ROLES
from bench.workload import APP
from reactor import db
from reactor.install import REFERENCE_INSTALL
from reactor.testing import RECENT_OUTCOMES

# The outbox, in one INSERT ... SELECT: the first rows parked as failed after their last
# attempt, then the open ones (pending, due), then the settled ones; two hooks per run, times
# spread over six days (inside the seven-day retention, so the purge finds nothing).
HOOK_ROWS = """
INSERT INTO reactor.hook_outbox
       (run_id, job_id, hook, status, attempts, last_error, available_at, created_at,
        updated_at)
SELECT md5('r' || (g + 1) / 2)::uuid, md5('j' || (g + 1) / 2)::uuid,
       CASE WHEN g %% 2 = 0 THEN 'judge' ELSE 'ops' END,
       CASE WHEN g <= %(failed)s THEN 'failed'
            WHEN g <= %(failed)s + %(pending)s THEN 'pending' ELSE 'done' END,
       CASE WHEN g <= %(failed)s THEN 40 WHEN g <= %(failed)s + %(pending)s THEN 0 ELSE 1 END,
       CASE WHEN g <= %(failed)s
            THEN 'HTTP 503 from https://hooks.example.com/judge: upstream unavailable' END,
       t, t, t + interval '2 seconds'
  FROM generate_series(1, %(rows)s) g,
       LATERAL (SELECT now() - (%(rows)s - g) * %(spread)s * interval '1 second' AS t) ts
"""


async def load(
    conn: Conn, total: int, window: int, hook_rows: int, failed: int, pending: int
) -> float:
    started = time.monotonic()
    await load_history(conn, total, window, past_triggers=True)
    # The jobs the replica records as it starts, through the triggers as any finished job.
    recent = APP.create(
        count=RECENT_OUTCOMES * 2,
        finished=True,
        document="<p>recent</p>",
        verdicts='{"verdicts": 2}',
    )
    await conn.execute(*recent)
    await conn.execute(
        HOOK_ROWS,
        {"rows": hook_rows, "failed": failed, "pending": pending, "spread": 6 * 86400 / hook_rows},
    )
    for table in ("analysis_jobs", "analysis_runs", "reactor.hook_outbox"):
        await conn.execute(f"VACUUM (FREEZE, ANALYZE) {table}")
    # The reconcile's first pass, as an install ends with: the page shows the last one.
    await db.Database.dedicated(REFERENCE_INSTALL, conn).reconcile_pass("install")
    return time.monotonic() - started


async def until_recorded(dsn: str, within: float = 60.0) -> None:
    async with await connect(dsn, "check") as conn:
        with anyio.fail_after(within):
            while await scalar(conn, "SELECT count(*) FROM reactor.pending"):  # noqa: ASYNC110
                await anyio.sleep(0.1)


async def drop_roles(admin_dsn: str) -> None:
    async with await connect(admin_dsn, "setup") as conn:
        for role in ROLES:
            await conn.execute(f"DROP ROLE IF EXISTS {role}")


async def create_roles(conn: Conn) -> None:
    """The roles the command, the report alone and the page connect as (pg_stat_statements
    counts by role)."""
    for role in ROLES:
        await conn.execute(
            f"DO $$ BEGIN CREATE ROLE {role} LOGIN SUPERUSER; "
            "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
