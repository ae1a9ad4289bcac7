"""Faults: the listener's backend is terminated, PostgreSQL restarts. Nothing is lost, and
recovery does not wait for the 30 s fallback scan."""

from __future__ import annotations

import time

import anyio
import psycopg
import pytest

from reactor import db
from reactor.runtime.service import Reactor
from tests.conftest import Server
from tests.helpers import Conn, early_writes, finish, new_job, run_row, worker_writes
from tests.integration.conftest import StartReactor
from tests.integration.support import dbname, recorded, scalar, worker_lateness
from tests.polling import eventually

pytestmark = pytest.mark.anyio

GRACE = 0.4
# The scan interval stays at 30 s: anything recorded within this came from the reconnect.
RECOVERED_WITHIN = 10.0
# Down for longer than the pool's first two retries; a waiting call gets through within about a
# second of the server being back (the pool retries that often), not at a retry seconds later.
DOWN_FOR = 3.5
RECONNECTED_WITHIN = 2.0


def _connect(dsn: str) -> Conn:
    return psycopg.connect(dsn, autocommit=True, connect_timeout=10)


def _total(reactor: Reactor) -> float:
    return recorded(reactor, "timer") + recorded(reactor, "scan")


def _explain(reactor: Reactor, job_id: str) -> str:
    # What a timeout alone would not say: where the job's record got to.
    listener = reactor.listener
    assert listener is not None
    samples = {
        name: reactor.metrics.registry.get_sample_value(f"reactor_{name}_total") or 0
        for name in (
            "record_errors",
            "record_timeouts",
            "claims_skipped",
            "deadlines_left_to_owner",
        )
    }
    return (
        f"listener {listener.state} (proven {listener.proven}); job armed "
        f"{job_id in reactor.queue}; {samples}; live {sorted(reactor.membership.live)} "
        f"(me {reactor.membership.me}); pool {reactor.database.pool.get_stats()}"
    )


def _listener_pids(conn: Conn) -> list[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name = 'reactor-listener'"
    ).fetchall()
    return [int(pid) for (pid,) in rows]


async def test_terminated_listener_reconnects_and_recovers_missed_jobs(
    server: Server, database_url: str, start_reactor: StartReactor
) -> None:
    name = dbname(database_url)
    with _connect(database_url) as conn, _connect(server.admin_dsn) as admin:
        async with start_reactor(grace=GRACE, scan_interval=30.0) as reactor:
            listener = reactor.listener
            assert listener is not None
            assert listener.connections == 1
            # Settled first: the pool has its connections and the first probe came back, so
            # refusing new sessions below keeps out only the listener's reconnect.
            await eventually(lambda: listener.proven and reactor.scans >= 1)
            [pid] = _listener_pids(conn)
            try:
                # Keep the listener out while the job finishes, so its notification is lost
                # for certain: new sessions are refused until we allow them again.
                admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
                assert scalar(conn, "SELECT pg_terminate_backend(%s, 5000)", (pid,)) is True
                await eventually(lambda: listener.state == "connecting")
                assert _listener_pids(conn) == []

                job_id, run_id = new_job(conn)
                finish(conn, job_id)  # notifies nobody
                assert str(job_id) not in reactor.queue
            finally:
                admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            allowed = time.monotonic()

            row = await eventually(lambda: run_row(conn, run_id), timeout=RECOVERED_WITHIN)
            assert row == (job_id, "worker")
            assert time.monotonic() - allowed < RECOVERED_WITHIN
            assert listener.connections >= 2
            reconnects = reactor.metrics.registry.get_sample_value("reactor_reconnects_total")
            assert (reconnects or 0) >= 1
            assert len(_listener_pids(conn)) == 1

            # And the new connection delivers: the next job goes the timer's way.
            await eventually(lambda: _total(reactor) == 1)
            timer_before = recorded(reactor, "timer")
            job2, run2 = new_job(conn)
            finish(conn, job2)
            assert await eventually(lambda: run_row(conn, run2)) == (job2, "worker")
            await eventually(lambda: recorded(reactor, "timer") == timer_before + 1)
        assert early_writes(conn, GRACE) == 0
        assert sorted(worker_writes(conn)) == sorted(
            [(run_id, job_id, "INSERT"), (run2, job2, "INSERT")]
        )


