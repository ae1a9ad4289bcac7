"""One statement per probe interval, and the job trigger as the replicas see it.

A quiet replica's only periodic statement is its health check, run on the LISTEN connection
once that connection is proven: the heartbeat and the liveness proof of that connection in one
round trip, with a probe notification when nothing else arrived. When the trigger was installed
not to notify (`reactor migrate --no-notify`), notifies another channel, or is gone, the
replicas find out from the catalog at their next check and poll the queue, on time.
"""

from __future__ import annotations

from dataclasses import replace

import anyio
import psycopg
import pytest

from reactor import db
from reactor.install import REFERENCE_INSTALL, sql
from reactor.install.mapping import REFERENCE
from reactor.runtime.service import Reactor
from tests.faults.proxy import FaultProxy
from tests.faults.support import host_port, with_port
from tests.helpers import finish, new_job, run_row
from tests.integration.conftest import StartReactor
from tests.integration.support import Counting, scalar, worker_lateness
from tests.polling import eventually

pytestmark = pytest.mark.anyio

PROBE = 0.4
GRACE = 0.6
# A write this close to its deadline came from a timer, armed by a notification or a poll, not
# from a scan (every 30 s here).
PROMPT = 0.35


def job_trigger(reactor: Reactor) -> dict[str, float]:
    """reactor_job_trigger by state."""
    registry = reactor.metrics.registry
    return {
        state: registry.get_sample_value("reactor_job_trigger", {"state": state}) or 0.0
        for state in ("notifies", "quiet", "elsewhere", "missing")
    }


def heartbeat(conn: psycopg.Connection[tuple[object, ...]], reactor: Reactor) -> object:
    """The replica's last heartbeat; None before its first."""
    row = conn.execute(
        "SELECT heartbeat_at FROM reactor.replicas WHERE id = %s", (reactor.replica_id,)
    ).fetchone()
    return None if row is None else row[0]


async def next_heartbeat(conn: psycopg.Connection[tuple[object, ...]], reactor: Reactor) -> None:
    """Wait for the replica's next heartbeat: at most a probe interval, plus its timeout."""
    seen = heartbeat(conn, reactor)
    await eventually(lambda: heartbeat(conn, reactor) != seen, timeout=2 * PROBE + 1)


def first_words(query: str) -> str:
    return query.split("(")[0].strip()[:40]


def pool_requests(reactor: Reactor) -> int:
    return int(reactor.database.pool.get_stats().get("requests_num", 0))


async def reinstall_triggers(conn: psycopg.Connection[tuple[object, ...]], channel: str) -> None:
    await ddl(conn, REFERENCE_INSTALL.render(sql.repeatable().text, channel=channel))


async def ddl(conn: psycopg.Connection[tuple[object, ...]], statement: str) -> None:
    """``statement`` on the test's own connection, off the event loop: it waits for the table's
    lock, and a statement of the running reactor that holds one must be able to finish."""
    await anyio.to_thread.run_sync(conn.execute, statement)


async def test_a_quiet_replica_sends_one_statement_per_probe_interval(
    database_url: str, start_reactor: StartReactor
) -> None:
    pooled: list[str] = []

    def counted(database: db.Database) -> db.Database:
        # Every statement through the pool is noted; nothing but LISTEN runs on the other.
        assert isinstance(database.on, db.Pooled)
        return replace(database, on=Counting(database.on, pooled, first_words))

    # No reconcile here: its pass is periodic pool work of its own, once per interval.
    async with start_reactor(
        probe_interval=PROBE, probe_timeout=PROBE, reconcile_interval=0, instrument=counted
    ) as reactor:
        listener = reactor.listener
        assert listener is not None
        await eventually(lambda: listener.proven and reactor.scans >= 1)
        with psycopg.connect(database_url, autocommit=True) as conn:
            await eventually(lambda: heartbeat(conn, reactor) is not None)
            # The start's work may still be going on (the scan LISTEN's coming up asks for):
            # wait for an interval with nothing but the check.
            with anyio.fail_after(10):
                while True:
                    pooled.clear()
                    await next_heartbeat(conn, reactor)
                    if len(pooled) == 1:
                        break
            pooled.clear()
            probes = reactor.metrics.notifications.labels("probe")._value.get()
            # Five probe intervals with nothing to do.
            for _ in range(5):
                await next_heartbeat(conn, reactor)
            # One health query per interval, each carrying the listener's probe, which came
            # back: no scan, no poll, no probe of its own.
            assert len(pooled) in (5, 6), pooled
            assert len(set(pooled)) == 1, pooled
            assert listener.proven
            assert listener.failures == 0
            assert reactor.metrics.notifications.labels("probe")._value.get() >= probes + 4
            assert reactor.health() == (True, True, "ok")


