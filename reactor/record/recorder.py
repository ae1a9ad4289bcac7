"""Turns due job ids into runs, and reports which timers must move.

The recorder never trusts what woke it: the record statement re-reads each job under a row lock
and decides from the row (controller-runtime's reconcile). What comes back is a list of
``(job_id, delay)`` pairs for jobs that still need a run but could not be recorded yet.

A stuck row costs only itself. A statement for many jobs waits at most ``batch_lock_timeout``
for another transaction's row lock (a tab's save that is not committed yet); past it, or past
the statement timeout, the batch is split into parts that are tried again, each waiting a fifth
of that, until the job behind the lock stands alone. That job is *stuck*, which the answer says
(:class:`Answer`, and the scan's :class:`Drained`): the work queue then claims it alone, by a
statement that waits for the lock as long as the usual lock timeout allows, so it is written as
soon as the lock goes, and the scan leaves it out. The recorder keeps no claim state of its own.

A row that can never be written costs only itself too. When a statement fails on the data it
writes (the app's CHECK, NOT NULL, foreign key or trigger rejects a run row), the batch is split
the same way until the job at fault stands alone; that job is *set aside* in the database with
its error (``reactor.set_aside``), where ``reactor status`` and the metrics show it, and is tried
again on a slow schedule, or at once when the app touches the job or runs ``reactor migrate``.
Every other job of the batch is recorded as if it did not exist.

The timer's claims (``record_jobs``, the given jobs) and the scan (``record_oldest``, the oldest
due ones) differ only in their statement: both write by one road, :meth:`Recorder._write`, with
one split-and-isolate, and what a failed statement says of its batch is read from its error in
:mod:`reactor.record.outcomes`.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from reactor.claim.sources import Answer
from reactor.core.backoff import exponential
from reactor.core.clock import Clock, SystemClock
from reactor.db import DATABASE_ERRORS, Database, JobOutcome, first_line
from reactor.install import null_cost
from reactor.record.batch import SPLIT as SPLIT
from reactor.record.batch import Batch, Written, each_part
from reactor.record.batch import split as split
from reactor.record.outcomes import is_broken_error, is_row_error, verdict
from reactor.record.writes import WriteHealth
from reactor.telemetry import tracing
from reactor.telemetry.metrics import Metrics

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

# A job set aside is tried again after this long, doubling with each failure on the same data.
SET_ASIDE_FIRST_RETRY_S = 60.0
SET_ASIDE_MAX_RETRY_S = 3600.0

# A record statement that fails on the pair's own objects (reactor.record.writes.BROKEN_CLASSES: a
# table or a column gone, a grant revoked) fails the same way for every job until someone
# repairs it. Its jobs are then tried again later each time such a statement fails in a row,
# doubling from the error retry up to this, so a broken pair's backlog does not cycle every
# second through the process and the pool it shares with the others. Any other failure (the
# database away, a statement cut short) keeps the short retry: it is over in seconds.
MAX_BROKEN_RETRY_S = 30.0


# How long a statement for several jobs waits on a row lock before it is split. A tab's save
# commits in milliseconds; an open transaction can hold its row for as long as it likes.
BATCH_LOCK_TIMEOUT_S = 0.5

# The share of that a part of a split batch waits: the batch proved a row held for the whole
# wait, so its parts need only tell which, and a held row is found after the batch's wait and
# one short one per round of splitting (40 jobs around 3 held rows: 0.5 s and two of 0.1 s,
# where every round waited 0.5 s). A part stopped by a lock held briefly has its job isolated,
# which costs it nothing: alone, it waits for the lock the usual time.
PART_LOCK_SHARE = 0.2

Rearm = list[tuple[str, float]]


@dataclass
class Drained:
    """What one scan did: the runs it wrote, the jobs it settled (they need no claim any more:
    recorded, superseded, no longer due a run, set aside) and the jobs it found behind another
    transaction's row lock (to be claimed alone)."""

    recorded: int = 0
    settled: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)


# How many settled outcomes :attr:`Recorder.recent` keeps, for the HTTP page.
RECENT_OUTCOMES = 20


