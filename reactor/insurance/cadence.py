"""One schedule for the periodic duties: the health check, the poll, the scan, the reconcile.

Each duty has an interval and a failure policy (how soon after a failure it is tried again);
every duty runs through the pool, since the LISTEN connection only listens. :meth:`Cadence.begin`
is the token: a duty is never stacked on itself, and its next run is scheduled as it begins,
so a failure cannot lose it (psycopg_pool's scheduler does the same). :meth:`Cadence.hasten`
brings a duty forward (a scan was asked for, a reconcile pass requested); asked while the duty
runs, it runs again right after. :meth:`Cadence.pace` puts a duty's next run further off than
its interval, once (the health check of a replica with nothing to change).

:class:`Cadence` is pure: no I/O, no clock; every method that needs the time takes ``now``.
:class:`Scheduler` is the pool's side: one loop that starts each due duty in the service's task
group and sleeps on the injected clock until the next one, or until something hastens one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field

import anyio
import anyio.abc

from reactor.core.backoff import exponential
from reactor.core.clock import Clock

log = logging.getLogger(__name__)


def fleet_poll_interval(base: float, live: int, grace: float) -> float:
    """How often each of ``live`` replicas polls the queue, for a poll every ``base`` seconds.

    Each replica's poll reads only the jobs of its own shares, so in a fleet it is a statement
    per replica for the same rows: polling every ``base`` seconds *per replica*, the fleet
    polls as often as one replica does. A poll arms the jobs due within two of its intervals,
    and a job is due a grace after it was queued, so a job is read before it is due while the
    interval stays within the grace, less its commit's lag: the stretch stops at half the grace
    (never below ``base``).
    """
    return max(base, min(base * max(live, 1), grace / 2))


# Seconds until a duty that failed ``failures`` times in a row is tried again.
RetryPolicy = Callable[[int], float]


def backoff(first: float, cap: float) -> RetryPolicy:
    """``first`` seconds after the first failure, doubling, at most ``cap``."""
    return lambda failures: exponential(failures, first=first, cap=cap)


@dataclass(frozen=True, slots=True)
class Every:
    """A duty's entry in the cadence, declared by the pass that runs it: its name, its interval,
    how soon a failure is tried again, and when it first runs (at once)."""

    name: str
    interval: float
    retry: RetryPolicy
    first_at: float = -math.inf


@dataclass(slots=True)
class Duty:
    """One periodic duty's schedule."""

    name: str
    interval: float
    retry: RetryPolicy
    next_at: float = -math.inf  # due at once
    # The next run as begin() or pace() set it: next_at is earlier once something hastened it.
    scheduled: float = -math.inf
    running: bool = False
    failures: int = 0
    last_begun: float = -math.inf
    runs: int = 0


@dataclass
class Cadence:
    """The duties and when each is due."""

    duties: dict[str, Duty] = field(default_factory=dict)
    # Duties whose runs another loop begins (the replica's, for all its pairs at once): kept
    # here for their schedule, never due here.
    held: set[str] = field(default_factory=set)

    def add(
        self,
        name: str,
        interval: float,
        *,
        retry: RetryPolicy,
        first_at: float = -math.inf,
    ) -> None:
        """Schedule ``name`` every ``interval`` seconds, first at ``first_at`` (at once)."""
        self.duties[name] = Duty(name, interval, retry, next_at=first_at)

    def enter(self, every: Every) -> None:
        """Schedule the duty ``every`` declares."""
        self.add(every.name, every.interval, retry=every.retry, first_at=every.first_at)

    def due(self, now: float) -> list[str]:
        """The duties to begin now."""
        return [
            duty.name
            for duty in self.duties.values()
            if not duty.running and duty.next_at <= now and duty.name not in self.held
        ]

    def next_at(self) -> float:
        """When the next duty is to begin (inf: none is idle)."""
        return min(
            (
                duty.next_at
                for duty in self.duties.values()
                if not duty.running and duty.name not in self.held
            ),
            default=math.inf,
        )

    def begin(self, name: str, now: float) -> bool:
        """Take the token for ``name``: True when it may run now. Its next run is scheduled at
        once, one interval on."""
        duty = self.duties[name]
        if duty.running or duty.next_at > now:
            return False
        duty.running = True
        duty.last_begun = now
        duty.next_at = duty.scheduled = now + duty.interval
        return True

    def pace(self, name: str, interval: float) -> None:
        """Run ``name`` next ``interval`` seconds after its last run began, rather than its own
        interval, unless something brought it forward since it began (a failure's retry, a
        hasten). The run after that is back at the duty's interval unless paced again."""
        duty = self.duties[name]
        if duty.next_at != duty.scheduled:
            return
        duty.next_at = duty.scheduled = duty.last_begun + interval

    def end(self, name: str, now: float, *, ok: bool, next_in: float | None = None) -> None:
        """Give the token back. ``next_in``: the duty's own word on when it is due next (never
        later than its interval). A failure is retried by the duty's policy."""
        duty = self.duties[name]
        if not duty.running:
            return
        duty.running = False
        duty.runs += 1
        if ok:
            duty.failures = 0
            if next_in is not None:
                duty.next_at = min(duty.next_at, now + max(0.0, next_in))
            return
        duty.failures += 1
        duty.next_at = min(duty.next_at, now + duty.retry(duty.failures))

    def hasten(self, name: str, now: float) -> None:
        """Run ``name`` now, or right after the run in progress."""
        duty = self.duties[name]
        duty.next_at = min(duty.next_at, now)


