"""A write's batch of jobs, and how a failed one is split: the parts of the recorder's one write
road (:class:`reactor.record.recorder.Recorder`) that know nothing of the statements it runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import anyio

from reactor.db import JobOutcome

T = TypeVar("T")

# Parts a timed-out batch is split into: one stuck row among 500 stands alone after three
# rounds, three lock timeouts, instead of nine when halving.
SPLIT = 8

# Parts of one split tried at once: each held row waits out its lock timeouts beside the others
# rather than after them; few enough to leave the pool room for the claims and the checks.
PART_CONCURRENCY = 3


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


async def each_part(parts: list[list[str]], work: Callable[[list[str]], Awaitable[T]]) -> list[T]:
    """``work`` on every part, at most :data:`PART_CONCURRENCY` at once, results in part order.

    The parts of a split batch are independent statements: a part that waits out a lock holds
    up no other part, so a backlog with several held rows is isolated in the time one takes.
    Every part runs to its end; then the first error, if any, is raised.
    """
    results: dict[int, T] = {}
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
    return [results[index] for index in range(len(parts))]


@dataclass
class Written:
    """What one write did, split as far as it had to be: the outcomes of its statements that
    succeeded and of the jobs it set aside; the jobs it isolated behind another transaction's
    row lock; and the parts that failed whole, each with its error."""

    outcomes: list[JobOutcome] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    failed: list[tuple[list[str], BaseException]] = field(default_factory=list)

    def add(self, part: Written) -> None:
        """Take in what a part of this write did."""
        self.outcomes += part.outcomes
        self.stuck += part.stuck
        self.failed += part.failed


# A batch's statement over some of its jobs (None: the whole batch), with a lock timeout (None:
# the usual one).
Statement = Callable[[list[str] | None, float | None], Awaitable[list[JobOutcome]]]


@dataclass(frozen=True, slots=True)
class Batch:
    """What one write records: the timer's given jobs (``record_jobs``), or the scan's oldest
    due ones (``record_oldest``), whose ids are read only when the batch must be split."""

    source: str  # timer or scan
    run: Statement
    jobs: Callable[[], Awaitable[list[str]]]
    known: list[str] | None = None  # the jobs, when given before the statement runs
    limit: int | None = None  # the most jobs the scan's statement takes
