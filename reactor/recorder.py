"""Turns due job ids into runs, and reports which timers must move.

The recorder never trusts what woke it: the record statement re-reads each job under a row lock
and decides from the row (controller-runtime's reconcile). What comes back is a list of
``(job_id, delay)`` pairs for jobs that still need a run but could not be recorded yet.

A stuck row costs only itself. A statement for many jobs waits at most ``batch_lock_timeout``
for another transaction's row lock (a tab's save that is not committed yet); past it, or past
the statement timeout, the batch is split into parts that are tried again, until the job behind
the lock stands alone. That job is *stuck*, which the answer says (:class:`Answer`, and the
scan's :class:`Drained`): the work queue then claims it alone, by a statement that waits for
the lock as long as the usual lock timeout allows, so it is written as soon as the lock goes,
and the scan leaves it out. The recorder keeps no claim state of its own.

A row that can never be written costs only itself too. When a statement fails on the data it
writes (the app's CHECK, NOT NULL, foreign key or trigger rejects a run row), the batch is split
the same way until the job at fault stands alone; that job is *set aside* in the database with
its error (``reactor.set_aside``), where ``reactor status`` and the metrics show it, and is tried
again on a slow schedule, or at once when the app touches the job or runs ``reactor migrate``.
Every other job of the batch is recorded as if it did not exist.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeGuard, TypeVar

import anyio
import psycopg
import psycopg.errors

from reactor import tracing
from reactor.backoff import exponential
from reactor.clock import Clock, SystemClock
from reactor.db import DATABASE_ERRORS, Database, JobOutcome, first_line
from reactor.dispatch import Answer
from reactor.metrics import Metrics
from reactor.writes import WriteHealth, is_broken_state

log = logging.getLogger(__name__)

# A statement that gave up on a row lock, or ran out of time: something in this batch is held
# or heavy, the rest of the batch most likely is not.
TIMEOUTS = (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled)

# SQLSTATE classes of the errors that a row's own data causes: data exceptions (22), integrity
# violations (23: the app's CHECK, NOT NULL, foreign key or unique index), a value past a limit
# (54: an index row too large), and what an app's trigger raises (P0, 38, 39). Anything else
# (the connection, a privilege, a missing table, a read-only standby) fails every row alike
# and is retried whole.
ROW_ERROR_CLASSES = frozenset({"22", "23", "54", "P0", "38", "39"})

# A job set aside is tried again after this long, doubling with each failure on the same data.
SET_ASIDE_FIRST_RETRY = 60.0
SET_ASIDE_MAX_RETRY = 3600.0


def is_row_error(error: BaseException) -> TypeGuard[psycopg.Error]:
    """True when ``error`` is one that the data of a row in the statement can cause."""
    state = getattr(error, "sqlstate", None)
    return isinstance(error, psycopg.Error) and state is not None and state[:2] in ROW_ERROR_CLASSES


# A record statement that fails on the pair's own objects (reactor.writes.BROKEN_CLASSES: a
# table or a column gone, a grant revoked) fails the same way for every job until someone
# repairs it. Its jobs are then tried again later each time such a statement fails in a row,
# doubling from the error retry up to this, so a broken pair's backlog does not cycle every
# second through the process and the pool it shares with the others. Any other failure (the
# database away, a statement cut short) keeps the short retry: it is over in seconds.
MAX_BROKEN_RETRY = 30.0


def is_broken_error(error: BaseException) -> bool:
    """True when ``error`` says the statement does not fit the database's objects or grants."""
    return isinstance(error, psycopg.Error) and is_broken_state(error.sqlstate)


# How long a statement for several jobs waits on a row lock before it is split. A tab's save
# commits in milliseconds; an open transaction can hold its row for as long as it likes.
BATCH_LOCK_TIMEOUT = 0.5

# Parts a timed-out batch is split into: one stuck row among 500 stands alone after three
# rounds, three lock timeouts, instead of nine when halving.
SPLIT = 8

