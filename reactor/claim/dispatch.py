"""One work queue for job ids: who claims which job, and when. Every road to a claim goes here.

The listener, the poll, the scan's re-arm, the reconcile and the recorder's retries are sources
(:mod:`reactor.claim.sources`): each says what it knows of a job as a
:class:`~reactor.claim.sources.Hint`, and every hint comes in by one door,
:meth:`Dispatcher.intake` (:meth:`WorkQueue.admit`, pure);
:meth:`~WorkQueue.take` hands out the due ones this replica owns and marks them in flight;
:meth:`~WorkQueue.done` settles them. It is controller-runtime's workqueue with its delaying
queue, for job ids:

- **One claim per job at a time.** A job offered while its claim is in flight is not offered
  again: the offer is noted (dirty) and the claim's answer decides. When the claim settles the
  job (recorded, superseded, no longer needed), a level read made meanwhile (a poll, a scan)
  is stale and dropped; a notification is an edge, newer than the claim may have seen (a run
  deleted right after it was written), so it is offered again. When the claim asks to retry
  (a row still held, a deadline moved), the retry's time wins: it is the newest read of the row.
- **Ownership at intake.** A replica keeps only the jobs it owns (rendezvous hashing of the
  jobs' shares over the live replicas, :mod:`reactor.core.ownership`), so its heap, its timers and
  its claims are its share alone; a trigger installed with ``--spread`` sends it no other.
  When the live set changes it drops what it no longer owns (:meth:`see`); what it gains it
  reads from the database (the service's re-arm), since it never held it. A job
  this replica found itself (the reconcile), or claimed and must try again, is *adopted*: it
  claims it whoever owns it, and the adoption stays with the entry through every retry until a
  claim settles it.
- **The last hint wins** for a job not in flight: every hint comes from a read of the row or a
  fresh notification, and a deadline that moved later (the job was touched) must move later here.
  Within one intake the due jobs are claimed earliest first.
- **A job held behind another transaction's row lock is stuck** (a tab's save left open): it is
  claimed alone from then on, by a statement that waits for the lock, so it holds up no batch,
  and the scan leaves it out (:attr:`WorkQueue.claimed`). A claim that settles it ends that.
  The queue is the one place that says what state a job's claim is in.

:class:`WorkQueue` is pure: no I/O, no clock; every method that needs the time takes ``now``.
:class:`Dispatcher` is its async shell: one loop that sleeps until the next deadline (or
a hint that comes earlier), and a semaphore of claim slots. A job due on arrival is claimed from
the intake itself when a slot is free.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import anyio
import anyio.abc

from reactor.claim.sources import RETRY, Answer, Hint
from reactor.core.clock import Clock
from reactor.core.deadlines import Deadlines
from reactor.core.ownership import Membership
from reactor.telemetry.metrics import Metrics

__all__ = ["Answer", "Claimer", "Dispatcher", "Intake", "WorkQueue"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Meanwhile:
    """What was offered for a job while its claim ran."""

    at: float
    adopted: bool
    heard: bool


class WorkQueue:
    """Deadlines for job ids, the jobs in flight, and whose jobs are whose."""

    def __init__(self, me: str, *, capacity: int) -> None:
        # Until the first heartbeat this replica sees nobody, itself included, and owns all.
        self.membership = Membership(me)
        self.capacity = capacity
        self._deadlines: Deadlines[str] = Deadlines()
        self._adopted: set[str] = set()
        self._in_flight: set[str] = set()
        self._stuck: set[str] = set()
        self._meanwhile: dict[str, _Meanwhile] = {}
        # Counters for the metrics: offers refused at capacity, jobs left to their owner.
        self.refused = 0
        self.left_to_owner = 0

    def __len__(self) -> int:
        """Jobs this queue holds: waiting for their deadline or in flight."""
        return len(self._deadlines) + len(self._in_flight)

    @property
    def waiting(self) -> int:
        """Jobs waiting for their deadline."""
        return len(self._deadlines)

    def __contains__(self, job: object) -> bool:
        return job in self._in_flight or job in self._deadlines

    @property
    def in_flight(self) -> frozenset[str]:
        """The jobs whose claim runs now."""
        return frozenset(self._in_flight)

    @property
    def stuck(self) -> frozenset[str]:
        """The jobs held behind another transaction's row lock: each is claimed alone."""
        return frozenset(self._stuck)

    @property
    def claimed(self) -> frozenset[str]:
        """The jobs the scan must leave out: their claim runs here, or is this queue's alone."""
        return frozenset(self._in_flight | self._stuck)

    def is_stuck(self, job: str) -> bool:
        """True when ``job`` waits behind another transaction's row lock."""
        return job in self._stuck

    def adopted(self, job: str) -> bool:
        """True when this replica claims ``job`` whoever owns it."""
        return job in self._adopted

    def when(self, job: str) -> float | None:
        """When ``job`` is due, or None when it is not waiting (in flight or unknown)."""
        return self._deadlines.when(job)

    def admit(self, hint: Hint, now: float) -> bool:
        """What a source says of a job, read at ``now`` (see :class:`~reactor.claim.sources.Hint`).
        A job another live replica owns is left to it, unless adopted or stuck. Returns True
        when this is now the earliest deadline (a sleeping dispatcher must wake)."""
        return self._admit(hint, hint.at(now))

    def _admit(self, hint: Hint, at: float) -> bool:
        job = hint.job_id
        if hint.stuck:
            self._stuck.add(job)
        if job in self._in_flight:
            seen = self._meanwhile.get(job)
            if seen is None:
                self._meanwhile[job] = _Meanwhile(at, hint.adopted, hint.heard)
            else:
                seen.at = at
                seen.adopted |= hint.adopted
                seen.heard |= hint.heard
            return False
        # A job the scan found stuck is this replica's to claim alone, whoever owns it.
        adopted = hint.adopted or hint.stuck
        if not (adopted or job in self._adopted or self.membership.owns(job)):
            self.left_to_owner += 1
            self._deadlines.cancel(job)
            self._stuck.discard(job)
            return False
        if job not in self._deadlines and len(self._deadlines) >= self.capacity:
            # The fallback scan finds it when it comes due: the queue row is the truth.
            self.refused += 1
            return False
        if adopted:
            self._adopted.add(job)
        return self._deadlines.schedule(job, at)

    def forget(self, jobs: Iterable[str]) -> None:
        """``jobs`` were settled on another road (the scan): no claim of ours is needed."""
        for job in jobs:
            if job not in self._in_flight:
                self._deadlines.cancel(job)
                self._adopted.discard(job)
                self._stuck.discard(job)

    def next_at(self) -> float | None:
        """The earliest deadline, or None when nothing waits."""
        return self._deadlines.next_deadline()

    def take(self, now: float, limit: int) -> list[str]:
        """Up to ``limit`` due jobs to claim now, earliest first, marked in flight: every job
        held here is this replica's, by ownership or adoption (:meth:`admit`, :meth:`see`)."""
        taken = self._deadlines.pop_due(now, limit)
        self._in_flight.update(taken)
        return taken

    def done(
        self, jobs: Sequence[str], retry: Mapping[str, float], stuck: Iterable[str] = ()
    ) -> bool:
        """Settle the claim of ``jobs``: those in ``retry`` are due again at its time, the rest
        are settled; those in ``stuck`` were found behind another transaction's row lock.
        Returns True when a deadline became the earliest."""
        self._stuck.update(stuck)
        wake = False
        for job in jobs:
            self._in_flight.discard(job)
            if job not in retry:
                self._stuck.discard(job)
            meanwhile = self._meanwhile.pop(job, None)
            self._adopted.discard(job)
            at = retry.get(job)
            if at is None and meanwhile is not None and meanwhile.heard:
                at = meanwhile.at
            if at is not None:
                # Claimed here: tried again here, even if the live set moved it meanwhile (its
                # new owner read the jobs inside their grace, not the due ones in flight here).
                wake |= self._admit(Hint(job, adopted=True), at)
        return wake

    def see(self, membership: Membership) -> None:
        """Who is live changed: ownership follows from now on. The jobs held here that another
        replica owns now are dropped (its own re-arm read them); the ones this replica gains
        are not here, and are the caller's to read."""
        self.membership = membership
        for job in [job for job in self._deadlines if job not in self._adopted]:
            if not membership.owns(job):
                self._deadlines.cancel(job)
                self._stuck.discard(job)
                self.left_to_owner += 1


