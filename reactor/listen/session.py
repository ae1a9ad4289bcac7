"""The LISTEN session as a state machine: an event and the time give the next state and what to
do; pure (no I/O, no clock, the randomness passed in), in the manner of h11.

States:

- ``waiting``: no connection; the next attempt is due at :attr:`Session.retry_at`.
- ``connecting``: a :class:`Connect` is out.
- ``listening``: connected and LISTENing on the main channels; a probe sent from another
  session is out (or due) and has not come back yet.
- ``degraded``: connected, but a probe from another session did not come back in time (what a
  transaction-mode pooler gives): the replica polls, probes go on, each lost one pings the
  session to find out whether it is still there.
- ``proven``: a probe from another session came back: notifications are delivered. The session
  settings are applied, the shares' channels are LISTENed on, and from then on each of the
  replica's health checks (through the pool) carries a probe; one that is not back within
  ``patience`` (and nothing else arrived since it went) ends the session, so a dead, frozen or
  deaf connection is replaced within two probe intervals. A check that failed, or could not send
  the probe, pings the session instead.

Events are the methods :meth:`Session.tick`, :meth:`connected`, :meth:`connect_failed`,
:meth:`lost`, :meth:`changed`, :meth:`want`, :meth:`probe_heard`, :meth:`heard`,
:meth:`probe_for_check` and :meth:`probe_sent`; each returns the actions to perform, in order.
Nothing runs on the session but LISTEN/UNLISTEN (:class:`Change`), the ping of an unproven one
(:class:`Ping`) and the settings once (:class:`Configure`): a statement that runs while a flood
arrives makes psycopg keep every notification of it in memory until the next read.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from reactor.core.backoff import BACKOFF_BASE_S, BACKOFF_CAP_PERMANENT_S, BACKOFF_CAP_S, backoff

Phase = Literal["waiting", "connecting", "listening", "degraded", "proven"]


@dataclass(frozen=True, slots=True)
class Connect:
    """Open a connection; then :meth:`Session.connected` or :meth:`Session.connect_failed`."""


@dataclass(frozen=True, slots=True)
class Change:
    """LISTEN on ``listen`` and UNLISTEN ``unlisten``, in one round trip; then
    :meth:`Session.changed` (or :meth:`Session.lost`)."""

    listen: tuple[str, ...]
    unlisten: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Rearm:
    """``channels`` are LISTENed on from now: read from the database what was notified on them
    before."""

    channels: frozenset[str]


@dataclass(frozen=True, slots=True)
class Probe:
    """Send ``token`` as a probe from another session now; then :meth:`Session.probe_sent`."""

    token: str


@dataclass(frozen=True, slots=True)
class Ping:
    """One bounded round trip on the session: a probe was lost, is the session still there?
    A failure is :meth:`Session.lost`."""


@dataclass(frozen=True, slots=True)
class Configure:
    """A probe proved the session a session of its own: apply the session settings."""


@dataclass(frozen=True, slots=True)
class Close:
    """Close the connection: ``problem`` ended it."""

    problem: str


@dataclass(frozen=True, slots=True)
class Report:
    """Say ``message``: a failure's ``problem`` (``news`` when it is not the one said last), or
    with ``problem`` None a change of state, an error when ``alarm``."""

    message: str
    problem: str | None
    news: bool = True
    alarm: bool = False


Action = Connect | Change | Rearm | Probe | Ping | Configure | Close | Report

PROBE_LOST = "a probe this LISTEN session was sent did not come back"
_LOST = "listener connection lost or refused; polling meanwhile"


class Session:
    """One LISTEN session's state; see the module's docstring."""

    def __init__(
        self,
        *,
        probe_interval: float,
        probe_timeout: float,
        backoff_base: float = BACKOFF_BASE_S,
        rand: Callable[[], float] = random.random,
        token: Callable[[], str] = lambda: uuid.uuid4().hex,
    ) -> None:
        self.probe_interval = probe_interval
        self.probe_timeout = probe_timeout
        # How long a proven session's probe may take to come back: until the next check.
        self.patience = max(probe_interval, probe_timeout)
        self.backoff_base = backoff_base
        self._rand = rand
        self._token = token
        self.phase: Phase = "waiting"
        self.retry_at = -math.inf
        self.failures = 0
        self._permanent = False
        # The last problem said, so that the same one again is not news.
        self.problem: str | None = None
        self.main: frozenset[str] = frozenset()
        self.shares: frozenset[str] = frozenset()
        # The channels LISTENed on now, and the change in flight.
        self.on: frozenset[str] = frozenset()
        self._changing: Change | None = None
        self.connections = 0
        self.probe_token: str | None = None
        # When the probe out went (None: asked of the check, not yet sent).
        self.probe_sent_at: float | None = None

    @property
    def proven(self) -> bool:
        """True while a probe from another session proved this connection."""
        return self.phase == "proven"

    @property
    def is_open(self) -> bool:
        """True while a connection is open."""
        return self.phase in ("listening", "degraded", "proven")

    def wanted(self) -> frozenset[str]:
        """The channels to LISTEN on now: the main ones, and the shares' once proven."""
        return self.main | self.shares if self.proven else self.main

    # -- events --------------------------------------------------------------------------------

    def tick(self, now: float) -> list[Action]:
        """Time passed: what is due at ``now``."""
        if self.phase == "waiting" and now >= self.retry_at:
            self.phase = "connecting"
            return [Connect()]
        if self.phase in ("listening", "degraded"):
            return self._tick_unproven(now)
        if self.phase == "proven" and self._probe_late(now, self.patience):
            return self._end(
                now, PROBE_LOST, "listener connection lost or refused; polling meanwhile"
            )
        return []

    def _tick_unproven(self, now: float) -> list[Action]:
        if self.probe_token is not None and self._probe_late(now, self.probe_timeout):
            self.probe_token = None
            actions: list[Action] = [Ping()]
            if self.phase == "listening":
                self.phase = "degraded"
                actions.insert(
                    0,
                    Report(
                        "LISTEN is connected but our probe notification never arrived: a "
                        "transaction-mode pooler (PgBouncer, Supavisor, RDS Proxy) drops them; "
                        "set REACTOR_LISTEN_DATABASE_URL to a direct connection or "
                        "REACTOR_MODE=poll; polling meanwhile",
                        None,
                        alarm=True,
                    ),
                )
            return actions
        sent = -math.inf if self.probe_sent_at is None else self.probe_sent_at
        if (
            self.probe_token is None
            and self._changing is None
            and now >= sent + self.probe_interval
        ):
            return self._probe(now)
        return []

    def _probe_late(self, now: float, bound: float) -> bool:
        sent = self.probe_sent_at
        return self.probe_token is not None and sent is not None and now >= sent + bound

    def _probe(self, now: float) -> list[Action]:
        self.probe_token = self._token()
        self.probe_sent_at = now
        return [Probe(self.probe_token)]

    def connected(self, now: float) -> list[Action]:
        """The connection opened: LISTEN on the main channels."""
        del now
        self.phase = "listening"
        self.connections += 1
        self.on = frozenset()
        self.probe_token = None
        self.probe_sent_at = None
        return self._follow()

    def connect_failed(self, now: float, problem: str, *, permanent: bool) -> list[Action]:
        """The connection could not open (``permanent``: retrying soon cannot fix it)."""
        self._permanent = permanent
        return self._fail(now, problem, "listener cannot connect; polling meanwhile")

    def lost(self, now: float, problem: str) -> list[Action]:
        """The session failed (a statement on it, or reading from it)."""
        return self._end(now, problem, _LOST)

    def _end(self, now: float, problem: str, message: str) -> list[Action]:
        self._permanent = False
        return [Close(problem), *self._fail(now, problem, message)]

    def _fail(self, now: float, problem: str, message: str) -> list[Action]:
        self.phase = "waiting"
        self.on = frozenset()
        self._changing = None
        self.probe_token = None
        self.failures += 1
        cap = BACKOFF_CAP_PERMANENT_S if self._permanent else BACKOFF_CAP_S
        delay = backoff(self.failures, cap=cap, base=self.backoff_base, rand=self._rand())
        self.retry_at = now + delay
        news = problem != self.problem
        self.problem = problem
        return [Report(message, problem, news)]

    def want(self, main: frozenset[str], shares: frozenset[str]) -> list[Action]:
        """The channels to LISTEN on changed (a pair came or went, its shares changed)."""
        self.main, self.shares = main, shares
        return self._follow()

    def _follow(self) -> list[Action]:
        if not self.is_open or self._changing is not None:
            return []
        wanted = self.wanted()
        if wanted == self.on:
            return []
        self._changing = Change(tuple(sorted(wanted - self.on)), tuple(sorted(self.on - wanted)))
        return [self._changing]

    def changed(self, now: float) -> list[Action]:
        """The :class:`Change` out is done."""
        change, self._changing = self._changing, None
        if change is None or not self.is_open:
            return []
        gained = frozenset(change.listen)
        first = not self.on
        self.on = (self.on | gained) - frozenset(change.unlisten)
        actions: list[Action] = [Rearm(gained)] if gained else []
        # The first proof goes out once the main channels are LISTENed on.
        if first and self.phase == "listening" and self.probe_token is None:
            actions += self._probe(now)
        return actions + self._follow()

    def probe_sent(self, token: str, now: float, *, went: bool) -> list[Action]:
        """The probe ``token`` went out at ``now``, or could not (``went`` False: the pool is
        down, or the NOTIFY queue is half full): then it is not waited for."""
        if token != self.probe_token:
            return []
        if went:
            self.probe_sent_at = now
            return []
        self.probe_token = None
        # The check failed (or skipped it): the pool cannot vouch for this session now, so one
        # round trip on it does, lest a partition leave it LISTENing where nothing arrives.
        return [Ping()] if self.proven else []

    def probe_heard(self, token: str) -> list[Action]:
        """A probe came back on the session."""
        if token != self.probe_token:
            # Another replica's probe: as good a proof of delivery as any notification.
            return self.heard()
        self.probe_token = None
        if self.phase not in ("listening", "degraded"):
            return []
        back = self.phase == "degraded"
        self.phase = "proven"
        actions: list[Action] = [Configure()]
        if self.problem is not None or back:
            actions.append(Report("listener is back", None))
        self.problem = None
        self.failures = 0
        return actions + self._follow()

    def heard(self) -> list[Action]:
        """A notification arrived: delivery works, a probe out need not come back."""
        if self.proven:
            self.probe_token = None
        return []

    def probe_for_check(self) -> str | None:
        """The replica's health check is about to run: the probe it should carry to this
        session, when proven and none is out (None otherwise). Every check carries one, even
        after other notifications arrived: those prove the session up to their arrival, not
        after it, and a partition that fell since would go unnoticed for another interval."""
        if not self.proven or self.probe_token is not None:
            return None
        self.probe_token = self._token()
        self.probe_sent_at = None
        return self.probe_token

    # -- when to look again ----------------------------------------------------------------------

    def wake_at(self) -> float:
        """When :meth:`tick` has something to do next, at the latest."""
        if self.phase == "waiting":
            return self.retry_at
        sent = self.probe_sent_at
        if self.phase == "proven":
            return sent + self.patience if self.probe_token and sent is not None else math.inf
        if self.phase in ("listening", "degraded"):
            if sent is None:
                return math.inf  # the first probe goes once LISTEN is done
            bound = self.probe_timeout if self.probe_token is not None else self.probe_interval
            return sent + bound
        return math.inf
