"""A pair's fallback scan: the pass over its queue that records what came due unheard.

It runs on the pair's schedule, when asked (LISTEN came up, the replicas changed, a job was
released), and after a failure until it passes. Asked with a re-arm, it first offers the jobs
inside their grace to the work queue; the first re-arm is when the pair starts holding its share
of the jobs.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from reactor.claim.sources import REARM, STUCK
from reactor.telemetry import tracing

if TYPE_CHECKING:
    from reactor.runtime.service import Reactor

# Named as these log lines were before they had a module of their own.
log = logging.getLogger("reactor.runtime.service")


class PairScan:
    """``reactor``'s fallback scan; ``runs``: the scans run so far."""

    def __init__(self, reactor: Reactor) -> None:
        self.reactor = reactor
        self.runs = 0
        self._requested = False
        self._rearm_wanted = False
        # Whether this replica holds its share: its first re-arm read the queue. Until then it
        # writes no heartbeat, so the others go on holding the jobs it will own.
        self.holding = False

    def request(self, *, rearm: bool) -> None:
        """Run the scan soon; with ``rearm``, also offer upcoming jobs from the queue."""
        self._rearm_wanted |= rearm
        self._requested = True
        self.reactor.schedule.hasten("scan")

    @property
    def pending(self) -> bool:
        """True while a scan is asked for, running, or waiting to retry a failure."""
        scan = self.reactor.cadence.duties["scan"]
        return self._requested or scan.running or scan.failures > 0

    async def duty(self) -> None:
        """The scan as the schedule begins it: skipped when nothing can be found."""
        reactor = self.reactor
        requested, self._requested = self._requested, False
        rearm, self._rearm_wanted = self._rearm_wanted, False
        retrying = reactor.cadence.duties["scan"].failures > 0
        if not (requested or rearm or retrying) and reactor.vitals.nothing_overdue():
            # The health check just read the queue and found nothing past its grace: a
            # periodic scan would find nothing either.
            return
        await self.run(rearm=rearm)

    async def run(self, *, rearm: bool) -> int:
        """One pass: see :meth:`Reactor.scan <reactor.runtime.service.Reactor.scan>`."""
        reactor = self.reactor
        clock = reactor.clock
        started = clock.now()
        try:
            with tracing.span("reactor.scan", rearm=rearm) as traced:
                if rearm:
                    upcoming = await reactor.database.upcoming(reactor.settings.max_pending)
                    reactor.dispatcher.intake(REARM.hints(upcoming))
                    if not self.holding:
                        # The first heartbeat, and the word that this replica joined, now
                        # rather than at the next check, a probe interval on.
                        self.holding = True
                        reactor.schedule.hasten("health")
                drained = await reactor.recorder.drain(
                    reactor.settings.batch_size, skip=reactor.queue.claimed
                )
                traced.set(recorded=drained.recorded)
            # Settled on this road: no claim of the queue's is needed; stuck: claimed alone.
            reactor.queue.forget(drained.settled)
            reactor.dispatcher.intake(STUCK.hints(drained.stuck))
        except BaseException:
            self._rearm_wanted |= rearm
            raise
        finally:
            self.runs += 1
            reactor.metrics.scan_duration.observe(clock.now() - started)
        if drained.recorded:
            log.info("scan recorded runs", extra={"recorded": drained.recorded})
        return drained.recorded
