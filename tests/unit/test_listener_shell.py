"""reactor.listen.listener's shell on a fake clock and a fake session: connect, back off, LISTEN,
prove, reconnect, follow subscriptions, route; no database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, cast

import anyio
import psycopg
import psycopg.sql
import pytest

from reactor import db
from reactor.core.clock import FakeClock
from reactor.errors import ReactorError
from reactor.install import Install, mapping
from reactor.listen.listener import Listener
from reactor.listen.subscriber import Subscriber
from reactor.settings.config import Settings
from reactor.telemetry.metrics import Metrics
from tests.hearing import Heard

pytestmark = pytest.mark.anyio

INTERVAL = 5.0
MEMBERS = "reactor_replicas"
JOB = "5f0c6a2e-1b7d-4c3e-9a8f-0123456789ab"


class FakeSession:
    """A LISTEN connection: records statements; notifications are handed in by the test."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.statements: list[str] = []
        self.queue: list[psycopg.Notify] = []
        self.arrived = anyio.Event()
        self.closed = False
        self.prepare_threshold: int | None = None

    async def execute(self, statement: object, params: object = None) -> None:
        if isinstance(statement, psycopg.sql.Composable):
            statement = statement.as_string(None)
        self.statements.append(str(statement))

    def deliver(self, channel: str, payload: str) -> None:
        self.queue.append(psycopg.Notify(channel, payload, 1))
        self.arrived.set()

    async def until_readable(self, seconds: float) -> None:
        if not self.queue:
            self.arrived = anyio.Event()
            await self.clock.sleep_until(self.clock.now() + seconds, self.arrived)

    async def take(self) -> list[psycopg.Notify]:
        """What has arrived, read at once (db.arrived and db.kept_aside on a real session)."""
        taken, self.queue = self.queue, []
        return taken

    async def close(self) -> None:
        self.closed = True


