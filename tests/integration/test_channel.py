"""The channel is a hint, and costs a stranger nothing: a role with no grants at all can NOTIFY
on it (PostgreSQL has no privilege on NOTIFY), and gains nothing by it. Garbage costs a count
and a line per interval; a made-up job hint costs no memory past the real backlog; a forged
`joined:` or `left:` moves no share."""

from __future__ import annotations

import logging

import anyio
import psycopg
import psycopg.conninfo
import pytest

from reactor.runtime.service import Reactor
from tests.conftest import NewRole
from tests.helpers import finish, new_job, worker_writes
from tests.integration.conftest import StartReactor
from tests.integration.support import worker_delay
from tests.polling import eventually

pytestmark = pytest.mark.anyio


@pytest.fixture
def stranger(new_login_role: NewRole) -> str:
    """A LOGIN role with no grants: it can connect (PUBLIC's CONNECT) and nothing more."""
    return new_login_role("stranger")


def send(database_url: str, role: str, channel: str, payload_sql: str, count: int) -> None:
    """As ``role``, ``count`` notifications on ``channel`` in one statement; ``payload_sql`` is
    an expression of ``g``, 1 to ``count``."""
    dsn = psycopg.conninfo.make_conninfo(database_url, user=role)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"SELECT count(pg_notify(%s, {payload_sql})) FROM generate_series(1, %s) g",
            (channel, count),
        )


def notified(reactor: Reactor, result: str) -> float:
    return float(reactor.metrics.notified[result]._value.get())


async def proven(reactor: Reactor) -> None:
    await eventually(lambda: reactor.listener is not None and reactor.listener.proven)
    await eventually(lambda: reactor.holding)


async def test_garbage_from_a_stranger_is_counted_and_logged_once_per_interval(
    database_url: str,
    start_reactor: StartReactor,
    stranger: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    grace = 1.0
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(grace=grace) as reactor:
            await proven(reactor)
            job_id, _ = new_job(conn)
            send(database_url, stranger, reactor.subscriber.channel, "'garbage-' || g", 20_000)
            finish(conn, job_id)
            await eventually(lambda: notified(reactor, "rejected") == 20_000, timeout=20.0)
            await eventually(lambda: len(worker_writes(conn)) == 1, timeout=5.0)
            assert worker_delay(conn, [job_id]) < grace + 0.5
    lines = [r for r in caplog.records if "name no job" in r.getMessage()]
    assert 1 <= len(lines) <= 2, [r.getMessage() for r in lines]


async def test_forged_joined_and_left_move_no_share(
    database_url: str,
    start_reactor: StartReactor,
    stranger: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Health checks a minute apart: only the channel could move the live set so soon.
    settings = {"grace": 1.0, "probe_interval": 60.0, "probe_timeout": 5.0}
    caplog.set_level(logging.INFO)
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(**settings) as first, start_reactor(**settings) as second:
            both = {first.replica_id, second.replica_id}
            for reactor in (first, second):
                await proven(reactor)
            await eventually(lambda: first.membership.live == second.membership.live == both)
            shares = (first.membership.shares, second.membership.shares)
            channel = first.subscriber.channel
            before = len(caplog.records)
            send(database_url, stranger, channel, "'joined:fake-' || g", 1_000)
            send(database_url, stranger, channel, f"'left:{second.replica_id}' || ''", 1)
            send(database_url, stranger, channel, f"'left:{first.replica_id}' || ''", 1)
            await eventually(
                lambda: min(notified(first, "unverified"), notified(second, "unverified")) >= 1_001,
                timeout=10.0,
            )
            assert first.membership.live == second.membership.live == both
            assert (first.membership.shares, second.membership.shares) == shares
            assert first.queue.membership.live == both
            # Each job is claimed by its owner alone, once.
            jobs = [new_job(conn)[0] for _ in range(20)]
            for job_id in jobs:
                finish(conn, job_id)
            await eventually(lambda: len(worker_writes(conn)) == len(jobs), timeout=5.0)
            await anyio.sleep(0.5)  # a second write would land within the grace's retry
            assert sorted(str(j) for _, j, _ in worker_writes(conn)) == sorted(map(str, jobs))
            since = caplog.records[before:]
            assert not [r for r in since if r.getMessage() == "replicas changed"]
    forged = [r for r in caplog.records if "heartbeats contradict" in r.getMessage()]
    assert 1 <= len(forged) <= 2 * 2, "at most one per replica per interval (and the rest)"


async def test_a_flood_of_made_up_hints_arms_nothing_and_the_real_job_is_on_time(
    database_url: str, start_reactor: StartReactor, stranger: str
) -> None:
    grace = 2.0
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(grace=grace) as reactor:
            await proven(reactor)
            job_id, _ = new_job(conn)
            most = 0

            async def sample() -> None:
                nonlocal most
                while True:
                    most = max(most, reactor.queue.waiting, len(reactor.verifier.pending))
                    await anyio.sleep(0.005)

            async with anyio.create_task_group() as tg:
                tg.start_soon(sample)
                finish(conn, job_id)
                made_up = "gen_random_uuid()::text || '@' || extract(epoch FROM now())::text"
                await anyio.to_thread.run_sync(
                    send, database_url, stranger, reactor.subscriber.channel, made_up, 200_000
                )
                await eventually(
                    lambda: (
                        notified(reactor, "unverified") + notified(reactor, "dropped") >= 200_000
                    ),
                    timeout=60.0,
                )
                await eventually(lambda: len(worker_writes(conn)) == 1, timeout=5.0)
                tg.cancel_scope.cancel()
            assert reactor.queue.waiting == 0
            # The verify buffer's bound, never the flood's size; the heap held the real job.
            assert most <= 20_000
            assert worker_delay(conn, [job_id]) < grace + 0.5


async def test_at_grace_0_the_claim_is_the_check_and_a_made_up_hint_costs_only_it(
    database_url: str, start_reactor: StartReactor, stranger: str
) -> None:
    # Every queued job is due as it is heard: the claim reads the queue as a check would, so
    # no statement checks a hint first; a made-up hint's claim finds nothing and leaves nothing.
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(grace=0.0) as reactor:
            await proven(reactor)
            # Its own joined: is checked, as any replica's word is.
            await eventually(lambda: reactor.verifier.statements >= 1)
            verified = reactor.verifier.statements
            made_up = "gen_random_uuid()::text || '@' || extract(epoch FROM now())::text"
            await anyio.to_thread.run_sync(
                send, database_url, stranger, reactor.subscriber.channel, made_up, 50
            )
            job_id, _ = new_job(conn)
            finish(conn, job_id)
            await eventually(lambda: len(worker_writes(conn)) == 1, timeout=5.0)
            await eventually(lambda: reactor.queue.waiting == 0)
            assert reactor.verifier.statements == verified
        assert [row[1] for row in worker_writes(conn)] == [job_id]
