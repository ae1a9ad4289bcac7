"""A pair's fallback scan: the pass over its queue that records what came due unheard.

It runs on the pair's schedule, when asked (LISTEN came up, the replicas changed, a job was
released), and after a failure until it passes. Asked with a re-arm, it first offers the jobs
inside their grace to the work queue; the first re-arm is when the pair starts holding its share
of the jobs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass, field
from typing import Protocol

from reactor import db
from reactor.claim.dispatch import Intake, WorkQueue
from reactor.claim.sources import REARM, STUCK
from reactor.core.clock import Clock
from reactor.insurance.cadence import Every, Scheduler, backoff
from reactor.record.recorder import Drained
from reactor.settings.config import Settings
from reactor.telemetry import tracing
from reactor.telemetry.metrics import Metrics

# Named as these log lines were before they had a module of their own.
log = logging.getLogger("reactor.runtime.service")

SCAN = "scan"


def every(settings: Settings) -> Every:
    """The scan's cadence: after a failed scan, try again soon (the database is likely back
    within seconds and the jobs it missed are waiting), backing off up to the normal interval."""
    return Every(SCAN, settings.scan_interval, retry=backoff(0.5, settings.scan_interval))


class Drains(Protocol):
    """What records the due backlog (:class:`reactor.record.recorder.Recorder`)."""

    async def drain(self, batch_size: int, *, skip: Iterable[str] = ()) -> Drained:
        """Record the due jobs, oldest first, leaving out ``skip``."""
        ...


class Backlog(Protocol):
    """What the last health check read of the queue (:class:`reactor.runtime.vitals.Vitals`)."""

    def nothing_overdue(self) -> bool:
        """True when it found nothing past its grace."""
        ...


@dataclass(eq=False, repr=False)
class PairScan:
    """A pair's fallback scan: upcoming jobs offered through ``intake``, the due backlog drained
    by ``recorder``, leaving out what ``queue`` claims; ``runs``: the scans run so far."""

    settings: Settings
    database: db.Database
    _: KW_ONLY
    queue: WorkQueue
    intake: Intake
    recorder: Drains
    backlog: Backlog
    schedule: Scheduler
    metrics: Metrics
    clock: Clock
    runs: int = field(default=0, init=False)
    _requested: bool = field(default=False, init=False)
    _rearm_wanted: bool = field(default=False, init=False)
    # Whether this replica holds its share: its first re-arm read the queue. Until then it
    # writes no heartbeat, so the others go on holding the jobs it will own.
    holding: bool = field(default=False, init=False)

    def request(self, *, rearm: bool) -> None:
        """Run the scan soon; with ``rearm``, also offer upcoming jobs from the queue."""
        self._rearm_wanted |= rearm
        self._requested = True
        self.schedule.hasten(SCAN)

    @property
    def pending(self) -> bool:
        """True while a scan is asked for, running, or waiting to retry a failure."""
        scan = self.schedule.cadence.duties[SCAN]
        return self._requested or scan.running or scan.failures > 0

    async def duty(self) -> None:
        """The scan as the schedule begins it: skipped when nothing can be found."""
        requested, self._requested = self._requested, False
        rearm, self._rearm_wanted = self._rearm_wanted, False
        retrying = self.schedule.cadence.duties[SCAN].failures > 0
        if not (requested or rearm or retrying) and self.backlog.nothing_overdue():
            # The health check just read the queue and found nothing past its grace: a
            # periodic scan would find nothing either.
            return
        await self.run(rearm=rearm)

    async def run(self, *, rearm: bool) -> int:
        """One pass: offer upcoming jobs if asked, then record the due backlog, oldest first,
        leaving out the jobs the work queue holds a claim of. Returns the runs recorded; raises
        when the database failed the pass (a re-arm asked for is kept for the retry)."""
        started = self.clock.now()
        try:
            with tracing.span("reactor.scan", rearm=rearm) as traced:
                if rearm:
                    upcoming = await self.database.upcoming(self.settings.max_pending)
                    self.intake.intake(REARM.hints(upcoming))
                    if not self.holding:
                        # The first heartbeat, and the word that this replica joined, now
                        # rather than at the next check, a probe interval on.
                        self.holding = True
                        self.schedule.hasten("health")
                drained = await self.recorder.drain(
                    self.settings.batch_size, skip=self.queue.claimed
                )
                traced.set(recorded=drained.recorded)
            # Settled on this road: no claim of the queue's is needed; stuck: claimed alone.
            self.queue.forget(drained.settled)
            self.intake.intake(STUCK.hints(drained.stuck))
        except BaseException:
            self._rearm_wanted |= rearm
            raise
        finally:
            self.runs += 1
            self.metrics.scan_duration.observe(self.clock.now() - started)
        if drained.recorded:
            log.info("scan recorded runs", extra={"recorded": drained.recorded})
        return drained.recorded
