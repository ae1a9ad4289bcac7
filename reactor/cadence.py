"""One schedule for the periodic duties: the health check, the poll, the scan, the reconcile.

Each duty has an interval, a failure policy (how soon after a failure it is tried again) and a
*carrier*: who runs it. The pool runs every duty, except that the health check rides the LISTEN
connection while the listener is proven (the same round trip proves that connection alive),
and goes back to the pool the moment it is not. :meth:`Cadence.begin` is the token: a duty runs
on one road at a time, is never stacked on itself, and its next run is scheduled as it begins,
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
from dataclasses import dataclass, field
from typing import Literal

import anyio
import anyio.abc

from reactor.backoff import exponential
from reactor.clock import Clock
from reactor.db import DATABASE_ERRORS

log = logging.getLogger(__name__)

Carrier = Literal["pool", "listener"]

# Seconds until a duty that failed ``failures`` times in a row is tried again.
RetryPolicy = Callable[[int], float]


def backoff(first: float, cap: float) -> RetryPolicy:
    """``first`` seconds after the first failure, doubling, at most ``cap``."""
    return lambda failures: exponential(failures, first=first, cap=cap)


@dataclass(slots=True)
class Duty:
    """One periodic duty's schedule."""

    name: str
    interval: float
    retry: RetryPolicy
    listener_may_carry: bool = False
    next_at: float = -math.inf  # due at once
    # The next run as begin() or pace() set it: next_at is earlier once something hastened it.
    scheduled: float = -math.inf
    running: Carrier | None = None
    failures: int = 0
    last_begun: float = -math.inf
    runs: int = 0


@dataclass
class Cadence:
    """The duties and who carries each."""

    duties: dict[str, Duty] = field(default_factory=dict)
    # True while the listener is proven: it carries the duties it may carry.
    listener_carries: bool = False

    def add(
        self,
        name: str,
        interval: float,
        *,
        retry: RetryPolicy,
        listener_may_carry: bool = False,
        first_at: float = -math.inf,
    ) -> None:
        """Schedule ``name`` every ``interval`` seconds, first at ``first_at`` (at once)."""
        self.duties[name] = Duty(name, interval, retry, listener_may_carry, next_at=first_at)

    def carrier(self, name: str) -> Carrier:
        """Who runs ``name`` now."""
        duty = self.duties[name]
        return "listener" if duty.listener_may_carry and self.listener_carries else "pool"

    def due(self, now: float, carrier: Carrier) -> list[str]:
        """The duties ``carrier`` should begin now."""
        return [
            duty.name
            for duty in self.duties.values()
            if duty.running is None and duty.next_at <= now and self.carrier(duty.name) == carrier
        ]

    def next_at(self, carrier: Carrier) -> float:
        """When ``carrier`` has the next duty to begin (inf: none it carries is idle)."""
        return min(
            (
                duty.next_at
                for duty in self.duties.values()
                if duty.running is None and self.carrier(duty.name) == carrier
            ),
            default=math.inf,
        )

    def begin(self, name: str, carrier: Carrier, now: float) -> bool:
        """Take the token for ``name``: True when ``carrier`` may run it now. Its next run is
        scheduled at once, one interval on."""
        duty = self.duties[name]
        if duty.running is not None or duty.next_at > now or self.carrier(name) != carrier:
            return False
        duty.running = carrier
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

    def end(
        self, name: str, carrier: Carrier, now: float, *, ok: bool, next_in: float | None = None
    ) -> None:
        """Give the token back. ``next_in``: the duty's own word on when it is due next (never
        later than its interval). A failure is retried by the duty's policy."""
        duty = self.duties[name]
        if duty.running != carrier:
            return
        duty.running = None
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
# Told of a duty's failure (log it, mark the database down): the duty, its road, the error.
OnFailure = Callable[[str, Carrier, BaseException], None]


class Scheduler:
    """Runs the pool's duties of a :class:`Cadence` on ``clock``."""

    def __init__(
        self,
        cadence: Cadence,
        clock: Clock,
        actions: dict[str, Action],
        *,
        on_failure: OnFailure,
    ) -> None:
        self.cadence = cadence
        self.clock = clock
        self.actions = actions
        self.on_failure = on_failure
        self._wake = anyio.Event()
        self._closed = False

    def hasten(self, name: str) -> None:
        """Run ``name`` now (or right after the run in progress)."""
        self.cadence.hasten(name, self.clock.now())
        self._wake.set()

    def pace(self, name: str, interval: float) -> None:
        """Run ``name`` next ``interval`` after its last run began (see :meth:`Cadence.pace`)."""
        self.cadence.pace(name, interval)
        self._wake.set()

    def carry(self, listener: bool) -> None:
        """The listener is proven (it carries its duties) or not (the pool takes them back)."""
        if self.cadence.listener_carries != listener:
            self.cadence.listener_carries = listener
            self._wake.set()

    def close(self) -> None:
        """Begin no more duties; those running finish."""
        self._closed = True
        self._wake.set()

    async def run(self, work: anyio.abc.TaskGroup) -> None:
        """Begin each due duty in ``work`` until :meth:`close`."""
        while not self._closed:
            now = self.clock.now()
            for name in self.cadence.due(now, "pool"):
                if self.cadence.begin(name, "pool", now):
                    work.start_soon(self._carry_out, name, "pool", self.actions[name])
            self._wake = anyio.Event()
            await self.clock.sleep_until(self.cadence.next_at("pool"), self._wake)

    async def run_duty(self, name: str, carrier: Carrier, action: Action) -> bool:
        """Run ``action`` as duty ``name`` for ``carrier`` if it holds the token now; True if it
        ran. A failure goes to ``on_failure`` and the duty's retry policy; on the listener's
        road it is raised too, since the connection it rode is suspect."""
        if not self.begin(name, carrier):
            return False
        await self._carry_out(name, carrier, action)
        return True

    def begin(self, name: str, carrier: Carrier) -> bool:
        """Take the token for ``name`` if ``carrier`` may run it now (see :meth:`Cadence.begin`);
        give it back with :meth:`end`."""
        return self.cadence.begin(name, carrier, self.clock.now())

    def end(
        self,
        name: str,
        carrier: Carrier,
        *,
        ok: bool = True,
        error: BaseException | None = None,
        next_in: float | None = None,
    ) -> None:
        """Give the token for ``name`` back: done, or failed (not ``ok``, or with ``error``,
        which ``on_failure`` is told of); a failure is retried by the duty's policy."""
        if error is not None:
            self.on_failure(name, carrier, error)
        ok = ok and error is None
        self.cadence.end(name, carrier, self.clock.now(), ok=ok, next_in=next_in)
        self._wake.set()

    async def _carry_out(self, name: str, carrier: Carrier, action: Action) -> None:
        try:
            next_in = await action()
        except DATABASE_ERRORS as error:
            self.end(name, carrier, error=error)
            if carrier == "listener":
                raise
            return
        except BaseException:
            # Cancelled, or a bug: retried by the duty's policy, and nobody is told.
            self.end(name, carrier, ok=False)
            raise
        self.end(name, carrier, next_in=next_in)