@dataclass(frozen=True, slots=True)
class Settled:
    """What one claim of this replica did with a job, for the HTTP page's "last records"."""

    job_id: str
    run_id: str | None
    outcome: str  # recorded, superseded (a later job or a tab's save owns the run), set_aside
    source: str  # timer or scan
    lateness: float | None  # recorded: seconds past updated_at + grace, by the database clock
    at: datetime  # this process's wall clock: shown to people, never compared with the database


# What a scan's outcomes leave to no claim: the job was settled, one way or another.
_SETTLED = frozenset({"recorded", "superseded", "dropped", "set_aside"})


def _recorded(outcomes: list[JobOutcome]) -> int:
    return sum(o.outcome == "recorded" for o in outcomes)


class Wakes(Protocol):
    """What is told that runs were recorded (the hook runner: their hooks are queued)."""

    def wake(self) -> None:
        """Look for work now."""
        ...


class Recorder:
    """Writes runs for due jobs through :class:`Database`."""

    def __init__(
        self,
        db: Database,
        metrics: Metrics,
        *,
        busy_retry: float = 1.0,
        error_retry: float = 1.0,
        hooks: Wakes | None = None,
        clock: Clock | None = None,
        writes: WriteHealth | None = None,
    ) -> None:
        self.db = db
        self.metrics = metrics
        self.clock = clock or SystemClock()
        # Whether the record statements, the timers' and the scan's, can write at all.
        self.writes = writes or WriteHealth()
        # Woken after a statement that wrote runs: their hooks are queued.
        self.hooks = hooks
        self.batch_lock_timeout = BATCH_LOCK_TIMEOUT_S
        # Jobs this recorder set aside (job id: the error's first line), for `sweep --once`.
        self.set_aside: dict[str, str] = {}
        # The last few jobs this recorder settled, newest last.
        self.recent: deque[Settled] = deque(maxlen=RECENT_OUTCOMES)
        # A job another replica holds is checked again soon: if that replica dies mid-write,
        # the row lock goes with it and the job is still ours to record.
        self.busy_retry = busy_retry
        self.error_retry = error_retry
        # The error record statements fail with, as last logged; None while they succeed. A
        # table that is gone fails every statement until it is back: said once, not for each.
        self._failing: str | None = None
        # Record statements that failed on the pair's objects in a row (see MAX_BROKEN_RETRY_S).
        self._broken = 0

    async def record(self, job_ids: Sequence[str], alone: bool = False) -> Answer:
        """Record the due jobs among ``job_ids``; say which to try again, and when, and which
        were found behind another transaction's row lock. ``alone``: one stuck job, whose
        statement waits for the lock the usual time."""
        given = list(job_ids)

        def run(part: list[str] | None, lock: float | None) -> Awaitable[list[JobOutcome]]:
            return self.db.record_jobs(given if part is None else part, lock_timeout=lock)

        async def jobs() -> list[str]:
            return given

        # A job on its own holds up no other: its statement waits for a lock the usual time.
        waits = alone or len(given) == 1
        written = await self._write(
            Batch("timer", run, jobs, known=given),
            lock_timeout=None if waits else self.batch_lock_timeout,
            known=alone,
        )
        retry = self._digest(written.outcomes, "timer")
        # Just isolated: again at once, alone, waiting for the lock this time.
        retry += [(job_id, self.error_retry if alone else 0.0) for job_id in written.stuck]
        for failed, error in written.failed:
            retry += self._retry_failed(failed, error)
        return Answer(retry, frozenset(written.stuck))

    async def _write(
        self,
        batch: Batch,
        part: list[str] | None = None,
        *,
        lock_timeout: float | None,
        known: bool = False,
    ) -> Written:
        """The one write road: run ``batch``'s statement over ``part`` (None: all of it). When it
        fails on a row lock or on a row's data, split it until the job at fault stands alone,
        and isolate that job (stuck) or set it aside; every other job is written. Only a job on
        its own from the start waits the usual lock timeout (``lock_timeout`` None); the parts
        of a split batch give up sooner than the batch did, so the stuck job is found quickly.
        ``known``: the job is known to be stuck already (no warning when it is again)."""
        written = Written()
        shown = batch.known if part is None else part
        limit = batch.limit if part is None or batch.limit is None else len(part)
        try:
            with tracing.span(
                "reactor.record",
                None if shown is None else tracing.jobs(shown),
                source=batch.source,
                limit=limit,
            ) as traced:
                outcomes = await batch.run(part, lock_timeout)
                read = None if batch.known is not None else [o.job_id for o in outcomes]
                traced.set(
                    None if read is None else tracing.jobs(read), recorded=_recorded(outcomes)
                )
        except DATABASE_ERRORS as error:
            kind = verdict(error)
            if kind == "other":
                written.failed.append((shown or [], error))
                return written
            if kind == "timeout":
                self.metrics.record_timeouts.inc()
            try:
                jobs = part if part is not None else await batch.jobs()
            except DATABASE_ERRORS as reading:
                written.failed.append(([], reading))
                return written
            if len(jobs) == 1:
                await self._isolate(jobs[0], error, written, known=known)
                return written
            for done in await each_part(
                split(jobs),
                lambda piece: self._write(
                    batch, piece, lock_timeout=self.batch_lock_timeout * PART_LOCK_SHARE
                ),
            ):
                written.add(done)
            return written
        self._succeeded()
        written.outcomes += outcomes
        return written

    async def _isolate(
        self, job_id: str, error: BaseException, written: Written, *, known: bool
    ) -> None:
        # The one job a failed statement was split down to: held behind a lock, or at fault.
        if not is_row_error(error):
            self._isolated(job_id, error, known=known)
            written.stuck.append(job_id)
            return
        try:
            await self._set_aside(job_id, error)
        except DATABASE_ERRORS:
            # Not set aside: the job is tried again, as after any failed statement.
            written.failed.append(([job_id], error))
            return
        written.outcomes.append(JobOutcome(job_id, None, "set_aside", None))

    def _retry_failed(self, job_ids: list[str], error: BaseException) -> Rearm:
        # A timer's statement that failed whole: its jobs are tried again after a while.
        self.metrics.record_errors.inc()
        problem = first_line(error)
        self._failed(error)
        log.log(
            logging.DEBUG if problem == self._failing else logging.WARNING,
            "record failed, will retry",
            extra={"jobs": len(job_ids), "error": problem},
        )
        self._failing = problem
        delay = self._retry_after(error)
        return [(job_id, delay) for job_id in job_ids]

    def _failed(self, error: BaseException) -> None:
        was = self.writes.problem
        self.writes.failed(first_line(error), getattr(error, "sqlstate", None), self.clock.now())
        problem = self.writes.problem
        self.metrics.writes_failing.set(problem is not None)
        if problem is not None and was is None:
            log.error(
                "record statements fail on the pair's own objects and nothing is written; "
                "not ready until one succeeds (run `reactor migrate`, or restore what the "
                "error names)",
                extra={"error": problem},
            )

    def _succeeded(self) -> None:
        if self._failing is not None:
            log.info("record statements succeed again", extra={"was": self._failing})
            self._failing = None
        self._broken = 0
        self.writes.succeeded()
        self.metrics.writes_failing.set(0)

    def _retry_after(self, error: BaseException) -> float:
        if not is_broken_error(error):
            self._broken = 0
            return self.error_retry
        self._broken += 1
        return exponential(self._broken, first=self.error_retry, cap=MAX_BROKEN_RETRY_S)

    async def drain(self, batch_size: int, *, skip: Iterable[str] = ()) -> Drained:
        """Record due jobs oldest first, batch after batch, until a batch comes back short.

        Jobs in ``skip`` (claimed elsewhere: in flight, or stuck) are left out, and so are the
        jobs this drain finds stuck behind another transaction's row lock; other database
        errors propagate, once what the batch wrote is counted.
        """
        drained = Drained()
        left_out = set(skip)
        while True:
            written = await self._write(
                self._oldest(batch_size, sorted(left_out)), lock_timeout=self.batch_lock_timeout
            )
            left_out.update(written.stuck)
            drained.stuck += written.stuck
            if written.failed:
                self._digest(written.outcomes, "scan")
                error = written.failed[0][1]
                self._failed(error)
                raise error
            self._succeeded()
            # A job isolated behind a lock is kept queued: the statement took it, and left it.
            outcomes = written.outcomes + [
                JobOutcome(job_id, None, "kept", None) for job_id in written.stuck
            ]
            taken = [o for o in outcomes if o.outcome != "deferred"]
            self.metrics.scan_rows.inc(len(taken))
            self._digest(outcomes, "scan")
            drained.settled += [o.job_id for o in taken if o.outcome in _SETTLED]
            drained.recorded += sum(o.outcome == "recorded" for o in outcomes)
            # Only "kept" rows means other transactions hold them: the next scan settles them,
            # looping now would only spin. Deferred rows (past the byte cap) are next in line;
            # a job set aside is left out of the next statement.
            progress = any(o.outcome in _SETTLED for o in taken)
            full = len(outcomes) >= batch_size or len(taken) < len(outcomes)
            if not (full and progress):
                return drained

    def _oldest(self, limit: int, skip: list[str]) -> Batch:
        # The scan's statement: up to ``limit`` of the oldest due jobs, or only a given part.
        def run(part: list[str] | None, lock: float | None) -> Awaitable[list[JobOutcome]]:
            size = limit if part is None else len(part)
            return self.db.record_oldest(size, only=part, skip=skip, lock_timeout=lock)

        async def jobs() -> list[str]:
            return await self.db.oldest_queued(limit, skip=skip)

        return Batch("scan", run, jobs, limit=limit)

    async def _set_aside(self, job_id: str, error: psycopg.Error) -> None:
        failures, retry_in = await self.db.set_aside(
            job_id, error, first_retry=SET_ASIDE_FIRST_RETRY_S, max_retry=SET_ASIDE_MAX_RETRY_S
        )
        self.metrics.jobs_set_aside.inc()
        self.set_aside[job_id] = first_line(error)
        self.recent.append(Settled(job_id, None, "set_aside", "", None, datetime.now(UTC)))
        # A NULL refused by a column the mapping fills: the mapping's line and its two fixes.
        fix = null_cost.set_aside_fix(self.db.install.mapping, error.sqlstate, first_line(error))
        log.error(
            "a job's run cannot be written and is set aside; every other job goes on",
            extra={
                "job_id": job_id,
                "error": first_line(error),
                "sqlstate": error.sqlstate,
                "failures": failures,
                "retry_in_s": round(retry_in),
                **({"fix": fix} if fix else {}),
            },
        )

    def _isolated(self, job_id: str, error: BaseException, *, known: bool) -> None:
        if not known:
            log.warning(
                "a job's run waits on another transaction's lock; it is recorded on its own "
                "once the lock goes",
                extra={"job_id": job_id, "error": first_line(error)},
            )

    def _digest(self, outcomes: list[JobOutcome], source: str) -> Rearm:
        rearm: Rearm = []
        # Per statement rather than per job, as a catch-up digests 500 outcomes a statement: one
        # counter step, one look at the log level, and the settled jobs the deque keeps.
        logged = log.isEnabledFor(logging.INFO)
        recorded = 0
        for o in outcomes:
            if o.outcome == "recorded":
                recorded += 1
                lateness = max(0.0, -(o.due_in or 0.0))
                self.metrics.lateness.observe(lateness)
                if logged:
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
        if recorded:
            self.metrics.recorded_by[source].inc(recorded)
            if self.hooks is not None:
                self.hooks.wake()
        self._remember(outcomes, source)
        return rearm

    def _remember(self, outcomes: list[JobOutcome], source: str) -> None:
        # The last RECENT_OUTCOMES jobs recorded or superseded, newest last.
        settled_at = datetime.now(UTC)
        kept: list[Settled] = []
        for o in reversed(outcomes):
            if len(kept) == RECENT_OUTCOMES:
                break
            if o.outcome == "recorded":
                lateness = max(0.0, -(o.due_in or 0.0))
                kept.append(Settled(o.job_id, o.run_id, "recorded", source, lateness, settled_at))
            elif o.outcome == "superseded":
                kept.append(Settled(o.job_id, o.run_id, o.outcome, source, None, settled_at))
        self.recent.extend(reversed(kept))
