"""A pair's poll of its queue, while notifications cannot be relied on, and its doorbell.

The poll sleeps while the pair's LISTEN session delivers and its trigger notifies; otherwise it
reads the queued jobs whose deadline comes within two poll intervals, every poll interval, and
offers them to the work queue. It rings or renews the doorbell when the jobs come fast enough
(:mod:`reactor.insurance.doorbell`).
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from reactor import db
from reactor.claim.dispatch import Intake, WorkQueue
from reactor.claim.sources import POLL
from reactor.core.clock import Clock
from reactor.core.ownership import ALL_SHARES
from reactor.insurance.cadence import Every, Scheduler, fleet_poll_interval
from reactor.insurance.doorbell import Doorbell
from reactor.listen.listener import Listener
from reactor.settings.config import Settings
from reactor.telemetry.metrics import Metrics

POLL_DUTY = "poll"

# Most queued jobs one poll offers; more (a burst) are read by the next poll, from where it ended.
POLL_LIMIT = 10_000


def every(settings: Settings) -> Every:
    """The poll's cadence: a failed poll is tried again one interval on."""
    return Every(POLL_DUTY, settings.poll_interval, retry=lambda failures: settings.poll_interval)


class TriggerSeen(Protocol):
    """What the health checks saw of the pair's trigger (:class:`reactor.runtime.vitals.Vitals`)."""

    @property
    def trigger(self) -> str:
        """The trigger's state: ``notifies`` when it notifies the pair's channel."""
        ...

    def polling(self, listener: Listener | None) -> bool:
        """True when timers must come from polling the queue rather than from notifications."""
        ...


@dataclass(eq=False, repr=False)
class PairPoll:
    """A pair's poll of its queue and its doorbell: what it reads goes through ``intake``, by
    the live set ``queue`` keeps; ``seen`` and ``listener`` say whether notifications can be
    relied on. ``runs``: the polls run so far."""

    settings: Settings
    database: db.Database
    _: KW_ONLY
    queue: WorkQueue
    intake: Intake
    seen: TriggerSeen
    listener: Listener | None
    schedule: Scheduler
    metrics: Metrics
    clock: Clock
    runs: int = field(default=0, init=False)
    # Where the next poll's window begins.
    low: datetime | None = field(default=None, init=False)
    doorbell: Doorbell = field(init=False)

    def __post_init__(self) -> None:
        # Rung while the notifications come fast (listen mode only: in poll mode nobody hears
        # them, and the trigger is best installed with --no-notify).
        self.doorbell = Doorbell(
            self.settings.doorbell_rate if self.settings.mode == "listen" else 0,
            self.settings.poll_interval,
            self.database.grace,
        )

    @property
    def polling(self) -> bool:
        """True when timers come from polling the queue rather than from notifications: they
        cannot be relied on, or the doorbell is (or was, within a grace) awake."""
        return self.seen.polling(self.listener) or self.doorbell.covers(self.clock.now())

    @property
    def rings_doorbell(self) -> bool:
        """Whether this pair rings its doorbell under a stream: only a trigger that notifies its
        channel reads it, spread over a channel per share or not."""
        return self.seen.trigger == "notifies"

    def wake_if_needed(self) -> None:
        """Wake the poll, which sleeps while notifications are relied on, when they may no
        longer be: called as the LISTEN session changes state and after each check (the
        trigger's state, the NOTIFY queue's usage). A poll already on its cadence is left to
        it: brought forward at every check, a fleet's replica would poll more often than its
        share of the fleet's polls."""
        if self.polling and self.schedule.cadence.duties[POLL_DUTY].next_at == math.inf:
            self.schedule.hasten(POLL_DUTY)

    def heard(self) -> None:
        """A job was notified: when they come fast enough, the next poll rings the doorbell;
        from then on the app's commits stop notifying."""
        if self.rings_doorbell and self.doorbell.heard(self.clock.now()):
            self.schedule.hasten(POLL_DUTY)

    def rang(self) -> None:
        """A replica rang the doorbell: the app's commits may have stopped notifying, so poll
        from now on, before any job they queued comes due."""
        self.doorbell.told()
        self.schedule.hasten(POLL_DUTY)

    async def run(self) -> None:
        """One poll: every poll interval, the queued jobs whose deadline comes within two
        intervals, offered to the pair's work queue; the doorbell rung or renewed when the
        jobs come fast enough (:mod:`reactor.insurance.doorbell`)."""
        # Windows overlap by that much, so a job queued by a transaction that was still open at
        # the last poll is read now (one that committed after its deadline is the scan's).
        if not self.polling:
            # Asleep until the pair may need it again (wake_if_needed wakes it): an idle
            # replica would otherwise wake four times a second to find nothing to do.
            self.low = None
            self.schedule.pace(POLL_DUTY, math.inf)
            return
        # The view of the live set that intake keeps the jobs by.
        membership = self.queue.membership
        interval = fleet_poll_interval(
            self.settings.poll_interval, len(membership.live), self.database.grace
        )
        ahead = 2 * interval
        bell = self.doorbell
        bell.pace(interval)
        rings = self.rings_doorbell
        shares = membership.shares
        try:
            polled = await self.database.poll_queue(
                self.low,
                ahead=ahead,
                limit=POLL_LIMIT,
                ring=rings and bell.ring(),
                lease=bell.lease,
                # The arrivals only judge whether to ring again: none counted where it is not.
                recent=interval if rings else 0.0,
                # The others' jobs would be dropped at intake: not read at all.
                shares=None if shares == ALL_SHARES else shares,
            )
        except BaseException:
            self.low = None
            raise
        self.runs += 1
        bell.polled(self.clock.now(), polled.bell_in, polled.arrivals)
        self.metrics.doorbell_awake.set(1 if bell.awake(self.clock.now()) else 0)
        jobs = polled.jobs
        self.intake.intake(POLL.hints((job.job_id, job.due_in) for job in jobs))
        full = len(jobs) >= POLL_LIMIT
        self.low = jobs[-1].since if full else polled.high - timedelta(seconds=ahead)
        if interval > self.settings.poll_interval:
            self.schedule.pace(POLL_DUTY, interval)
