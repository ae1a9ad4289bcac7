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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import psycopg
import pytest

from reactor import db
from reactor.install.mapping import REFERENCE
from reactor.insurance.doorbell import LEASE_POLLS
from reactor.runtime.service import Reactor
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


@asynccontextmanager
async def _between_checks(
    start_reactor: StartReactor, database_url: str
) -> AsyncIterator[tuple[Reactor, Conn]]:
    # A replica checking every 30 s, ready, and the check that follows its first probe over
    # (its heartbeat names the LISTEN session): nothing but a ring makes it poll now.
    with psycopg.connect(database_url, autocommit=True) as app:
        async with start_reactor(grace=GRACE, probe_interval=30.0) as reactor:
            await eventually(lambda: reactor.health()[1], timeout=15)
            named = "SELECT count(*) FROM reactor.replicas WHERE session_pid IS NOT NULL"
            await eventually(lambda: scalar(app, named) == 1, timeout=15)
            health = reactor.cadence.duties["health"]
            await eventually(lambda: not health.running, timeout=15)
            yield reactor, app


async def _told_of_a_ring(reactor: Reactor, app: Conn) -> None:
    # What the poll that wakes the bell says on the membership channel; a poll follows.
    polls = reactor.polls
    app.execute("SELECT pg_notify('reactor_replicas', %s)", (f"rang:{CHANNEL}",))
    await eventually(lambda: reactor.polls > polls, timeout=5)


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


async def test_a_replica_told_of_a_ring_polls_at_once(
    start_reactor: StartReactor, database_url: str
) -> None:
    # Another replica rang the bell: this one hears no job from now on, and its next health
    # check is half a minute away. Told on the membership channel, it polls at once, and the
    # jobs that did not notify are recorded on time rather than by the scan.
    async with _between_checks(start_reactor, database_url) as (reactor, app):
        assert not reactor.polling
        app.execute(
            "INSERT INTO reactor.doorbell VALUES (%s, now() + interval '1 minute')", (CHANNEL,)
        )
        await _told_of_a_ring(reactor, app)
        assert reactor.polling
        jobs = [_finish(app) for _ in range(5)]
        await eventually(lambda: _runs(app) == len(jobs), timeout=5, interval=0.05)

    result = await judge(database_url, GRACE)
    assert result.clean, result


async def test_a_replica_of_a_fleet_polls_as_often_as_the_fleet_needs(
    start_reactor: StartReactor, database_url: str
) -> None:
    # Three more replicas heartbeat (rows of their own, an hour ahead), and the bell is awake:
    # this replica owns about a quarter of the shares and polls a quarter as often as one
    # replica alone would, still arming its jobs before they are due.
    grace = 4.0
    with psycopg.connect(database_url, autocommit=True) as app:
        app.execute(
            "INSERT INTO reactor.replicas (id, heartbeat_at) "
            "SELECT 'other-' || n, now() + interval '1 hour' FROM generate_series(1, 3) n"
        )
        app.execute(
            "INSERT INTO reactor.doorbell VALUES (%s, now() + interval '1 hour')", (CHANNEL,)
        )
        async with start_reactor(grace=grace) as reactor:
            await eventually(lambda: len(reactor.membership.live) == 4, timeout=15)
            await eventually(lambda: reactor.polling, timeout=15)
            health = reactor.cadence.duties["health"]
            polls, checks, began = reactor.polls, health.runs, time.monotonic()
            job = next(j for j in iter(uuid.uuid4, None) if reactor.membership.owns(str(j)))
            app.execute(
                "INSERT INTO analysis_jobs (id, run_id, status, doc_html, results) "
                "VALUES (%s, %s, 'complete', '<p/>', '{\"v\": 1}')",
                (job, uuid.uuid4()),
            )
            await eventually(lambda: _runs(app) == 1, timeout=grace + 5, interval=0.05)
            polled, elapsed = reactor.polls - polls, time.monotonic() - began
            # The health checks meanwhile leave a poll on its cadence where it is.
            checked = health.runs - checks
        lateness = worker_lateness(app, grace)
    interval = reactor.settings.poll_interval
    assert checked >= 2, checked
    assert 2 <= polled <= elapsed / (4 * interval) + 2, (polled, checked, elapsed)
    [late] = lateness
    assert late < 0.5, late


async def test_a_stranger_s_ring_costs_one_poll(
    start_reactor: StartReactor, database_url: str
) -> None:
    async with _between_checks(start_reactor, database_url) as (reactor, app):
        await _told_of_a_ring(reactor, app)
        # The bell is silent: the poll that read it goes back to sleep.
        assert not reactor.polling
        # Another pair's bell is none of this one's.
        polls = reactor.polls
        app.execute("SELECT pg_notify('reactor_replicas', 'rang:other_channel')")
        job = _finish(app)
        await eventually(lambda: _runs(app) == 1, timeout=5, interval=0.05)
        assert reactor.polls == polls
        assert scalar(app, "SELECT count(*) FROM analysis_runs WHERE job_id = %s", (job,)) == 1


async def test_the_poll_that_wakes_a_silent_bell_tells_every_replica(
    start_reactor: StartReactor, database_url: str
) -> None:
    # The others hear no job once the bell is awake: where the trigger spreads they each heard
    # only their share, so the ringer alone crossed the rate, and rang: is all they get.
    with psycopg.connect(database_url, autocommit=True) as ear:
        ear.execute("LISTEN reactor_replicas")
        async with start_reactor(grace=GRACE, doorbell_rate=0) as reactor:
            ear.execute("DELETE FROM reactor.doorbell")
            list(ear.notifies(timeout=0.2, stop_after=None))
            await reactor.database.poll_queue(None, ahead=0.5, limit=10, ring=True, lease=1.0)
            heard = [n.payload for n in ear.notifies(timeout=1.0, stop_after=None)]
    assert f"rang:{CHANNEL}" in heard, heard


async def test_a_trigger_that_spreads_is_silenced_too(
    start_reactor: StartReactor, database_url: str
) -> None:
    async with await db.connect(database_url, "migrate") as conn:
        await db.migrate(conn, REFERENCE.in_public(), spread=True)
    with psycopg.connect(database_url, autocommit=True) as app:
        async with start_reactor(grace=GRACE) as reactor:
            await eventually(lambda: reactor.vitals.trigger_spread, timeout=15)
            await anyio.to_thread.run_sync(_stream, app)
            assert reactor.metrics.registry.get_sample_value("reactor_doorbell_awake") == 1
            await eventually(lambda: _runs(app) == JOBS, timeout=20, interval=0.05)
    with psycopg.connect(database_url, autocommit=True) as conn:
        lateness = worker_lateness(conn, GRACE)
    assert max(lateness) < 3.0, sorted(lateness)[-5:]