async def test_the_pool_takes_over_the_check_while_listen_is_down(
    database_url: str, start_reactor: StartReactor
) -> None:
    # The LISTEN connection goes through a proxy that then goes silent (a partition): its check
    # times out, and until it is back the health check runs through the pool.
    host, port = host_port(database_url)
    proxy = FaultProxy(host, port).start()
    try:
        async with start_reactor(
            listen_database_url=with_port(database_url, proxy.port),
            probe_interval=PROBE,
            probe_timeout=PROBE,
        ) as reactor:
            listener = reactor.listener
            assert listener is not None
            await eventually(lambda: listener.checking)
            proxy.partition()
            await eventually(lambda: not listener.checking, timeout=2 * PROBE + 0.5)
            with psycopg.connect(database_url, autocommit=True) as conn:
                await next_heartbeat(conn, reactor)
                await next_heartbeat(conn, reactor)
                assert reactor.database_ok is True
                assert reactor.membership.live == frozenset({reactor.replica_id})
                alive, ready, _ = reactor.health()
                assert (alive, ready) == (True, False)
                # Polling meanwhile: a job is recorded on time, not a scan late.
                job_id, run_id = new_job(conn)
                finish(conn, job_id)
                await eventually(lambda: run_row(conn, run_id), timeout=GRACE + 5)
                [lateness] = worker_lateness(conn, reactor.settings.grace)
                assert 0.0 <= lateness < PROMPT
            proxy.heal()
            await eventually(lambda: listener.checking, timeout=15)
    finally:
        proxy.close()


async def test_a_trigger_installed_not_to_notify_is_polled_on_time(
    database_url: str, start_reactor: StartReactor
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        await db_migrate_quiet(database_url)
        async with start_reactor(grace=GRACE, probe_interval=PROBE) as reactor:
            await eventually(lambda: job_trigger(reactor)["quiet"] == 1.0)
            assert reactor.polling
            jobs = [new_job(conn) for _ in range(5)]
            for job_id, _ in jobs:
                finish(conn, job_id)
            await eventually(lambda: all(run_row(conn, run_id) for _, run_id in jobs))
            assert [run_row(conn, run) for _, run in jobs] == [(job, "worker") for job, _ in jobs]
            # Nothing was notified; the poll armed every timer, and the replica is ready: no
            # NOTIFY is a mode, not a fault.
            assert reactor.metrics.notifications.labels("accepted")._value.get() == 0
            assert reactor.health() == (True, True, "ok")
        lateness = worker_lateness(conn, GRACE)
        assert len(lateness) == 5
        assert all(0.0 <= late < PROMPT for late in lateness), lateness
        assert scalar(conn, "SELECT count(*) FROM reactor.pending") == 0


async def db_migrate_quiet(database_url: str) -> None:
    async with await db.connect(database_url, "migrate") as conn:
        await db.migrate(conn, REFERENCE, notify=False)


async def test_a_trigger_notifying_another_channel_is_named_and_polled(
    database_url: str, start_reactor: StartReactor
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(grace=GRACE, probe_interval=PROBE) as reactor:
            await eventually(lambda: reactor.health()[1])
            assert not reactor.polling
            await reinstall_triggers(conn, "someone_elses_channel")
            await eventually(lambda: job_trigger(reactor)["elsewhere"] == 1.0, timeout=3)
            alive, ready, reason = reactor.health()
            assert (alive, ready) == (True, False)
            assert "'someone_elses_channel'" in reason
            assert "'analysis_jobs_terminal'" in reason
            job_id, run_id = new_job(conn)
            finish(conn, job_id)
            await eventually(lambda: run_row(conn, run_id))
            # Put back, the replica hears notifications again.
            await reinstall_triggers(conn, "analysis_jobs_terminal")
            await eventually(lambda: job_trigger(reactor)["notifies"] == 1.0, timeout=3)
            assert reactor.health() == (True, True, "ok")
            assert not reactor.polling
        [lateness] = worker_lateness(conn, GRACE)
        assert 0.0 <= lateness < PROMPT


async def test_a_missing_job_trigger_makes_the_replica_unready(
    database_url: str, start_reactor: StartReactor
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(probe_interval=PROBE) as reactor:
            await eventually(lambda: reactor.health()[1])
            await ddl(conn, "ALTER TABLE analysis_jobs DISABLE TRIGGER reactor_job_update")
            await eventually(lambda: job_trigger(reactor)["missing"] == 1.0, timeout=3)
            alive, ready, reason = reactor.health()
            assert (alive, ready) == (True, False)
            assert "reactor migrate" in reason
            await ddl(conn, "ALTER TABLE analysis_jobs ENABLE TRIGGER reactor_job_update")
            await eventually(lambda: reactor.health() == (True, True, "ok"), timeout=3)
