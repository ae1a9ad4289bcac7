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
its lease runs out. On SIGTERM the loop stops between steps and gives its lease back.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

import anyio

from reactor import db
from reactor.metrics import Metrics
from reactor.recorder import DATABASE_ERRORS

log = logging.getLogger(__name__)

# Between two steps, the loop rests as long as the step took: the walk keeps the database at
# most half as busy as it could, and yields to the app's queries.
_MIN_REST = 0.005
# After a failed step: retry soon, backing off to this.
_MAX_ERROR_WAIT = 30.0


class Reconciler:
    """One replica's share of the reconcile: steps the shared pass when it is this replica's."""

    def __init__(
        self,
        database: db.Database,
        metrics: Metrics,
        *,
        owner: str,
        interval: float,
        arm: Callable[[str, float], None],
        is_stopping: Callable[[], bool],
    ) -> None:
        self.database = database
        self.metrics = metrics
        self.interval = interval
        self.arm = arm
        self.is_stopping = is_stopping
        self.owner = owner
        self.steps = 0
        self._wake = anyio.Event()
        self._holding = False
        metrics.reconcile_interval.set(interval)

    def wake(self) -> None:
        """Step now rather than at the next due time (a pass was asked for, or stopping)."""
        self._wake.set()

    async def run(self) -> None:
        """Step passes until stopping; returns between steps."""
        failures = 0
        while not self.is_stopping():
            started = time.monotonic()
            try:
                step = await self.database.reconcile_step(owner=self.owner, interval=self.interval)
            except DATABASE_ERRORS as error:
                failures += 1
                log.warning(
                    "reconcile step failed, will retry", extra={"error": db.first_line(error)}
                )
                await self._rest(min(_MAX_ERROR_WAIT, 0.5 * 2 ** (failures - 1)))
                continue
            failures = 0
            self.steps += 1
            self._digest(step)
            if step.outcome == "stepped":
                await self._rest(max(_MIN_REST, time.monotonic() - started))
            elif step.outcome == "completed":
                # The next pass is due one interval after this one began, so that it ends one
                # interval after this one did: no step to ask when.
                await self._rest(max(_MIN_REST, self.interval - (step.pass_seconds or 0.0)))
            else:
                # Idle: the next pass is due in next_in. Busy: another replica holds the pass,
                # and it is ours to take over if its lease runs out.
                wait = step.next_in if step.next_in is not None else self.interval
                await self._rest(min(max(wait, _MIN_REST), self.interval))
        await self._release()

    def _digest(self, step: db.ReconcileStep) -> None:
        self._holding = step.outcome == "stepped"
        if step.found:
            self.metrics.reconcile_found.inc(len(step.found))
            for job_id, due_in in step.found:
                # A found job still has its whole grace: due ones fire at once.
                self.arm(job_id, max(0.0, due_in) + 0.001)
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

    async def _rest(self, seconds: float) -> None:
        with anyio.move_on_after(seconds):
            await self._wake.wait()
        self._wake = anyio.Event()

    async def _release(self) -> None:
        if not self._holding:
            return
        # Shielded: it runs during the drain. On failure the lease simply runs out.
        with anyio.move_on_after(2, shield=True), contextlib.suppress(*DATABASE_ERRORS):
            await self.database.reconcile_release(self.owner)
