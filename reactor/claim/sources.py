"""The roads by which a job reaches the dispatcher, each saying what it knows as a :class:`Hint`.

Every road reads something different: the LISTEN session a notification (verified against the
queue first, :mod:`reactor.listen.hints`), the poll and the scan's re-arm the queue's upcoming jobs,
the scan the jobs it found behind another transaction's row lock, the reconcile the jobs missing
from the queue, a claim its answer (:class:`Answer`). Each turns its read into hints, and
:meth:`reactor.claim.dispatch.Dispatcher.intake` is the one door they go through: what a hint says
is data (when the job is due, whether this replica claims it whoever owns it, whether it is held
behind a lock, whether it is an edge), and the work queue alone decides what follows from it.

Pure: no I/O, no clock. A hint's due time is in seconds from its read, which the dispatcher
turns into a deadline on its own clock when the hint arrives.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

# Added to a due time read from the database: a timer that fires exactly on the boundary would
# find the job still inside its grace and spin. The due times are read at the row
# (clock_timestamp()), so a timer counted from the answer is already late by the answer's way
# back: a quarter of a millisecond is enough to keep a claim that found its job a hair inside
# the grace from trying again at once (bench lateness: the claims per job stay 1.00; a
# millisecond here was a millisecond of every job's lateness).
BOUNDARY_S = 0.00025


def aim(due_in: float) -> float:
    """When to claim a job the database said is due in ``due_in`` seconds: past the boundary,
    or at once when it was due already (no claim can find it inside its grace, and a sleep of
    a quarter millisecond is a millisecond on the event loop's timer)."""
    return due_in + BOUNDARY_S if due_in > 0 else due_in


@dataclass(frozen=True, slots=True)
class Hint:
    """What a source knows of one job."""

    job_id: str
    # Seconds until the job is due, by the source's read; None when it is not known, and the job
    # is claimed at once (the claim reads the row and says when it is really due).
    due_in: float | None = None
    # Claim it whoever owns it: this replica found it (the reconcile) or claimed it before (a
    # retry), and keeps it until a claim settles it.
    adopted: bool = False
    # Held behind another transaction's row lock: claimed alone, by a statement that waits.
    stuck: bool = False
    # From a notification: an edge, newer than what a claim in flight may have read.
    heard: bool = False

    def at(self, now: float) -> float:
        """The deadline this hint gives, read at ``now``: never earlier than ``now``."""
        return now + max(0.0, self.due_in or 0.0)


@dataclass(frozen=True, slots=True)
class Answer:
    """What a claim says of its jobs: those to try again, each with the seconds until then (the
    rest are settled), and those it found behind another transaction's row lock."""

    retry: list[tuple[str, float]]
    stuck: frozenset[str] = frozenset()


ReadT_contra = TypeVar("ReadT_contra", contravariant=True)


class Source(Protocol[ReadT_contra]):
    """A road by which jobs reach the dispatcher: it turns what it read into hints."""

    @property
    def name(self) -> str:
        """What the road is called, in logs and tests."""
        ...

    def hints(self, read: ReadT_contra) -> Iterator[Hint]:
        """The hints that ``read`` gives, in the order read."""
        ...


# What a queue read gives: (job id, seconds until due by the database's deadline).
Due = Iterable[tuple[str, float]]


@dataclass(frozen=True, slots=True)
class Heard:
    """The LISTEN session: notifications, once verified against the queue. A verified one
    carries the job row's deadline (the notification's own is the sender's word); one left
    unverified, because another live replica owns the job, carries none."""

    name: str = "listen"

    def hints(self, read: Iterable[tuple[str, float | None]]) -> Iterator[Hint]:
        for job_id, due_in in read:
            known = None if due_in is None else aim(due_in)
            yield Hint(job_id, known, heard=True)


@dataclass(frozen=True, slots=True)
class Queued:
    """A level read of the queue's upcoming jobs: the poll, or the scan's re-arm."""

    name: str

    def hints(self, read: Due) -> Iterator[Hint]:
        for job_id, due_in in read:
            yield Hint(job_id, aim(due_in))


@dataclass(frozen=True, slots=True)
class Held:
    """The scan's jobs found behind another transaction's row lock: due now, claimed alone,
    whoever owns them (the scan leaves them out from now on)."""

    name: str = "stuck"

    def hints(self, read: Iterable[str]) -> Iterator[Hint]:
        for job_id in read:
            yield Hint(job_id, 0.0, stuck=True)


@dataclass(frozen=True, slots=True)
class Found:
    """The reconcile's jobs, found missing from the queue by this replica: adopted."""

    name: str = "reconcile"

    def hints(self, read: Due) -> Iterator[Hint]:
        for job_id, due_in in read:
            yield Hint(job_id, due_in, adopted=True)


@dataclass(frozen=True, slots=True)
class Retried:
    """A claim's answer: its jobs to try again are this replica's until a claim settles them
    (adopted), and those it found behind a row lock are stuck."""

    name: str = "retry"

    def hints(self, read: Answer) -> Iterator[Hint]:
        for job_id, delay in read.retry:
            yield Hint(job_id, delay, adopted=True, stuck=job_id in read.stuck)


LISTEN = Heard()
POLL = Queued("poll")
REARM = Queued("rearm")
STUCK = Held()
RECONCILE = Found()
RETRY = Retried()
