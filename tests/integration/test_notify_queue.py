"""A full NOTIFY queue never fails the app's commit: the trigger queues the job and stays quiet.

Another session LISTENs and then sits idle in a transaction, as a stuck client does, so the
server cannot free the NOTIFY queue. On a server with a small queue (PostgreSQL 17 added
``max_notify_queue_pages``), every job-finishing commit must still succeed, the reactor must say
the queue is filling, and every run must be recorded all the same.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import psycopg
import pytest

from reactor import db
from reactor.demo.embedded import EmbeddedPostgres
from reactor.install import REFERENCE_INSTALL, sql
from reactor.install.mapping import REFERENCE
from reactor.runtime.replica import open_replica
from reactor.settings.config import Settings
from reactor.settings.pairs import Pair
from tests.faults.support import judge
from tests.helpers import AUDIT_SQL, Conn
from tests.polling import eventually

pytestmark = pytest.mark.anyio

CHANNEL = "analysis_jobs_terminal"
GRACE = 0.3
JOBS = 8000


@pytest.fixture(scope="module")
def small_queue_server() -> Iterator[EmbeddedPostgres]:
    bin_dir = os.environ.get("REACTOR_TEST_PG_BIN")
    pg = EmbeddedPostgres(
        bin_dir=Path(bin_dir) if bin_dir else None,
        settings={"max_notify_queue_pages": "64"},
        trust_localhost=True,
    )
    if int(pg.version.split(".")[0]) < 17:
        pytest.skip("the NOTIFY queue size is settable from PostgreSQL 17 on")
    pg.start()
    try:
        yield pg
    finally:
        pg.cleanup()


async def test_a_stuck_listener_fails_no_commit_and_loses_nothing(
    small_queue_server: EmbeddedPostgres,
) -> None:
    dsn = small_queue_server.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.read("reference.sql") + AUDIT_SQL)
    async with await db.connect(dsn, "test") as aconn:
        await db.migrate(aconn, REFERENCE, channel=CHANNEL)

    settings = Settings(
        database_url=dsn,
        grace=GRACE,
        scan_interval=0.5,
        http_addr=None,
        probe_interval=0.5,
        probe_timeout=1.0,
        # Every commit notifies: a doorbell rung by the stream would keep the queue from filling.
        doorbell_rate=0,
    )
    with (
        psycopg.connect(dsn, autocommit=True) as stuck,
        psycopg.connect(dsn, autocommit=True) as app,
    ):
        stuck.execute(f"LISTEN {CHANNEL}")
        stuck.execute("BEGIN")
        stuck.execute("SELECT 1")  # idle in transaction from here on: the queue cannot drain
        pair = Pair(REFERENCE_INSTALL, settings)
        async with open_replica(settings, [pair]) as replica, replica.running():
            reactor = replica.reactors[pair.name]
            failed = await anyio.to_thread.run_sync(_finish_jobs, app)
            assert failed == 0
            usage = app.execute("SELECT pg_notification_queue_usage()").fetchone()
            assert usage is not None
            assert usage[0] >= 0.5
            # The reactor says so, and polls instead of waiting for notifications.
            await eventually(lambda: reactor.vitals.notify_skipped, timeout=15)
            gauge = "reactor_notification_queue_usage"
            assert (reactor.metrics.registry.get_sample_value(gauge) or 0) >= 0.5
            assert reactor.polling
            # The health check skips its probe while the queue is half full, and the
            # listener expects none back: its connection stays up through checks.
            assert reactor.listener is not None
            connections = reactor.listener.connections
            health = reactor.cadence.duties["health"]
            checks = health.runs
            await eventually(lambda: health.runs >= checks + 4, timeout=15)
            assert reactor.listener.connections == connections
            assert reactor.listener.state == "listening"
            await eventually(lambda: _runs(app) == JOBS, timeout=60, interval=0.2)
        stuck.execute("ROLLBACK")
    result = await judge(dsn, GRACE)
    assert result.clean, result


def _finish_jobs(conn: Conn) -> int:
    """The worker finishing JOBS jobs, one commit each; how many commits failed."""
    failed = 0
    for _ in range(JOBS):
        try:
            conn.execute(
                "INSERT INTO analysis_jobs (id, run_id, status, doc_html, results) "
                "VALUES (%s, %s, 'complete', '<p/>', '{\"v\": 1}')",
                (uuid.uuid4(), uuid.uuid4()),
            )
        except psycopg.Error:
            failed += 1
    return failed


def _runs(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM analysis_runs").fetchone()
    assert row is not None
    return int(row[0])
