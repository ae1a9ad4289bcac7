"""The LISTEN side: one dedicated connection that turns notifications into job ids.

A notification is only a hint that a job may need its timer; the payload is parsed, never
trusted, and garbage is counted and logged while the loop carries on.

The listener proves itself rather than assuming. After LISTEN it sends itself a probe
notification from another session, through the pool, which must come back over LISTEN: a
connection that LISTENs somewhere notifications never arrive is what a transaction-mode pooler
gives, so the listener then reports itself degraded, and the service polls until probes arrive
again. Once proven, the connection carries the replica's periodic health check (its
heartbeat): the same round trip shows the session alive, which ``notifies()`` cannot (a frozen
backend or a silent partition raises nothing there). When nothing arrived since the last
check, the check also sends a probe to this session itself, which must be back by the next
check (unless the check did not send it: the NOTIFY queue was half full); any notification that
did arrive proves delivery just as well. So a dead, frozen or deaf connection is replaced within
two probe intervals, and a quiet replica sends one statement per probe interval in all. The
check is a duty of the service's cadence: this connection holds its token while it is proven,
and the pool takes it back the moment it is not. Nothing else rides this connection: a poll or
a scan that ran long here would stall the notifications and, past the probe's bound, kill them.

One connection serves every pair of the replica (each a :class:`Subscriber`): it LISTENs on
each pair's channels and hands a notification to the pair whose channel it came on, and its
health check is one statement for all of them (:func:`reactor.db.health_of_pairs`), each pair's
heartbeat and reads in its own schema. A pair whose part fails on its own (its tables broken)
is benched: its checks go through the pool until one succeeds there, and the others stay here.

The connection LISTENs on the main channel (probes, replicas joining and leaving, the jobs of a
trigger that does not spread) and, when the trigger was installed with ``--spread``, once a
probe proved the session, on the channel of each share of the jobs this replica owns. When the
replica's shares change, the wait for notifications is cut short: the LISTENs and UNLISTENs go
in one round trip, and a share gained is re-armed from the database only after its LISTEN, so
no job of it falls between.

Nothing waits for the listener: the service scans, fires timers and runs hooks whatever this
connection does, and polls until LISTEN is up. Every reconnect backs off, with jitter, from the
first failure until a probe proves a connection again, whether the connect failed (a wrong
password, a read-only hot standby: a failover's old primary behind the same address), LISTEN
failed after a good connect or the session dropped later. Each distinct problem is logged once,
not once per attempt. With a multi-host DSN and ``target_session_attrs=read-write``, each
reconnect lands on whichever host accepts writes, so after a failover the promoted standby.

Session settings (server-side keepalives, statement bounds) are applied only once a probe has
come back on the connection: that proves it is a session of its own. Through a transaction-mode
pooler they would land on a server session the app uses next.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Literal

import anyio
import psycopg
import psycopg.sql

from reactor import db
from reactor.backoff import BACKOFF_BASE, BACKOFF_CAP, BACKOFF_CAP_PERMANENT, backoff
from reactor.clock import Clock
from reactor.config import ProcessSettings
from reactor.db import DATABASE_ERRORS
from reactor.errors import ConfigError, ReactorError
from reactor.metrics import Metrics
from reactor.payload import change_statement, parse_hint
from reactor.subscriber import Subscriber, check_pairs, on_behalf, statement_failed

log = logging.getLogger(__name__)

State = Literal["connecting", "listening", "degraded"]

_PROBE = "probe:"
# What a replica sends with its id when it stops cleanly (the replica_leave query), and with
# its first heartbeat (the health query).
_LEFT = "left:"
_JOINED = "joined:"
# While the replica settles (see Listener.settling), how often the listener looks at its duties:
# only a wake-up, no statement, and only until the first re-arm has read the queue.
SETTLING_TICK = 0.05
# Notifications handled between two turns of the event loop while a batch is read: a timer or a
# statement due meanwhile waits at most this many (a few hundred microseconds' work).
TURN_EVERY = 64


class ProbeLost(ReactorError):
    """A probe this session sent itself did not come back by the next check."""


class Listener:
    """Keeps one LISTEN connection alive for the pairs subscribed to it, and hands each the job
    ids (with updated_at) notified on its channels.

    Its health check is one statement for every pair (their heartbeats, their reads), so that
    a replica of several pairs costs the database what one pair does. A pair whose statements
    fail there on their own (its tables broken) is benched: its checks go through the pool,
    and the others' go on here.
    """

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
        self.subscribers: list[Subscriber] = []
        # The subscriber of each channel: its main one and each of its shares'.
        self._routes: dict[str, Subscriber] = {}
        # The channels this session LISTENs on now.
        self._channels_on: frozenset[str] = frozenset()
        # The health check of the pairs due, on this session (see check_together).
        self.check = self.check_together
        # Set by refresh(): the channels to LISTEN on changed; the wait is cut short.
        self._stale = False
        self._waiting: anyio.CancelScope | None = None
        # The run's scope, cancelled once every subscriber has left.
        self._lifetime: anyio.CancelScope | None = None
        # The setting the DSN came from, for the messages.
        self._source = (
            "REACTOR_LISTEN_DATABASE_URL" if dsn == settings.listen_database_url else "DATABASE_URL"
        )
        self.state: State = "connecting"
        self.connections = 0
        # Notifications read on the session, over its life.
        self.received = 0
        self._probe_token: str | None = None
        self._probe_sent = -math.inf
        # Whether anything arrived since the last check (then no probe is needed).
        self._heard = False
        # Whether a probe came back on the current connection: readiness waits for it.
        self.proven = False
        # Why the listener is not listening, as last logged (first line, never a password).
        self.problem: str | None = None
        # Reconnect attempts that failed since a connection was last proven.
        self.failures = 0
        self.backoff_base = BACKOFF_BASE
        # Set once the first attempt is over, up or not: the service waits for no more.
        self.settled = anyio.Event()
        # (pid, backend_start) of the last session a probe proved our own: after a reconnect it
        # may linger on the server.
        self._previous: tuple[int, datetime] | None = None
        for subscriber in subscribers:
            self.subscribe(subscriber)

    @property
    def channel(self) -> str:
        """The main channels of the pairs subscribed, for the log."""
        return ",".join(subscriber.channel for subscriber in self.subscribers)

    @property
    def delivering(self) -> bool:
        """False when notifications cannot be relied on: not connected, or probes lost."""
        return self.state == "listening"

    @property
    def hears(self) -> frozenset[int]:
        """The shares whose channels this connection LISTENs on now (none while it is down)."""
        if self.state == "connecting":
            return frozenset()
        return frozenset().union(*(subscriber.listening for subscriber in self.subscribers))

    @property
    def checking(self) -> bool:
        """True while this connection carries the health check (it is proven)."""
        return self.state == "listening" and self.proven

    def subscribe(self, subscriber: Subscriber) -> None:
        """Deliver ``subscriber``'s channels to it from now on, and carry its duties."""
        if subscriber.channel in self._routes:
            raise ConfigError(f"two pairs notify one channel: {subscriber.channel}")
        self.subscribers.append(subscriber)
        self._routes[subscriber.channel] = subscriber
        for channel in subscriber.share_channels:
            self._routes[channel] = subscriber
        subscriber.schedule.carry(self.checking)
        self._follow_soon()

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """Stop delivering to ``subscriber`` (its reactor stops); once none is left, the
        listener ends."""
        if subscriber not in self.subscribers:
            return
        self.subscribers.remove(subscriber)
        self._routes = {
            channel: other for channel, other in self._routes.items() if other is not subscriber
        }
        subscriber.schedule.carry(False)
        if not self.subscribers and self._lifetime is not None:
            self._lifetime.cancel()

    def refresh(self, subscriber: Subscriber) -> bool:
        """``subscriber``'s shares to LISTEN on may have changed: LISTEN on the ones gained,
        and UNLISTEN the ones lost, without waiting for the next duty. True when this
        connection will LISTEN on a share's channel it does not yet, and then re-arm from the
        database (a share gained was never held here)."""
        self._follow_soon()
        return self.checking and bool(subscriber.owned() - subscriber.listening)

    def readmit(self, subscriber: Subscriber) -> None:
        """``subscriber``'s check succeeded through the pool: a benched pair's duties come back
        to this session."""
        if subscriber.benched:
            subscriber.benched = False
            log.info("the pair's checks ride the LISTEN connection again")
            subscriber.schedule.carry(self.checking)

    def _follow_soon(self) -> None:
        self._stale = True
        if self._waiting is not None:
            # Delivered where psycopg waits on the socket, never inside a batch it read.
            self._waiting.cancel()

    async def run(self) -> None:
        """Listen until every subscriber left, reconnecting with jittered backoff.
        :attr:`settled` is set once the first attempt is over, whether LISTEN came up or not."""
        if not self.subscribers:
            return
        with anyio.CancelScope() as self._lifetime:
            await self._run()

    async def _run(self) -> None:
        permanent = False
        while True:
            if self.failures:
                cap = BACKOFF_CAP_PERMANENT if permanent else BACKOFF_CAP
                delay = backoff(
                    self.failures, cap=cap, base=self.backoff_base, rand=random.random()
                )
                log.debug("listener reconnects after a pause", extra={"delay_s": round(delay, 3)})
                await anyio.sleep(delay)
            try:
                # A hot standby refuses LISTEN anyway; refused here, the problem /readyz shows
                # names the fix. A failover's promoted standby is found by a later attempt.
                conn = await db.connect(
                    self.dsn,
                    db.LISTENER_ROLE,
                    configure_session=False,
                    standby="refuse",
                    source=self._source,
                )
            except ReactorError as error:
                permanent = isinstance(error, ConfigError)
                self._failed("listener cannot connect; polling meanwhile", str(error))
                continue
            permanent = False
            try:
                await self._session(conn)
            except (psycopg.Error, OSError, TimeoutError, ProbeLost) as error:
                self._failed(
                    "listener connection lost or refused; polling meanwhile", db.first_line(error)
                )
            finally:
                self._set_state("connecting")
                # Not `async with conn`: its exit awaits a rollback first, which a cancellation
                # (stop) interrupts before the connection is closed.
                with anyio.CancelScope(shield=True):
                    await conn.close()

    async def _session(self, conn: db.AnyConnection) -> None:
        """LISTEN on ``conn`` until the connection fails (it raises)."""
        self._channels_on = frozenset()
        for subscriber in self.subscribers:
            subscriber.listening = frozenset()
        self._prove(False)
        # The pairs' main channels now; the shares' follow once a probe proves the session.
        await self._follow(conn)
        identity = await db.session_identity(conn)
        self.connections += 1
        if self.connections > 1:
            self._each_metrics(lambda metrics: metrics.reconnects.inc())
            log.info("listener reconnected", extra={"channel": self.channel})
        self._set_state("listening")
        # Re-arm from the database: anything notified while we were away is found.
        for subscriber in list(self.subscribers):
            with on_behalf(subscriber):
                subscriber.on_listening()
        self.settled.set()
        try:
            await self._listen(conn)
        finally:
            if self.proven:
                self._previous = identity

    async def _end_previous_session(self, conn: db.AnyConnection) -> None:
        # A connection we gave up on (a silent partition, a probe timeout) may still be alive on
        # the server, registered as a listener that reads nothing: it holds the NOTIFY queue
        # back until the server's keepalives notice. End it now; a role may end its own sessions.
        # Only a session a probe proved our own, matched by pid *and* start time: through a
        # pooler, or once the pid is reused, the same pid is someone else's session.
        if self._previous is None:
            return
        try:
            await db.end_listener_session(conn, *self._previous)
        except psycopg.Error as error:
            log.debug("could not end the previous listener session", extra={"error": str(error)})

    def _failed(self, message: str, problem: str) -> None:
        self.failures += 1
        self._each_metrics(lambda metrics: metrics.listener_failures.inc())
        self._prove(False)
        self.settled.set()
        # Once per state change: the same failure again is not news, and a wrong password
        # would otherwise log a line every few seconds for ever.
        if problem != self.problem:
            log.warning(message, extra={"error": problem, "attempt": self.failures})
        else:
            log.debug(message, extra={"error": problem, "attempt": self.failures})
        self.problem = problem

    async def _listen(self, conn: db.AnyConnection) -> None:
        await self._send_probe()
        configured = False
        while True:
            if self._stale:
                with anyio.fail_after(self.settings.probe_timeout):
                    await self._follow(conn)
            wait = self._wait_time()
            wake = self.clock.now() + wait
            # Never left in the middle of a batch: psycopg drops what it has not yielded yet.
            # Unproven, it ends after any batch (which may hold the probe), so that once proven
            # the check and the polls are taken up at once. Closed explicitly: the generator
            # holds the connection's lock. A refresh cancels only the wait on the socket.
            with anyio.CancelScope() as self._waiting:
                if not self._stale:
                    arriving = conn.notifies(timeout=wait, stop_after=None if self.proven else 1)
                    async with contextlib.aclosing(arriving):
                        async for notify in arriving:
                            self._receive(notify.payload, notify.channel)
                            self.received += 1
                            if not self.received % TURN_EVERY:
                                # psycopg yields a whole batch read from the socket without a
                                # turn of the event loop: under a flood (anyone may NOTIFY)
                                # the timers would wait for it. Not a cancellation point, so
                                # no notification of the batch is dropped.
                                await anyio.lowlevel.cancel_shielded_checkpoint()
            self._waiting = None
            if self._stale:
                continue
            if not self.proven:
                if self.clock.now() < wake:
                    continue  # only other notifications: the probe's time is not up yet
                # Shielded, like the probe: a stop arriving mid-statement waits for it (bounded
                # by the probe timeout) rather than interrupting psycopg's own cancel, which
                # closes the connection and logs a warning.
                with anyio.CancelScope(shield=True), anyio.fail_after(self.settings.probe_timeout):
                    await conn.execute("SELECT 1")
                self._check_probe()
                if not self.proven:
                    if self.clock.now() - self._probe_sent >= self.settings.probe_interval:
                        await self._send_probe()
                    continue
            if not configured:
                # A probe from another session came back: this is a session of our own, not a
                # pooler's, and from now on it carries the health check.
                configured = True
                with anyio.fail_after(self.settings.probe_timeout):
                    await db.configure(conn)
                    await self._end_previous_session(conn)
                conn.prepare_threshold = db.PREPARE_THRESHOLD
                self._recovered()
                # The shares' channels now, however the probe came back.
                self._stale = True
                self._carry(True)
                # At once, not at the pool's next turn: this check's heartbeat names this
                # session, which tells the others at once if this process is killed.
                for subscriber in self.subscribers:
                    subscriber.schedule.hasten("health")
            if self._stale:
                continue
            await self._run_checks(conn)
            # The polls too (a no-op unless the trigger does not notify): one connection that
            # is already proven, rather than a pooled one checked at each checkout.
            for subscriber in self._carried():
                await self._run_poll(subscriber, conn)

    async def _follow(self, conn: db.AnyConnection) -> None:
        # From the channels LISTENed on to those wanted now, in one round trip: each pair's
        # main channel, and once a probe proved the session, the channels of its shares. LISTEN
        # first, re-arm after: a job of a gained share committed in between is heard, one
        # committed before is read by the re-arm.
        self._stale = False
        wanted: set[str] = set()
        gained: list[Subscriber] = []
        for subscriber in self.subscribers:
            shares = subscriber.owned() if self.proven else frozenset()
            wanted.add(subscriber.channel)
            wanted.update(subscriber.channels(shares))
            if shares - subscriber.listening:
                gained.append(subscriber)
            subscriber.listening = shares
        statement = change_statement(
            listen=sorted(wanted - self._channels_on), unlisten=sorted(self._channels_on - wanted)
        )
        if statement is not None:
            await conn.execute(statement)
        self._channels_on = frozenset(wanted)
        for subscriber in gained:
            with on_behalf(subscriber):
                subscriber.on_listening()

    def _carried(self) -> list[Subscriber]:
        # The pairs whose duties this session carries.
        return [subscriber for subscriber in self.subscribers if not subscriber.benched]

    async def _run_checks(self, conn: db.AnyConnection) -> None:
        # One check covers every pair this session carries: one pair's coming due (or asked
        # for early) brings the others' forward, so that they stay one statement.
        carried = self._carried()
        now = self.clock.now()
        if not any("health" in s.schedule.cadence.due(now, "listener") for s in carried):
            return
        due = []
        for subscriber in carried:
            subscriber.schedule.hasten("health")
            if subscriber.schedule.begin("health", "listener"):
                due.append(subscriber)
        failed: dict[Subscriber, BaseException] = {}
        try:
            failed = await self._check(conn, due)
        except BaseException as error:
            for subscriber in due:
                told = error if isinstance(error, DATABASE_ERRORS) else None
                subscriber.schedule.end("health", "listener", ok=False, error=told)
            raise
        for subscriber in due:
            subscriber.schedule.end("health", "listener", error=failed.get(subscriber))
            if subscriber in failed:
                self._bench(subscriber, failed[subscriber])

    async def _run_poll(self, subscriber: Subscriber, conn: db.AnyConnection) -> None:
        try:
            with on_behalf(subscriber):
                await subscriber.schedule.run_duty(
                    "poll", "listener", lambda: subscriber.poll(conn)
                )
        except psycopg.Error as error:
            if not (self._isolates and statement_failed(error, conn)):
                raise
            self._bench(subscriber, error)

    def _bench(self, subscriber: Subscriber, error: BaseException) -> None:
        if not subscriber.benched:
            with on_behalf(subscriber):
                log.warning(
                    "the pair's statements fail on the LISTEN connection; its checks go through "
                    "the pool",
                    extra={"channel": subscriber.channel, "error": db.first_line(error)},
                )
        subscriber.benched = True
        subscriber.schedule.carry(False)

    async def _check(
        self, conn: db.AnyConnection, due: list[Subscriber]
    ) -> dict[Subscriber, BaseException]:
        # The self-probe of the last check must be back by now; any notification since then
        # proved delivery as well.
        if self._probe_token is not None and not self._heard:
            raise ProbeLost("a probe this LISTEN session sent itself did not come back")
        token = None if self._heard else uuid.uuid4().hex
        self._probe_token = None
        self._heard = False
        self._probe_sent = self.clock.now()
        with anyio.CancelScope(shield=True), anyio.fail_after(self.settings.probe_timeout):
            sent, failed = await self.check(conn, due, None if token is None else _PROBE + token)
        # Expected back only when it went out: at a half-full NOTIFY queue the check skips it.
        if sent:
            self._probe_token = token
        return failed

    async def check_together(
        self, conn: db.AnyConnection, due: list[Subscriber], probe: str | None
    ) -> tuple[bool, dict[Subscriber, BaseException]]:
        """The health check of the pairs ``due`` on ``conn`` (see :func:`check_pairs`)."""
        return await check_pairs(conn, due, probe, sent=self.clock.now(), isolate=self._isolates)

    @property
    def _isolates(self) -> bool:
        # A statement that fails on its own costs only its pair when there are others; a lone
        # pair's failure makes the session suspect, as it always did.
        return len(self.subscribers) > 1

    def _recovered(self) -> None:
        if self.problem is not None:
            log.info("listener is back", extra={"channel": self.channel})
        self.problem = None
        self.failures = 0

    def _wait_time(self) -> float:
        # Wake up in time for the next check; unproven, to judge the outstanding probe or to
        # send the next one.
        now = self.clock.now()
        if self.proven:
            carried = self._carried()
            next_at = min(
                (
                    duty.next_at
                    for subscriber in carried
                    for name, duty in subscriber.schedule.cadence.duties.items()
                    if name in ("health", "poll")
                ),
                default=now + self.settings.probe_interval,
            )
            wait = max(0.01, next_at - now)
            settling = any(subscriber.settling() for subscriber in carried)
            return min(wait, SETTLING_TICK) if settling else wait
        if self._probe_token is not None:
            return max(0.01, self._probe_sent + self.settings.probe_timeout - now)
        return max(0.01, self._probe_sent + self.settings.probe_interval - now)

    def _receive(self, payload: str, channel: str | None = None) -> None:
        subscriber = (
            self._routes.get(channel) if channel is not None else next(iter(self.subscribers), None)
        )
        if subscriber is None:
            return  # a channel of a pair that has stopped
        with on_behalf(subscriber):
            self._deliver(subscriber, payload)

    def _deliver(self, subscriber: Subscriber, payload: str) -> None:
        if payload.startswith(_PROBE):
            subscriber.metrics.notified["probe"].inc()
            if payload[len(_PROBE) :] != self._probe_token:
                # Another replica's probe: as good a proof of delivery as any notification.
                self._heard = True
                return
            self._probe_token = None
            self.proven = True
            if self.state == "degraded":
                log.info("probe notifications arrive again; back to LISTEN")
            self._set_state("listening")
            return
        self._heard = True
        if payload.startswith(_LEFT):
            subscriber.metrics.notified["left"].inc()
            subscriber.on_left(payload[len(_LEFT) : len(_LEFT) + 64])
            return
        if payload.startswith(_JOINED):
            subscriber.metrics.notified["joined"].inc()
            subscriber.on_joined(payload[len(_JOINED) : len(_JOINED) + 64])
            return
        hint = parse_hint(payload, subscriber.id_type)
        if hint is None:
            subscriber.rejected(payload, self.clock.now())
            return
        subscriber.metrics.notified["accepted"].inc()
        subscriber.on_job(*hint)

    def _check_probe(self) -> None:
        late = self.clock.now() - self._probe_sent > self.settings.probe_timeout
        if self._probe_token is not None and late:
            self._probe_token = None
            if self.state != "degraded":
                log.error(
                    "LISTEN is connected but our probe notification never arrived: a "
                    "transaction-mode pooler (PgBouncer, Supavisor, RDS Proxy) drops them; set "
                    "REACTOR_LISTEN_DATABASE_URL to a direct connection or REACTOR_MODE=poll; "
                    "polling meanwhile",
                    extra={"channel": self.channel},
                )
            self._set_state("degraded")

    async def _send_probe(self) -> None:
        if not self.subscribers:
            return
        token = uuid.uuid4().hex
        self._probe_sent = self.clock.now()
        try:
            # Bounded: while the pool waits for a connection, this loop reads nothing.
            with anyio.CancelScope(shield=True), anyio.fail_after(self.settings.probe_timeout):
                await self.subscribers[0].database.notify(_PROBE + token)
        except (psycopg.Error, OSError, TimeoutError) as error:
            log.warning("could not send the delivery probe", extra={"error": db.first_line(error)})
            return
        self._probe_token = token

    def _each_metrics(self, update: Callable[[Metrics], object]) -> None:
        # The session is every pair's: each pair's metrics show it.
        for subscriber in self.subscribers:
            update(subscriber.metrics)

    def _set_state(self, state: State) -> None:
        self.state = state
        up = 1 if state == "listening" else 0
        self._each_metrics(lambda metrics: metrics.listener_up.set(up))
        if state != "listening":
            self._carry(False)

    def _carry(self, listener: bool) -> None:
        for subscriber in self.subscribers:
            subscriber.schedule.carry(listener and not subscriber.benched)

    def _prove(self, proven: bool) -> None:
        self.proven = proven
        if not proven:
            # The checks go back to the pool at once; they come back once a probe proves a
            # connection again and the session is configured.
            self._carry(False)
