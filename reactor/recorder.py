"""Turns due job ids into runs, and reports which timers must move.

The recorder never trusts what woke it: the record statement re-reads each job under a row lock
and decides from the row (controller-runtime's reconcile). What comes back is a list of
``(job_id, delay)`` pairs for jobs that still need a run but could not be recorded yet.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import psycopg
from psycopg_pool import PoolTimeout

from reactor.db import Database, JobOutcome, first_line
from reactor.metrics import Metrics

log = logging.getLogger(__name__)

# Errors that mean "the database is unwell right now": the work is retried, never dropped.
DATABASE_ERRORS = (psycopg.Error, PoolTimeout, OSError, TimeoutError)

Rearm = list[tuple[str, float]]


class Recorder:
    """Writes runs for due jobs through :class:`Database`."""

    def __init__(
        self,
        db: Database,
        metrics: Metrics,
        *,
        busy_retry: float = 1.0,
        error_retry: float = 1.0,
        on_recorded: Callable[[], None] | None = None,
    ) -> None:
        self.db = db
        self.metrics = metrics
        # Called after a statement that wrote runs: their hooks are queued, wake the runner.
        self.on_recorded = on_recorded
        # A job another replica holds is checked again soon: if that replica dies mid-write,
        # the row lock goes with it and the job is still ours to record.
        self.busy_retry = busy_retry
        self.error_retry = error_retry

    async def record(self, job_ids: Sequence[str]) -> Rearm:
        """Record the due jobs among ``job_ids``; return the ones to try again, and when."""
        try:
            outcomes = await self.db.record_jobs(job_ids)
        except DATABASE_ERRORS as error:
            self.metrics.record_errors.inc()
            log.warning(
                "record failed, will retry",
                extra={"jobs": len(job_ids), "error": first_line(error)},
            )
            return [(job_id, self.error_retry) for job_id in job_ids]
        return self._digest(outcomes, "timer")

    async def drain(self, batch_size: int) -> int:
        """Record due jobs oldest first, batch after batch, until a batch comes back short.

        Returns how many runs were written. Database errors propagate to the caller.
        """
        total = 0
        while True:
            outcomes = await self.db.record_oldest(batch_size)
            self.metrics.scan_rows.inc(len(outcomes))
            self._digest(outcomes, "scan")
            total += sum(o.outcome == "recorded" for o in outcomes)
            # A batch of only "kept" rows means other transactions hold them: the next scan
            # settles them, looping now would only spin.
            if len(outcomes) < batch_size or all(o.outcome == "kept" for o in outcomes):
                return total

    def _digest(self, outcomes: list[JobOutcome], source: str) -> Rearm:
        rearm: Rearm = []
        if self.on_recorded and any(o.outcome == "recorded" for o in outcomes):
            self.on_recorded()
        for o in outcomes:
            if o.outcome == "recorded":
                lateness = max(0.0, -(o.due_in or 0.0))
                self.metrics.recorded.labels(source).inc()
                self.metrics.lateness.observe(lateness)
                log.info(
                    "recorded run",
                    extra={
                        "job_id": o.job_id,
                        "run_id": o.run_id,
                        "source": source,
                        "lateness_ms": round(lateness * 1000, 1),
                    },
                )
            elif o.outcome == "waiting":
                # Touched after it went terminal: its deadline moved with updated_at. The 1 ms
                # keeps a timer that fires on the boundary from spinning.
                rearm.append((o.job_id, max(0.0, o.due_in or 0.0) + 0.001))
            elif o.outcome == "busy":
                self.metrics.claims_skipped.inc()
                rearm.append((o.job_id, self.busy_retry))
        return rearm
