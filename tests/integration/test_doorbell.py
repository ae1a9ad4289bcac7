"""The doorbell on a running replica: a stream of jobs rings it, the app's commits stop
notifying, every job is still recorded on time by the poll, and once the stream ends the bell
falls silent and the next finish notifies again.

The stream is a worker finishing jobs at about 100 a second, five times the default rate that
rings the bell. A session of the test's own LISTENs on the channel and counts what the commits
sent; the scan runs every 30 s, so a job the poll missed would be recorded that late.
"""

from __future__ import annotations

import time
import uuid

import anyio
import psycopg
import pytest

from reactor.core.doorbell import LEASE_POLLS
from tests.faults.support import judge
from tests.helpers import Conn, scalar
from tests.integration.conftest import StartReactor
from tests.integration.support import worker_lateness
from tests.polling import eventually

pytestmark = pytest.mark.anyio

CHANNEL = "analysis_jobs_terminal"
GRACE = 0.5
JOBS = 300
EVERY = 0.01


def _finish(conn: Conn) -> uuid.UUID:
    job = uuid.uuid4()
    conn.execute(
        "INSERT INTO analysis_jobs (id, run_id, status, doc_html, results) "
        "VALUES (%s, %s, 'complete', '<p/>', '{\"v\": 1}')",
        (job, uuid.uuid4()),
    )
    return job


def _stream(conn: Conn) -> None:
    for _ in range(JOBS):
        _finish(conn)
        time.sleep(EVERY)  # the worker's pace, not a wait for anything


def _heard(conn: Conn) -> list[str]:
    return [n.payload.split("@")[0] for n in conn.notifies(timeout=0, stop_after=None)]


def _runs(conn: Conn) -> int:
    return int(scalar(conn, "SELECT count(*) FROM analysis_runs"))


async def test_a_stream_rings_the_bell_and_every_job_is_still_recorded_on_time(
    start_reactor: StartReactor, database_url: str
) -> None:
    with (
        psycopg.connect(database_url, autocommit=True) as app,
        psycopg.connect(database_url, autocommit=True) as ear,
    ):
        ear.execute(f"LISTEN {CHANNEL}")
        async with start_reactor(grace=GRACE) as reactor:
            assert reactor.listener is not None
            await eventually(lambda: reactor.health()[1], timeout=15)
            await anyio.to_thread.run_sync(_stream, app)

            # The bell rang soon after the stream began: most commits did not notify.
            heard = _heard(ear)
            assert 0 < len(heard) < JOBS / 2
            assert reactor.metrics.registry.get_sample_value("reactor_doorbell_awake") == 1
            await eventually(lambda: _runs(app) == JOBS, timeout=20, interval=0.05)

            # The stream is over: nobody renews the bell, and it falls silent within its lease.
            lease = LEASE_POLLS * reactor.settings.poll_interval
            await eventually(
                lambda: not reactor.doorbell.awake(reactor.clock.now()), timeout=lease + 5
            )
            silent = "SELECT count(*) FROM reactor.doorbell WHERE awake_until > now()"
            await eventually(lambda: scalar(app, silent) == 0, timeout=lease + 5)
            late = _finish(app)
            await eventually(lambda: str(late) in _heard(ear), timeout=5)
            await eventually(lambda: _runs(app) == JOBS + 1, timeout=10, interval=0.05)

    result = await judge(database_url, GRACE)
    assert result.clean, result
    # On time: the poll armed each job's timer; the scan, 30 s apart, would have been late.
    with psycopg.connect(database_url, autocommit=True) as conn:
        lateness = worker_lateness(conn, GRACE)
    assert len(lateness) == JOBS + 1
    assert max(lateness) < 3.0, sorted(lateness)[-5:]
