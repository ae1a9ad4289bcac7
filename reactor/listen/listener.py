"""The LISTEN side: one dedicated connection that turns notifications into job ids. It only
listens: connect, LISTEN/UNLISTEN, prove, route. What to do when is decided by the pure
:class:`reactor.listen.session.Session` (which says how the session proves itself); this
module performs its actions on the connection. A payload is parsed, never trusted; garbage is
counted.

The first probe is sent through the pool, from another session: what a transaction-mode pooler
gives LISTENs where nothing arrives, and is reported degraded (the replica polls). Once proven,
the replica's health check (through the pool) carries a probe whenever nothing arrived since
the last one, and its heartbeat names this session. No other statement rides this connection:
one that ran while a flood arrived would make psycopg keep all of it in memory.

One connection serves every pair of the replica (each a :class:`Subscriber`): it LISTENs on
each pair's main channel (probes, the jobs of a trigger that does not spread), its membership
channel (replicas joining and leaving) and, once proven and when the trigger spreads, the
channel of each share this replica owns; a share gained is re-armed after its LISTEN.

Reads are coalesced: after a batch arrived the listener sleeps ``REACTOR_LISTEN_COALESCE_SECONDS``
(5 ms) before reading again, so that a steady stream wakes it once per interval rather than once
per notification; a quiet session sleeps on its socket, with no wake-up until something arrives
or the session has something to do.

Every reconnect backs off, with jitter, from the first failure until a probe proves a
connection again; each distinct problem is logged once. Session settings are applied only once
a probe came back: through a transaction-mode pooler they would land on another client's session.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Literal

import anyio
import anyio.lowlevel
import psycopg

from reactor import db
from reactor.core.clock import Clock
from reactor.core.payload import PROBE, ProbeHeard, change_statement, read
from reactor.errors import ConfigError, ReactorError
from reactor.listen.session import (
    Action,
    Change,
    Close,
    Configure,
    Connect,
    Ping,
    Probe,
    Rearm,
    Report,
    Session,
)
from reactor.listen.subscriber import Routes, Subscriber, hand_on, on_behalf
from reactor.settings.config import ProcessSettings
from reactor.telemetry.metrics import Metrics

log = logging.getLogger(__name__)

State = Literal["connecting", "listening", "degraded"]

# Notifications handled between two turns of the event loop while a batch is read: a timer or a
# statement due meanwhile waits at most this many (a few hundred microseconds' work).
TURN_EVERY = 64

_ERRORS = (psycopg.Error, OSError, TimeoutError)


class Listener:
    """Keeps one LISTEN connection alive for the pairs subscribed to it, and hands each the job
    ids (with updated_at) notified on its channels."""

    def __init__(
        self,
        settings: ProcessSettings,
        *,
        clock: Clock,
        dsn: str,
        subscribers: Sequence[Subscriber] = (),
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.dsn = dsn
        self.session = Session(
            probe_interval=settings.probe_interval, probe_timeout=settings.probe_timeout
        )
        self.routes = Routes()
        self.subscribers = self.routes.subscribers
        self._conn: db.AnyConnection | None = None
        self._actions: list[Action] = []
        self._kicked = anyio.Event()
        # Set when an action may have run a statement on the session: psycopg keeps what
        # arrived meanwhile aside, where the socket cannot say so, and the next wait reads it.
        self._kept = False
        self._waiting: anyio.CancelScope | None = None
        self._lifetime: anyio.CancelScope | None = None
        own = dsn == settings.listen_database_url
        self._source = "REACTOR_LISTEN_DATABASE_URL" if own else "DATABASE_URL"
        # Notifications read on the session, over its life, and the reads that took them.
        self.received = 0
        self.reads = 0
        # Set once the first attempt is over, up or not: the service waits for no more.
        self.settled = anyio.Event()
        # (pid, backend_start) of this connection, and of the last one a probe proved our own:
        # after a reconnect it may linger on the server.
        self._identity: tuple[int, datetime] | None = None
        self._previous: tuple[int, datetime] | None = None
        for subscriber in subscribers:
            self.subscribe(subscriber)

    # -- what the replica reads ---------------------------------------------------------------

    @property
    def state(self) -> State:
        """``connecting`` (down), ``listening`` (up, proven or not yet) or ``degraded``."""
        phase = self.session.phase
        if phase in ("waiting", "connecting"):
            return "connecting"
        return "degraded" if phase == "degraded" else "listening"

    @property
    def proven(self) -> bool:
        """True while a probe proved this connection delivers."""
        return self.session.proven

    checking = proven  # as older callers name it: the check carries a probe to it now

    @property
    def delivering(self) -> bool:
        """False when notifications cannot be relied on: not connected, or probes lost."""
        return self.state == "listening"

    @property
    def problem(self) -> str | None:
        """Why the listener is not listening, as last logged (first line, never a password)."""
        return self.session.problem

    @property
    def failures(self) -> int:
        """Attempts that failed since a connection was last proven."""
        return self.session.failures

    @property
    def connections(self) -> int:
        """Connections opened, over the listener's life."""
        return self.session.connections

    @property
    def session_pid(self) -> int | None:
        """The server pid of this session while a probe proves it our own, for the heartbeat."""
        return self._identity[0] if self.proven and self._identity is not None else None

    @property
    def channel(self) -> str:
        """The main channels of the pairs subscribed, for the log."""
        return ",".join(s.channel for s in self.subscribers)

    @property
    def hears(self) -> frozenset[int]:
        """The shares whose channels this connection LISTENs on now (none while it is down)."""
        return frozenset().union(*(subscriber.listening for subscriber in self.subscribers))

    # -- what the replica tells ---------------------------------------------------------------

    def subscribe(self, subscriber: Subscriber) -> None:
        """Deliver ``subscriber``'s channels to it from now on."""
        self.routes.add(subscriber)
        self._want()

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """Stop delivering to ``subscriber``; once none is left, the listener ends."""
        if not self.routes.remove(subscriber):
            return
        if not self.subscribers and self._lifetime is not None:
            self._lifetime.cancel()
        self._want()

    def refresh(self, subscriber: Subscriber) -> bool:
        """``subscriber``'s shares may have changed: LISTEN on the ones gained and UNLISTEN the
        ones lost now. True when a share's channel will be LISTENed on that is not yet: the
        pair is then re-armed once it is (a share gained was never held here)."""
        self._want()
        return self.proven and bool(subscriber.owned() - subscriber.listening)

    def refresh_pair(self, channel: str) -> bool:
        """:meth:`refresh` for the pair whose main channel is ``channel`` (False: none is
        subscribed)."""
        subscriber, _ = self.routes.of(channel)
        return subscriber is not None and self.refresh(subscriber)

    def probe_for_check(self) -> str | None:
        """The probe payload the replica's health check should send now (None: none needed);
        tell :meth:`probe_sent` whether it went."""
        token = self.session.probe_for_check()
        return None if token is None else PROBE + token

    def probe_sent(self, payload: str, *, went: bool) -> None:
        """The health check sent ``payload`` (``went``) or could not."""
        self._actions += self.session.probe_sent(payload[len(PROBE) :], self.clock.now(), went=went)
        self._kick()  # to wait for it no longer than it may take

    def _want(self) -> None:
        self._do(self.session.want(self.routes.main(), self.routes.shares()))

    def _do(self, actions: list[Action]) -> None:
        if actions:
            self._actions += actions
            self._kick()

    def _kick(self) -> None:
        self._kicked.set()
        if self._waiting is not None:
            # Delivered where psycopg waits on the socket, never inside a batch it read.
            self._waiting.cancel()

    # -- the loop -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Listen until every subscriber left, reconnecting with jittered backoff.
        :attr:`settled` is set once the first attempt is over, whether LISTEN came up or not."""
        if not self.subscribers:
            return
        try:
            with anyio.CancelScope() as self._lifetime:
                while True:
                    self._actions += self.session.tick(self.clock.now())
                    if self._actions:
                        action, *self._actions = self._actions
                        await self._perform(action)
                        continue
                    await self._wait(self.session.wake_at())
        finally:
            await self._close()

    async def _perform(self, action: Action) -> None:
        now = self.clock.now
        self._kept = True
        try:
            if isinstance(action, Connect):
                await self._connect()
            elif isinstance(action, Change):
                await self._change(action)
            elif isinstance(action, Rearm):
                self._rearm(action.channels)
            elif isinstance(action, Probe):
                self._actions += self.session.probe_sent(
                    action.token, now(), went=await self._send_probe(action.token)
                )
            elif isinstance(action, Ping):
                with self._bounded():
                    await self._connection().execute("SELECT 1")
            elif isinstance(action, Configure):
                await self._configure()
            elif isinstance(action, Close):
                await self._close()
            else:
                self._report(action)
        except _ERRORS as error:
            self._actions = self.session.lost(now(), db.first_line(error))

    @contextlib.contextmanager
    def _bounded(self) -> Iterator[None]:
        # A statement on the session: shielded, so that a stop arriving meanwhile waits for it
        # (bounded) rather than interrupting it, which makes psycopg open another connection to
        # cancel it and close this one.
        with anyio.CancelScope(shield=True), anyio.fail_after(self.settings.probe_timeout):
            yield

    def _connection(self) -> db.AnyConnection:
        if self._conn is None:
            raise psycopg.OperationalError("the LISTEN connection is closed")
        return self._conn

    async def _connect(self) -> None:
        try:
            # A hot standby refuses LISTEN anyway; refused here, the problem /readyz shows
            # names the fix. A failover's promoted standby is found by a later attempt.
            self._conn = await db.connect(
                self.dsn,
                db.LISTENER_ROLE,
                configure_session=False,
                standby="refuse",
                source=self._source,
            )
        except ReactorError as error:
            await self._close()
            permanent = isinstance(error, ConfigError)
            self._actions += self.session.connect_failed(
                self.clock.now(), str(error), permanent=permanent
            )
            return
        self._actions += self.session.connected(self.clock.now())
        if self.connections > 1:
            self._each_metrics(lambda metrics: metrics.reconnects.inc())
            log.info("listener reconnected", extra={"channel": self.channel})
        self._each_metrics(lambda metrics: metrics.listener_up.set(1))

    async def _change(self, change: Change) -> None:
        statement = change_statement(listen=list(change.listen), unlisten=list(change.unlisten))
        if statement is not None:
            with self._bounded():
                await self._connection().execute(statement)
        self._actions += self.session.changed(self.clock.now())
        for subscriber in self.subscribers:
            shares = enumerate(subscriber.share_channels)
            subscriber.listening = frozenset(s for s, ch in shares if ch in self.session.on)
        self.settled.set()

    def _rearm(self, channels: frozenset[str]) -> None:
        for subscriber in list(self.subscribers):
            mine = {subscriber.channel, subscriber.replicas_channel, *subscriber.share_channels}
            if channels & mine:
                with on_behalf(subscriber):
                    subscriber.pair.listening()

    async def _send_probe(self, token: str) -> bool:
        if not self.subscribers:
            return False
        try:
            # Bounded: while the pool waits for a connection, this loop reads nothing.
            with anyio.CancelScope(shield=True), anyio.fail_after(self.settings.probe_timeout):
                await self.subscribers[0].database.notify(PROBE + token)
        except _ERRORS as error:
            log.warning("could not send the delivery probe", extra={"error": db.first_line(error)})
            return False
        return True

    async def _configure(self) -> None:
        conn = self._connection()
        with self._bounded():
            self._identity = await db.session_identity(conn)
            await db.configure(conn)
            # A connection we gave up on (a silent partition, a probe lost) may still be alive
            # on the server, registered as a listener that reads nothing: it holds the NOTIFY
            # queue back until the server's keepalives notice. End it now, matched by pid *and*
            # start time: through a pooler, or once the pid is reused, it is someone else's.
            if self._previous is not None and self._previous != self._identity:
                try:
                    await db.end_listener_session(conn, *self._previous)
                except psycopg.Error as error:
                    log.debug("could not end the previous session", extra={"error": str(error)})
        conn.prepare_threshold = db.PREPARE_THRESHOLD
        self._previous = self._identity
        for subscriber in list(self.subscribers):
            with on_behalf(subscriber):
                subscriber.pair.proven()

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        self._identity = None
        for subscriber in self.subscribers:
            subscriber.listening = frozenset()
        self._each_metrics(lambda metrics: metrics.listener_up.set(0))
        if conn is not None:
            # Not `async with conn`: its exit awaits a rollback first, which a cancellation
            # (stop) interrupts before the connection is closed.
            with anyio.CancelScope(shield=True):
                await conn.close()

    def _report(self, report: Report) -> None:
        # Every change of the session's state is reported: whether the pairs can rely on it may
        # have changed with it.
        for subscriber in self.subscribers:
            with on_behalf(subscriber):
                subscriber.pair.changed()
        if report.problem is None:
            level = logging.ERROR if report.alarm else logging.INFO
            log.log(level, report.message, extra={"channel": self.channel})
            return
        self._each_metrics(lambda metrics: metrics.listener_failures.inc())
        self.settled.set()
        # Once per problem: the same failure again is not news, and a wrong password would
        # otherwise log a line every few seconds for ever.
        level = logging.WARNING if report.news else logging.DEBUG
        extra = {"error": report.problem, "attempt": self.failures}
        log.log(level, report.message, extra=extra)

    async def _wait(self, until: float) -> None:
        # Until the session has something to do, reading what arrives meanwhile; cut short by a
        # subscribe, a refresh or a probe's word from the check.
        self._kicked = anyio.Event()
        if self._actions:
            return
        wait = max(0.0, until - self.clock.now())
        conn = self._conn
        if conn is None or not self.session.is_open:
            await self.clock.sleep_until(until, self._kicked)
            return
        got = 0
        try:
            with anyio.CancelScope() as self._waiting:
                if self._kept:
                    self._kept = False
                    got = await self._hand_on(await db.kept_aside(conn))
                if not got:
                    # Asleep on the socket until something arrives or the session's next action
                    # is due, with no wake-up between (an idle replica waits minutes).
                    await db.until_readable(conn, wait)
                    got = await self._hand_on(await db.arrived(conn))
            self._waiting = None
            if 0 < got < TURN_EVERY and self.settings.listen_coalesce > 0 and not self._actions:
                # Let the next ones gather on the socket: one read for them all. Not after a
                # large batch: the listener is behind (a flood), and reads on at once.
                with anyio.CancelScope() as self._waiting:
                    await anyio.sleep(min(self.settings.listen_coalesce, wait))
        except _ERRORS as error:
            self._actions = self.session.lost(self.clock.now(), db.first_line(error))
        finally:
            self._waiting = None
            self.received += got
            self.reads += 1 if got else 0

    async def _hand_on(self, arrived: list[psycopg.Notify]) -> int:
        """Hands on what one read found; how many there were."""
        for got, notify in enumerate(arrived, 1):
            self._receive(notify.payload, notify.channel)
            if not got % TURN_EVERY:
                # A read may hold thousands (anyone may NOTIFY): the timers would wait for them
                # all. Not a cancellation point, so nothing of the read is dropped.
                await anyio.lowlevel.cancel_shielded_checkpoint()
        return len(arrived)

    def _receive(self, payload: str, channel: str | None = None) -> None:
        subscriber, members = self.routes.of(channel)
        said = read(payload, "text" if subscriber is None else subscriber.id_type)
        if isinstance(said, ProbeHeard):
            for one in members or ([subscriber] if subscriber is not None else []):
                one.metrics.notified["probe"].inc()
            self._actions += self.session.probe_heard(said.token)
            return
        self.session.heard()
        hand_on(subscriber, members, said, payload, self.clock)

    def _each_metrics(self, update: Callable[[Metrics], object]) -> None:
        # The session is every pair's: each pair's metrics show it.
        for subscriber in self.subscribers:
            update(subscriber.metrics)
