"""The listener never holds the rest hostage: with a LISTEN connection that cannot connect, or
one that fails right after connecting, the reactor scans, fires timers and runs hooks (polling),
reconnects with a backoff that grows, says why on /readyz, and logs each problem once.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
import uuid
from datetime import timedelta

import anyio
import psycopg
import psycopg.conninfo
import pytest

from reactor import db
from reactor.core.backoff import BACKOFF_BASE_S, BACKOFF_CAP_S, backoff
from tests.faults.proxy import FaultProxy
from tests.faults.support import host_port, with_port
from tests.helpers import finish, new_job, run_row
from tests.integration.conftest import StartReactor
from tests.integration.support import hints_heard, hints_ignored, scalar
from tests.polling import eventually

pytestmark = pytest.mark.anyio

HOOK_CHANNEL = "reactor_listener_hook"


def warnings_from(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == logger and r.levelno >= logging.WARNING
    ]


async def test_a_listen_dsn_that_never_connects_holds_nothing_hostage(
    database_url: str, start_reactor: StartReactor, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="reactor.listen.listener")
    # The server refuses it for good, as it would a wrong password.
    bad = psycopg.conninfo.make_conninfo(database_url, user="reactor_no_such_role")
    async with start_reactor(
        listen_database_url=bad,
        grace=0.3,
        scan_interval=0.3,
        hooks=f"ping=notify:{HOOK_CHANNEL}",
    ) as reactor:
        listener = reactor.listener
        assert listener is not None
        with psycopg.connect(database_url, autocommit=True) as app:
            job_id, run_id = new_job(app)
            finish(app, job_id)
            # Scan, timer and hook, all without LISTEN.
            await eventually(lambda: run_row(app, run_id), timeout=10)
            assert run_row(app, run_id) == (job_id, "worker")
            hook_status = "SELECT status FROM reactor.hook_outbox WHERE run_id = %s"
            await eventually(lambda: scalar(app, hook_status, (run_id,)) == "done", timeout=10)
        await eventually(lambda: listener.failures >= 3, timeout=10)
        alive, ready, reason = reactor.health()
        assert (alive, ready) == (True, False)
        assert reason.startswith("LISTEN connection down: "), reason
        assert "reactor_no_such_role" in reason
        assert reason.endswith("; polling, reconnecting")
        assert listener.state == "connecting"
    # Three attempts and more, one line: the same refusal again is not news.
    assert warnings_from(caplog, "reactor.listen.listener") == [
        "listener cannot connect; polling meanwhile"
    ]


async def test_a_listen_that_fails_right_after_connecting_backs_off(
    database_url: str, start_reactor: StartReactor, caplog: pytest.LogCaptureFixture
) -> None:
    # A standby, say: the connection is fine, LISTEN is not. Here the proxy cuts the link
    # right after the LISTEN, four times, then lets the fifth through.
    caplog.set_level(logging.DEBUG, logger="reactor.listen.listener")
    host, port = host_port(database_url)
    proxy = FaultProxy(host, port).start()
    try:
        proxy.reset_on(b"LISTEN", times=4)
        accepts: list[float] = []

        async def watch_accepts() -> None:
            seen = 0
            while True:
                if proxy.accepted > seen:
                    seen = proxy.accepted
                    accepts.append(time.monotonic())
                await anyio.sleep(0.002)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_accepts)
            async with start_reactor(
                listen_database_url=with_port(database_url, proxy.port),
                probe_interval=0.3,
                probe_timeout=1.0,
            ) as reactor:
                listener = reactor.listener
                assert listener is not None
                # A proven connection resets the backoff.
                await eventually(lambda: listener.proven and listener.failures == 0, timeout=20)
            tg.cancel_scope.cancel()
        assert proxy.resets_fired() == 4
    finally:
        proxy.close()
    assert len(accepts) == 5, accepts
    gaps = [later - earlier for earlier, later in itertools.pairwise(accepts)]
    for failures, gap in enumerate(gaps, start=1):
        # Never sooner than half the exponential step: no reconnect loop.
        floor = 0.5 * min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (failures - 1))
        assert gap >= floor - 0.01, (failures, gaps)
    assert warnings_from(caplog, "reactor.listen.listener") == [
        "listener connection lost or refused; polling meanwhile"
    ]


def test_backoff_grows_is_capped_and_jittered() -> None:
    assert backoff(1, cap=5, base=0.2, rand=0.0) == pytest.approx(0.1)
    assert backoff(1, cap=5, base=0.2, rand=0.999) == pytest.approx(0.2, abs=1e-3)
    assert backoff(4, cap=5, base=0.2, rand=0.0) == pytest.approx(0.8)
    assert backoff(40, cap=5, base=0.2, rand=0.0) == pytest.approx(2.5)
    assert backoff(40, cap=5, base=0.2, rand=0.999) <= 5
    assert backoff(0, cap=5, base=0.2, rand=0.0) == pytest.approx(0.1)


async def test_ending_the_previous_session_matches_its_start_too(database_url: str) -> None:
    # The pid of a session the listener gave up on may by now belong to another session; the
    # start time tells them apart.
    with (
        psycopg.connect(database_url, autocommit=True, application_name="reactor-listener") as old,
        psycopg.connect(database_url, autocommit=True) as admin,
    ):
        row = old.execute(
            "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        ).fetchone()
        assert row is not None
        pid, started = row

        def alive() -> bool:
            query = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
            return bool(scalar(admin, query, (pid,)))

        async with await db.connect(database_url, "test") as conn:
            later = started + timedelta(microseconds=1)
            assert await db.end_listener_session(conn, pid, later) is False
            assert alive()
            assert await db.end_listener_session(conn, pid, started) is True
            await eventually(lambda: not alive(), timeout=5)


async def test_a_job_notified_in_the_probes_packet_is_not_dropped(
    database_url: str, start_reactor: StartReactor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first probe proves the connection, and the listener then takes up the check at
    # once. A notification that came in the same packet must not go with the rest of it.
    job_id = str(uuid.uuid4())

    async def probe_and_job(self: db.Database, payload: str, channel: str | None = None) -> None:
        channel = channel or self.install.channel
        async with self.pool.connection() as conn:
            # One transaction: delivered together, the probe first.
            await db.call(
                conn,
                "SELECT pg_notify(%s, %s), pg_notify(%s, %s)",
                (channel, payload, channel, f"{job_id}@{time.time():.6f}"),
            )

    monkeypatch.setattr(db.Database, "notify", probe_and_job)
    async with start_reactor(grace=30.0) as reactor:
        listener = reactor.listener
        assert listener is not None
        await eventually(lambda: listener.checking)
        await eventually(lambda: hints_heard(reactor) >= 1, timeout=5)
        # Handed on and looked up: a made-up job, which the queue does not hold, so not armed.
        await eventually(lambda: hints_ignored(reactor) >= 1, timeout=5)
        assert job_id not in reactor.queue


async def test_the_poll_sleeps_while_the_session_delivers_and_wakes_when_it_is_lost(
    database_url: str, start_reactor: StartReactor
) -> None:
    # Health checks far apart: what wakes the poll is the session's loss, not a check.
    async with start_reactor(probe_interval=20.0, probe_timeout=5.0) as reactor:
        listener = reactor.listener
        assert listener is not None
        poll = reactor.cadence.duties["poll"]
        await eventually(lambda: listener.proven and poll.next_at == math.inf, timeout=10)
        asleep = reactor.poll.runs
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s AND datname = current_database()",
                (db.LISTENER_APPLICATION_NAME,),
            )
        began = time.monotonic()
        await eventually(lambda: reactor.poll.runs > asleep, timeout=10)
        # At the loss, well before the next check would have said so (until the session is
        # back, which re-reads the queue as it LISTENs again).
        assert time.monotonic() - began < 5.0
        await eventually(lambda: listener.proven, timeout=10)
