"""The level-triggered half: a periodic walk of the job table that repairs the pending queue.

The triggers and NOTIFY are the edge: fast, cheap, and blind to anything that goes around them
(a data-only restore, logical replication, a disabled trigger, queue rows deleted by hand). The
job table is the truth, so every ``REACTOR_RECONCILE_INTERVAL_SECONDS`` a pass walks the jobs that
can still need a run and queues the ones missing from ``reactor.pending``, as controller-runtime's
periodic resync does for missed events. A job it finds keeps its full grace: the reactor arms its
timer, which fires at once for a job already due.

The pass is shared through one row of ``reactor.reconcile``: each step walks one chunk under that
row's lock, and the replica that stepped holds a lease on the pass, so one pass runs at a time
across replicas, a pass never stacks on itself, and a replica that dies mid-pass hands it on when
its lease runs out. On SIGTERM the replica stops between steps and gives its lease back.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import KW_ONLY, dataclass, field

import anyio

from reactor import db
from reactor.claim.dispatch import Intake
from reactor.claim.sources import RECONCILE
from reactor.core.clock import Clock
from reactor.insurance.cadence import Every, backoff
from reactor.settings.config import Settings
from reactor.telemetry import tracing
from reactor.telemetry.metrics import Metrics

log = logging.getLogger(__name__)

# Between two steps, the walk rests as long as the step took: it keeps the database at most
# half as busy as it could, and yields to the app's queries.
_MIN_REST_S = 0.005
# After a failed step: retry soon, backing off to this.
MAX_ERROR_WAIT_S = 30.0

# A step's chunk is sized by time, not rows: each statement aims at STEP_TARGET_S seconds, well
# inside its 50 ms bound on any table and host, and the fixed cost of a step (its round trip, the
# state row's lock and update, the commit) is spread over as many jobs as that allows. The first
# step of a replica walks db.RECONCILE_CHUNK jobs; a chunk at most doubles from one step to the
# next, so one slow stretch of the table cannot be met with a chunk sized on a fast one.
STEP_TARGET_S = 0.015
MIN_CHUNK = 250
MAX_CHUNK = 32_000


def every(settings: Settings) -> Every:
    """The reconcile's cadence: each step asks when the next is due; a failed one is tried
    again soon, backing off."""
    return Every("reconcile", settings.reconcile_interval, retry=backoff(0.5, MAX_ERROR_WAIT_S))


def next_chunk(chunk: int, seconds: float, examined: int | None) -> int:
    """The jobs the next step walks, after a step of ``chunk`` that walked ``examined`` jobs in
    ``seconds``: what STEP_TARGET_S holds at that pace, at most twice ``chunk``."""
    if not examined or seconds <= 0:
        return chunk  # walked nothing (idle, busy): nothing learned
    fitting = int(STEP_TARGET_S * examined / seconds)
    return max(MIN_CHUNK, min(MAX_CHUNK, 2 * chunk, fitting))


@dataclass(eq=False, repr=False)
class Reconciler:
    """One replica's share of the reconcile: steps the shared pass when it is this replica's.

    The service's cadence runs :meth:`step` as a duty, as soon as the step before asks: it
    returns how long to rest, and raises when the database failed it (the duty's policy backs
    off). On SIGTERM the service stops stepping and calls :meth:`release`.
    """

    database: db.Database
    metrics: Metrics
    _: KW_ONLY
    owner: str
    interval: float
    # Where the jobs found missing from the queue go: the work queue's door.
    intake: Intake
    clock: Clock
    steps: int = field(default=0, init=False)
    chunk: int = field(default=db.RECONCILE_CHUNK, init=False)
    _holding: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.metrics.reconcile_interval.set(self.interval)

    async def step(self) -> float:
        """Step the pass once; returns the seconds until the next step is due."""
        started = self.clock.now()
        try:
            with tracing.span("reactor.reconcile") as traced:
                step = await self.database.reconcile_step(
                    owner=self.owner, interval=self.interval, limit=self.chunk
                )
                traced.set(outcome=step.outcome, examined=step.examined, found=len(step.found))
        except db.DATABASE_ERRORS as error:
            log.warning("reconcile step failed, will retry", extra={"error": db.first_line(error)})
            raise
        self.steps += 1
        self.chunk = next_chunk(self.chunk, self.clock.now() - started, step.examined)
        self._digest(step)
        if step.outcome == "stepped":
            return max(_MIN_REST_S, self.clock.now() - started)
        if step.outcome == "completed":
            # The next pass is due one interval after this one began, so that it ends one
            # interval after this one did: no step to ask when.
            return max(_MIN_REST_S, self.interval - (step.pass_seconds or 0.0))
        # Idle: the next pass is due in next_in. Busy: another replica holds the pass, and it is
        # ours to take over if its lease runs out.
        wait = step.next_in if step.next_in is not None else self.interval
        return min(max(wait, _MIN_REST_S), self.interval)

    def _digest(self, step: db.ReconcileStep) -> None:
        self._holding = step.outcome == "stepped"
        if step.found:
            self.metrics.reconcile_found.inc(len(step.found))
            for job_id, due_in in step.found:
                # A found job still has its whole grace: due ones fire at once.
                self.intake.intake(RECONCILE.hints([(job_id, max(0.0, due_in) + 0.001)]))
        # reactor_reconcile_last_pass_timestamp_seconds comes from the health check alone: the
        # state row's end time, by the database clock, whichever replica ended the pass.
        if step.outcome == "completed" and step.pass_found:
            log.warning(
                "reconcile found jobs missing from the pending queue: something went around "
                "the reactor's triggers (a restore, replication, a disabled trigger, queue "
                "rows deleted by hand); they are queued now",
                extra={
                    "found": step.pass_found,
                    "example_job_id": step.pass_example,
                    "examined": step.pass_examined,
                    "pass_seconds": round(step.pass_seconds or 0.0, 3),
                },
            )

    async def release(self) -> None:
        """Give the lease on the pass back, if this replica holds it (stopping)."""
        if not self._holding:
            return
        # Shielded: it runs during the drain. On failure the lease simply runs out.
        with anyio.move_on_after(2, shield=True), contextlib.suppress(*db.DATABASE_ERRORS):
            await self.database.reconcile_release(self.owner)