class Server:
    """Hands out fake sessions, or refuses as told; delivers probes to the current one."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.sessions: list[FakeSession] = []
        self.refusals: list[str] = []
        self.attempts = 0
        self.deliver_probes = True

    async def connect(self, dsn: str, role: str, **kwargs: object) -> FakeSession:
        self.attempts += 1
        if self.refusals:
            raise ReactorError(self.refusals.pop(0))
        self.sessions.append(FakeSession(self.clock))
        return self.sessions[-1]

    async def notify(self, payload: str) -> None:
        current = self.sessions[-1]
        if self.deliver_probes and not current.closed:
            current.deliver("first_done", payload)


class Pair:
    def __init__(self, channel: str, server: Server) -> None:
        database = cast(Any, type("FakeDatabase", (), {}))()
        database.install = Install.of(mapping.REFERENCE, channel)
        database.notify = server.notify
        database.grace = 120.0
        self.heard = Heard(database)
        self.subscriber = Subscriber(database, Metrics(), self.heard.verifier, self.heard)

    @property
    def jobs(self) -> list[str]:
        return self.heard.jobs

    @property
    def rearms(self) -> int:
        return self.heard.rearms


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def server(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> Server:
    server = Server(clock)

    async def identity(conn: object) -> tuple[int, datetime]:
        return 4242, datetime(2026, 1, 1, tzinfo=UTC)

    async def nothing(*args: object) -> None:
        return None

    monkeypatch.setattr(db, "connect", server.connect)
    monkeypatch.setattr(db, "session_identity", identity)
    monkeypatch.setattr(db, "configure", nothing)
    monkeypatch.setattr(db, "end_listener_session", nothing)
    monkeypatch.setattr(db, "until_readable", FakeSession.until_readable)
    monkeypatch.setattr(db, "arrived", FakeSession.take)
    monkeypatch.setattr(db, "kept_aside", FakeSession.take)
    return server


@asynccontextmanager
async def running(clock: FakeClock, *pairs: Pair) -> AsyncIterator[Listener]:
    settings = Settings.from_env(
        {
            "REACTOR_PROBE_INTERVAL_SECONDS": str(INTERVAL),
            "REACTOR_PROBE_TIMEOUT_SECONDS": "2",
            "REACTOR_LISTEN_COALESCE_SECONDS": "0",
        }
    )
    listener = Listener(
        settings,
        clock=clock,
        dsn="host=unused",
        subscribers=[pair.subscriber for pair in pairs],
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.run)
        await clock.advance(0)
        yield listener
        tg.cancel_scope.cancel()


async def test_connect_fails_backs_off_then_listens_and_is_proven(
    clock: FakeClock, server: Server
) -> None:
    server.refusals = ["connection refused", "connection refused"]
    pair = Pair("first_done", server)
    async with running(clock, pair) as listener:
        assert server.attempts == 1
        assert listener.state == "connecting"
        assert listener.problem == "connection refused"
        assert listener.settled.is_set(), "the replica waits for the first attempt only"
        retry = listener.session.retry_at
        await clock.advance(retry - clock.now() - 0.01)
        assert server.attempts == 1, "not before its backoff"
        await clock.advance(0.01)
        assert server.attempts == 2
        await clock.advance(listener.session.retry_at - clock.now())
        assert server.attempts == 3
        [session] = server.sessions
        assert session.statements[0] == f'LISTEN "first_done"; LISTEN "{MEMBERS}"'
        assert pair.rearms == 1, "what was notified while down is read once LISTEN is up"
        assert listener.proven, "the probe sent through the pool came back"
        assert listener.failures == 0
        assert listener.session_pid == 4242


async def test_a_lost_probe_closes_the_session_and_reconnects(
    clock: FakeClock, server: Server
) -> None:
    pair = Pair("first_done", server)
    async with running(clock, pair) as listener:
        assert listener.proven
        server.deliver_probes = False
        probe = listener.probe_for_check()
        assert probe is not None
        listener.probe_sent(probe, went=True)
        await clock.advance(INTERVAL - 0.01)
        assert listener.proven
        first = server.sessions[0]
        await clock.advance(0.01)
        assert first.closed
        assert listener.state == "connecting"
        assert listener.session_pid is None, "the heartbeat no longer names it"
        server.deliver_probes = True
        await clock.advance(listener.session.retry_at - clock.now())
        assert len(server.sessions) == 2
        assert listener.proven
        assert listener.connections == 2


async def test_subscribe_and_unsubscribe_while_connected(clock: FakeClock, server: Server) -> None:
    first = Pair("first_done", server)
    async with running(clock, first) as listener:
        [session] = server.sessions
        second = Pair("second_done", server)
        listener.subscribe(second.subscriber)
        await clock.advance(0)
        assert session.statements[-1] == 'LISTEN "second_done"'
        assert second.rearms == 1
        session.deliver("second_done", JOB)
        await clock.advance(0)
        assert (first.jobs, second.jobs) == ([], [JOB])
        listener.unsubscribe(second.subscriber)
        await clock.advance(0)
        assert session.statements[-1] == 'UNLISTEN "second_done"'


async def test_notifications_are_routed_by_channel_and_read_in_batches(
    clock: FakeClock, server: Server
) -> None:
    pair = Pair("first_done", server)
    async with running(clock, pair) as listener:
        [session] = server.sessions
        reads = listener.reads
        session.deliver("first_done", f"{JOB}@1700000000.5")
        session.deliver(MEMBERS, "joined:reactor-abc")
        session.deliver("first_done", "left:reactor-old")  # a replica of an earlier release
        session.deliver(MEMBERS, JOB)  # no job rides the membership channel
        session.deliver("first_done", "garbage")
        await clock.advance(0)
        assert pair.jobs == [JOB]
        assert pair.heard.said() == [("reactor-abc", False), ("reactor-old", True)]
        assert pair.subscriber.metrics.notified["rejected"]._value.get() == 2
        assert listener.reads == reads + 1, "five notifications, one wake-up"