# A duty's work: returns when it is due next (None: one interval on), raises on failure.
Action = Callable[[], Awaitable[float | None]]
# Told of a duty's failure (log it, mark the database down): the duty and the error.
OnFailure = Callable[[str, BaseException], None]


@dataclass(eq=False, repr=False)
class Scheduler:
    """Runs the duties of a :class:`Cadence` on ``clock``."""

    cadence: Cadence
    clock: Clock
    actions: dict[str, Action]
    _: KW_ONLY
    on_failure: OnFailure
    # What a duty's failure looks like (the database's errors): retried by the duty's
    # policy and told to on_failure; anything else is a bug, and raised.
    failures: tuple[type[BaseException], ...]
    _wake: anyio.Event = field(default_factory=anyio.Event, init=False)
    _closed: bool = field(default=False, init=False)
    # Who begins each held duty: woken whenever its schedule changes here.
    _holders: dict[str, Callable[[], None]] = field(default_factory=dict, init=False)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def add(self, every: Every, action: Action) -> None:
        """Run ``action`` on the cadence ``every`` declares, from the next :meth:`run`."""
        self.cadence.enter(every)
        self.actions[every.name] = action

    def hold(self, name: str, wake: Callable[[], None]) -> None:
        """Leave ``name``'s runs to another loop, which ``wake`` wakes whenever its schedule
        changes here (hastened, paced, or this schedule closed): it begins and ends them
        through this cadence and :meth:`end`."""
        self.cadence.held.add(name)
        self._holders[name] = wake

    def hasten(self, name: str) -> None:
        """Run ``name`` now (or right after the run in progress)."""
        self.cadence.hasten(name, self.clock.now())
        self._changed(name)

    def pace(self, name: str, interval: float) -> None:
        """Run ``name`` next ``interval`` after its last run began (see :meth:`Cadence.pace`)."""
        self.cadence.pace(name, interval)
        self._changed(name)

    def close(self) -> None:
        """Begin no more duties; those running finish."""
        self._closed = True
        self._wake.set()
        for wake in self._holders.values():
            wake()

    def _changed(self, name: str) -> None:
        holder = self._holders.get(name)
        if holder is not None:
            holder()
        self._wake.set()

    async def run(self, work: anyio.abc.TaskGroup) -> None:
        """Begin each due duty in ``work`` until :meth:`close`."""
        while not self._closed:
            now = self.clock.now()
            for name in self.cadence.due(now):
                if self.cadence.begin(name, now):
                    work.start_soon(self._carry_out, name, self.actions[name])
            self._wake = anyio.Event()
            await self.clock.sleep_until(self.cadence.next_at(), self._wake)

    def end(
        self,
        name: str,
        *,
        ok: bool = True,
        error: BaseException | None = None,
        next_in: float | None = None,
    ) -> None:
        """Give the token for ``name`` back: done, or failed (not ``ok``, or with ``error``,
        which ``on_failure`` is told of); a failure is retried by the duty's policy."""
        if error is not None:
            self.on_failure(name, error)
        ok = ok and error is None
        self.cadence.end(name, self.clock.now(), ok=ok, next_in=next_in)
        self._wake.set()

    async def _carry_out(self, name: str, action: Action) -> None:
        try:
            next_in = await action()
        except self.failures as error:
            self.end(name, error=error)
            return
        except BaseException:
            # Cancelled, or a bug: retried by the duty's policy, and nobody is told.
            self.end(name, ok=False)
            raise
        self.end(name, next_in=next_in)
