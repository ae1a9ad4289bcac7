"""trigger_overhead's second mapping (tests/mappings/second.sql and second.toml): its tables,
its scripts, and its listening replica, a ``reactor run`` process."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from bench.conn import connect, dbname, scalar
from bench.processes import reactor_env, stop
from bench.result import BENCH_DIR
from bench.server import Server
from bench.trigger_overhead.scripts import PROGRESS_JOBS
from reactor import db
from reactor.testing import mapping_file

# The second mapping's app: its tables, its mapping, and the same two scripts on them. Its ids
# are bigints: progress jobs 1..PROGRESS_JOBS, and client c's k-th job to finish SECOND_IDS *
# (c + 1) + k.
SECOND_DIR = BENCH_DIR.parent / "tests" / "mappings"
SECOND_JOBS = 'app."Job"'
SECOND_CHANNEL = "second_jobs_terminal"
SECOND_IDS = 1_000_000_000

SECOND_PROGRESS_SCRIPT = f"""\\set n random(1, {PROGRESS_JOBS})
UPDATE app."Job" SET "updatedAt" = now() AT TIME ZONE 'UTC' WHERE "jobId" = :n;
"""

SECOND_FINISH_SCRIPT = f"""\\set k :k + 1
UPDATE app."Job" SET state = 'done', verdicts = '{{"verdicts": 3}}',
       "updatedAt" = now() AT TIME ZONE 'UTC'
 WHERE "jobId" = {SECOND_IDS}::bigint * (:client_id + 1) + :k;
"""

SECOND_PROGRESS_JOBS = """
INSERT INTO app."Job" ("jobId", "reportKey", state, html, "ownerId")
SELECT g, 'r' || g, 'running', repeat('<p>citation</p>', 100), gen_random_uuid()
  FROM generate_series(1, %s) g
"""

SECOND_FINISHABLE_JOBS = f"""
INSERT INTO app."Job" ("jobId", "reportKey", state, html, "ownerId")
SELECT {SECOND_IDS}::bigint * (c + 1) + k, 'f' || c || '-' || k, 'running', '<p>short</p>',
       gen_random_uuid()
  FROM generate_series(0, %s - 1) c, generate_series(1, %s) k
"""

LISTENING = """
SELECT count(*) > 0 FROM pg_stat_activity
 WHERE datname = %s AND application_name = 'reactor-listener'
"""


async def second_database(server: Server) -> str:
    """A scratch database with the second mapping's tables and the reactor installed on them."""
    dsn = server.dsn_for(await server.create_database("triggers_second"))
    async with await connect(dsn, "setup") as conn:
        await conn.execute((SECOND_DIR / "second.sql").read_text())
        second = mapping_file.load(str(SECOND_DIR / "second.toml"))
        await db.migrate(conn, second, channel=SECOND_CHANNEL)
    return dsn


@asynccontextmanager
async def second_replica(dsn: str, within: float = 30.0) -> AsyncIterator[None]:
    """A `reactor run` process on the second mapping, LISTENing on entry, stopped on exit."""
    env = reactor_env(
        {
            "DATABASE_URL": dsn,
            "REACTOR_CONFIG": str(SECOND_DIR / "second.toml"),
            "REACTOR_CHANNEL": SECOND_CHANNEL,
            "REACTOR_GRACE_SECONDS": "3600",
            "REACTOR_SCAN_INTERVAL_SECONDS": "3600",
            "REACTOR_HTTP_ADDR": "",
            "REACTOR_DASHBOARD_ADDR": "",
            "REACTOR_LOG_LEVEL": "WARNING",
        }
    )
    with tempfile.TemporaryFile() as log:
        process = await anyio.open_process(
            [sys.executable, "-m", "reactor", "run"], env=env, stdout=log, stderr=log
        )
        try:
            async with await connect(dsn, "check") as conn:
                with anyio.fail_after(within):
                    while not await scalar(conn, LISTENING, (dbname(dsn),)):
                        if process.returncode is not None:
                            log.seek(0)
                            raise RuntimeError(f"reactor run exited: {log.read()[-2000:]!r}")
                        await anyio.sleep(0.2)
            yield
        finally:
            await stop(process, within_s=15)