class Claimer(Protocol):
    """What claims the due jobs (:class:`reactor.record.recorder.Recorder`)."""

    async def record(self, job_ids: Sequence[str], alone: bool = False) -> Answer:
        """Claim ``job_ids`` and say which to try again; ``alone``: one stuck job, whose
        statement waits for its lock."""
        ...


class Intake(Protocol):
    """The one door into a work queue, as the roads that offer jobs see it
    (:class:`Dispatcher`)."""

    def intake(self, hints: Iterable[Hint]) -> None:
        """Offer ``hints``, read now."""
        ...

    def wants(self, job: str) -> bool:
        """True when ``job`` is held here or owned by this replica."""
        ...

    @property
    def live(self) -> int:
        """The replicas live, as the queue sees them."""
        ...


class Dispatcher:
    """Runs the claims of a :class:`WorkQueue`: one loop, ``concurrency`` claims at once."""

    def __init__(
        self,
        queue: WorkQueue,
        claimer: Claimer,
        clock: Clock,
        metrics: Metrics,
        *,
        concurrency: int,
        batch_size: int,
        error_retry: float = 1.0,
    ) -> None:
        self.queue = queue
        self.claimer = claimer
        self.clock = clock
        self.metrics = metrics
        # Read when scraped, not set at every offer: the hot path only counts.
        metrics.deadlines_pending.set_function(lambda: queue.waiting)
        metrics.stuck_jobs.set_function(lambda: len(queue.stuck))
        self.batch_size = batch_size
        # A claim that ended without an answer (cut short): its jobs are tried again after this.
        self.error_retry = error_retry
        self._slots = anyio.Semaphore(concurrency)
        self._wake = anyio.Event()
        self._closed = False
        self._refused = 0
        self._left = 0
        # The task group claims run in, once run() started.
        self._work: anyio.abc.TaskGroup | None = None

    def intake(self, hints: Iterable[Hint]) -> None:
        """The one door into the queue: every source's hints (:meth:`WorkQueue.admit`), read
        now. When one of them became the earliest deadline and is due already, its claim starts
        from here, when a slot is free, rather than one task switch later by the loop."""
        now = self.clock.now()
        earliest = False
        for hint in hints:
            earliest |= self.queue.admit(hint, now)
        if earliest:
            head = self.queue.next_at()
            if head is not None and head <= now:
                self._claim_now(now)
            # The loop sleeps until the deadline it saw: it looks again (a claim taken from
            # here may have left more due jobs than one batch).
            self._wake.set()
        self._count()

    def wants(self, job: str) -> bool:
        """True when ``job`` is held here or owned by this replica: a notification of it is
        verified before it is armed; another live replica's is left to that one."""
        queue = self.queue
        return job in queue or queue.membership.owns(job)

    @property
    def live(self) -> int:
        """The replicas live, as the queue sees them."""
        return len(self.queue.membership.live)

    def _claim_now(self, now: float) -> bool:
        """Start a claim of the due jobs at once, if a slot is free; True when one started."""
        if self._closed or self._work is None:
            return False
        try:
            self._slots.acquire_nowait()
        except anyio.WouldBlock:
            return False
        return self._start(now, self._work)

    def _start(self, now: float, work: anyio.abc.TaskGroup) -> bool:
        """With a slot held: start a claim of the jobs due at ``now`` in ``work``, or give the
        slot back when none is (or the dispatcher closed). True when a claim started."""
        jobs = [] if self._closed else self.queue.take(now, self.batch_size)
        self._count()
        if not jobs:
            self._slots.release()
            return False
        work.start_soon(self._claim, jobs)
        return True

    def close(self) -> None:
        """Take no more jobs; the claims in flight finish."""
        self._closed = True
        self._wake.set()

    async def run(self, work: anyio.abc.TaskGroup) -> None:
        """Claim due jobs in ``work`` until :meth:`close`."""
        self._work = work
        while not self._closed:
            next_at = self.queue.next_at()
            if next_at is None or next_at > self.clock.now():
                self._wake = anyio.Event()
                await self.clock.sleep_until(math.inf if next_at is None else next_at, self._wake)
                continue
            await self._slots.acquire()
            self._start(self.clock.now(), work)

    async def _claim(self, jobs: list[str]) -> None:
        # Until the claim answers, every job is a retry: a claim cut short (the drain's
        # deadline) or one that raised settles nothing. A stuck job goes alone, so its wait
        # for the lock holds up nobody else.
        retry = dict.fromkeys(jobs, self.clock.now() + self.error_retry)
        stuck: set[str] = set()
        fresh = [job for job in jobs if not self.queue.is_stuck(job)]
        groups = [(fresh, False)] if fresh else []
        groups += [([job], True) for job in jobs if self.queue.is_stuck(job)]
        try:
            for group, alone in groups:
                answer = await self.claimer.record(group, alone)
                now = self.clock.now()
                for job in group:
                    del retry[job]
                for hint in RETRY.hints(answer):
                    retry[hint.job_id] = hint.at(now)
                    if hint.stuck:
                        stuck.add(hint.job_id)
        finally:
            self._slots.release()
            if self.queue.done(jobs, retry, stuck):
                self._wake.set()
            self._count()

    def _count(self) -> None:
        queue, metrics = self.queue, self.metrics
        if queue.refused != self._refused:
            metrics.deadlines_dropped.inc(queue.refused - self._refused)
            self._refused = queue.refused
        if queue.left_to_owner != self._left:
            metrics.left_to_owner.inc(queue.left_to_owner - self._left)
            self._left = queue.left_to_owner