# Parts of one split tried at once: each held row waits out its lock timeouts beside the others
# rather than after them; few enough to leave the pool room for the claims and the checks.
PART_CONCURRENCY = 3

Rearm = list[tuple[str, float]]
T = TypeVar("T")


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


def split(items: Sequence[str], parts: int = SPLIT) -> list[list[str]]:
    """``items`` in at most ``parts`` consecutive, non-empty parts of near-equal size."""
    count = min(parts, len(items))
    size, extra = divmod(len(items), count) if count else (0, 0)
    result: list[list[str]] = []
    start = 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        result.append(list(items[start:end]))
        start = end
    return result


async def each_part(
    parts: list[list[str]], work: Callable[[list[str]], Awaitable[list[T]]]
) -> list[T]:
    """``work`` on every part, at most :data:`PART_CONCURRENCY` at once, results in part order.

    The parts of a split batch are independent statements: a part that waits out a lock holds
    up no other part, so a backlog with several held rows is isolated in the time one takes.
    Every part runs to its end; then the first error, if any, is raised.
    """
    results: list[list[T]] = [[] for _ in parts]
    errors: list[Exception] = []
    limiter = anyio.CapacityLimiter(PART_CONCURRENCY)

    async def one(index: int, part: list[str]) -> None:
        async with limiter:
            try:
                results[index] = await work(part)
            except Exception as error:  # raised below, once every part is over
                errors.append(error)

    async with anyio.create_task_group() as tg:
        for index, part in enumerate(parts):
            tg.start_soon(one, index, part)
    if errors:
        raise errors[0]
    return [item for result in results for item in result]


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
        clock: Clock | None = None,
        writes: WriteHealth | None = None,
    ) -> None:
        self.db = db
        self.metrics = metrics
        self.clock = clock or SystemClock()
        # Whether the record statements, the timers' and the scan's, can write at all.
        self.writes = writes or WriteHealth()
        # Called after a statement that wrote runs: their hooks are queued, wake the runner.
        self.on_recorded = on_recorded
        self.batch_lock_timeout = BATCH_LOCK_TIMEOUT
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
        # Record statements that failed on the pair's objects in a row (see MAX_BROKEN_RETRY).
        self._broken = 0

    async def record(self, job_ids: Sequence[str], alone: bool = False) -> Answer:
        """Record the due jobs among ``job_ids``; say which to try again, and when, and which
        were found behind another transaction's row lock. ``alone``: one stuck job, whose
        statement waits for the lock the usual time."""
        stuck: set[str] = set()
        # A job on its own holds up no other: its statement waits for a lock the usual time.
        waits = alone or len(job_ids) == 1
        retry = await self._record(list(job_ids), waits=waits, stuck=stuck, known=alone)
        return Answer(retry, frozenset(stuck))

    async def _record(
        self, job_ids: list[str], *, waits: bool, stuck: set[str], known: bool
    ) -> Rearm:
        # Only a job on its own from the start waits the usual lock timeout; the parts of a
        # split batch give up as soon as the batch did, so the stuck job is found quickly.
        try:
            with tracing.span("reactor.record", tracing.jobs(job_ids), source="timer") as traced:
                outcomes = await self.db.record_jobs(
                    job_ids, lock_timeout=None if waits else self.batch_lock_timeout
                )
                traced.set(recorded=_recorded(outcomes))
        except TIMEOUTS as error:
            self.metrics.record_timeouts.inc()
            if len(job_ids) == 1:
                self._isolated(job_ids[0], error, known=known)
                stuck.add(job_ids[0])
                # Just isolated: again at once, alone, waiting for the lock this time.
                return [(job_ids[0], self.error_retry if known else 0.0)]
            return await self._record_parts(job_ids, waits=False, stuck=stuck)
        except DATABASE_ERRORS as error:
            if is_row_error(error):
                if len(job_ids) > 1:
                    return await self._record_parts(job_ids, waits=waits, stuck=stuck)
                with contextlib.suppress(*DATABASE_ERRORS):
                    # The scan tries it again when its time comes; no timer of ours.
                    await self._set_aside(job_ids[0], error)
                    return []
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
        self._succeeded()
        return self._digest(outcomes, "timer")

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
        return exponential(self._broken, first=self.error_retry, cap=MAX_BROKEN_RETRY)

    async def _record_parts(self, job_ids: list[str], *, waits: bool, stuck: set[str]) -> Rearm:
        return await each_part(
            split(job_ids),
            lambda part: self._record(part, waits=waits, stuck=stuck, known=False),
        )

    async def drain(self, batch_size: int, *, skip: Iterable[str] = ()) -> Drained:
        """Record due jobs oldest first, batch after batch, until a batch comes back short.

        Jobs in ``skip`` (claimed elsewhere: in flight, or stuck) are left out, and so are the
        jobs this drain finds stuck behind another transaction's row lock; other database
        errors propagate.
        """
        drained = Drained()
        left_out = set(skip)
        while True:
            try:
                outcomes = await self._oldest(batch_size, left_out, drained)
            except psycopg.Error as error:
                self._failed(error)
                raise
            self._succeeded()
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

    async def _oldest(
        self, limit: int, left_out: set[str], drained: Drained, only: list[str] | None = None
    ) -> list[JobOutcome]:
        skip = sorted(left_out)
        try:
            known = tracing.jobs(only) if only is not None else None  # a split's part
            with tracing.span("reactor.record", known, source="scan", limit=limit) as traced:
                outcomes = await self.db.record_oldest(
                    limit, only=only, skip=skip, lock_timeout=self.batch_lock_timeout
                )
                traced.set(tracing.jobs([o.job_id for o in outcomes]), recorded=_recorded(outcomes))
        except psycopg.Error as error:
            timeout = isinstance(error, TIMEOUTS)
            if not (timeout or is_row_error(error)):
                raise
            if timeout:
                self.metrics.record_timeouts.inc()
            ids = only if only is not None else await self.db.oldest_queued(limit, skip=skip)
            if len(ids) == 1:
                return [await self._alone(ids[0], error, left_out, drained, timed_out=timeout)]
            return await each_part(
                split(ids), lambda part: self._oldest(len(part), left_out, drained, part)
            )
        return outcomes

    async def _alone(
        self,
        job_id: str,
        error: psycopg.Error,
        left_out: set[str],
        drained: Drained,
        *,
        timed_out: bool,
    ) -> JobOutcome:
        # The one job a failed scan statement was split down to.
        if timed_out:
            self._isolated(job_id, error, known=False)
            left_out.add(job_id)
            drained.stuck.append(job_id)
            return JobOutcome(job_id, None, "kept", None)
        await self._set_aside(job_id, error)
        return JobOutcome(job_id, None, "set_aside", None)

    async def _set_aside(self, job_id: str, error: psycopg.Error) -> None:
        failures, retry_in = await self.db.set_aside(
            job_id, error, first_retry=SET_ASIDE_FIRST_RETRY, max_retry=SET_ASIDE_MAX_RETRY
        )
        self.metrics.jobs_set_aside.inc()
        self.set_aside[job_id] = first_line(error)
        self.recent.append(Settled(job_id, None, "set_aside", "", None, datetime.now(UTC)))
        log.error(
            "a job's run cannot be written and is set aside; every other job goes on",
            extra={
                "job_id": job_id,
                "error": first_line(error),
                "sqlstate": error.sqlstate,
                "failures": failures,
                "retry_in_s": round(retry_in),
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
        if self.on_recorded and any(o.outcome == "recorded" for o in outcomes):
            self.on_recorded()
        for o in outcomes:
            if o.outcome == "superseded":
                self.recent.append(
                    Settled(o.job_id, o.run_id, o.outcome, source, None, datetime.now(UTC))
                )
            if o.outcome == "recorded":
                lateness = max(0.0, -(o.due_in or 0.0))
                self.metrics.recorded_by[source].inc()
                self.metrics.lateness.observe(lateness)
                self.recent.append(
                    Settled(o.job_id, o.run_id, "recorded", source, lateness, datetime.now(UTC))
                )
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