async def test_postgres_restart_loses_nothing(
    server: Server, database_url: str, start_reactor: StartReactor
) -> None:
    embedded = server.embedded
    if embedded is None:
        pytest.skip("the test server is not ours to restart")
    async with start_reactor(grace=GRACE, scan_interval=30.0) as reactor:
        listener = reactor.listener
        assert listener is not None
        with _connect(database_url) as conn:
            # Finished before the restart; its deadline falls while the server is down.
            before, before_run = new_job(conn)
            finish(conn, before)
            await eventually(lambda: str(before) in reactor.queue)
        await anyio.to_thread.run_sync(embedded.restart)
        restarted = time.monotonic()
        with _connect(database_url) as conn:
            # Finished right after the restart, most likely before the listener is back.
            after, after_run = new_job(conn)
            finish(conn, after)
            assert await eventually(
                lambda: run_row(conn, before_run), timeout=RECOVERED_WITHIN
            ) == (before, "worker")
            assert await eventually(lambda: run_row(conn, after_run), timeout=RECOVERED_WITHIN) == (
                after,
                "worker",
            )
            assert time.monotonic() - restarted < RECOVERED_WITHIN

            # The reactor keeps running: LISTEN is back and a new job is recorded on time.
            await eventually(lambda: listener.state == "listening" and listener.connections >= 2)
            await eventually(lambda: _total(reactor) == 2)
            later, later_run = new_job(conn)
            finish(conn, later)
            try:
                assert await eventually(lambda: run_row(conn, later_run)) == (later, "worker")
            except TimeoutError:
                pytest.fail(f"not recorded after the restart: {_explain(reactor, str(later))}")
            await eventually(lambda: _total(reactor) == 3)
            assert worker_lateness(conn, GRACE)[-1] < 2.0

            assert early_writes(conn, GRACE) == 0
            writes = worker_writes(conn)
            assert sorted(writes) == sorted(
                [
                    (before_run, before, "INSERT"),
                    (after_run, after, "INSERT"),
                    (later_run, later, "INSERT"),
                ]
            )


async def test_pool_reconnects_soon_after_the_database_is_back(
    server: Server, database_url: str
) -> None:
    embedded = server.embedded
    if embedded is None:
        pytest.skip("the test server is not ours to stop")
    async with db.make_pool(database_url, max_size=2) as pool:
        await pool.wait()
        await anyio.to_thread.run_sync(embedded.stop)
        answered = anyio.Event()

        async def pooled_call() -> None:
            # Waits in the pool while the server is down: its checkout finds the idle
            # connection broken, and the pool retries with backoff from then on.
            async with pool.connection() as conn:
                await conn.execute("SELECT 1")
            answered.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(pooled_call)
            # Long enough for psycopg_pool's own backoff (attempts 1, 2 and 4 s apart) to put
            # its next attempt well after the server is back: 7 s after the first.
            await anyio.sleep(DOWN_FOR)
            await anyio.to_thread.run_sync(embedded.start)
            started = time.monotonic()
            with anyio.fail_after(10):
                await answered.wait()
        assert time.monotonic() - started < RECONNECTED_WITHIN


async def test_startup_catches_up_on_what_finished_while_no_reactor_ran(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        # Due long ago, and still inside its grace: both finished with no reactor running.
        overdue, overdue_run = new_job(conn)
        finish(conn, overdue)
        conn.execute(
            "UPDATE analysis_jobs SET updated_at = now() - interval '1 hour' WHERE id = %s",
            (overdue,),
        )
        fresh, fresh_run = new_job(conn)
        finish(conn, fresh)
        async with start_reactor(grace=2.0, scan_interval=30.0) as reactor:
            assert await eventually(lambda: run_row(conn, overdue_run)) == (overdue, "worker")
            # The startup scan armed the fresh job's deadline from the database.
            assert await eventually(lambda: run_row(conn, fresh_run), timeout=10) == (
                fresh,
                "worker",
            )
            await eventually(lambda: _total(reactor) == 2)
            assert recorded(reactor, "scan") == 1
            assert recorded(reactor, "timer") == 1
        assert early_writes(conn, 2.0) == 0
        [late_overdue, late_fresh] = worker_lateness(conn, 2.0)
        assert late_overdue > 3000  # an hour late, recorded at startup
        assert 0.0 <= late_fresh < 2.0
