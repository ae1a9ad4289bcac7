"""Deleting settled hook rows once ``REACTOR_HOOK_RETENTION_SECONDS`` have passed."""

from __future__ import annotations

import logging
import math
from typing import Protocol

from reactor import db
from reactor.insurance.cadence import Every
from reactor.settings.config import Settings

log = logging.getLogger("reactor.hooks")

_PURGE_BATCH = 1000
# The purge is brought forward by every health check that sees settled rows past their
# retention, so the oldest of them outlives it by about one check interval at most. By more
# than this many intervals, the purge is not running (it fails, or no replica runs).
LATE_CHECKS = 20


def retention_late(overdue: float, check_interval: float) -> bool:
    """Whether settled hook rows that outlived their retention by ``overdue`` seconds, with
    health checks every ``check_interval`` seconds, say the purge is not running."""
    return overdue > LATE_CHECKS * check_interval


def every(settings: Settings) -> Every:
    """The purge's cadence: only when the health check sees settled rows past their retention;
    a failed purge waits for the next check that sees them again."""
    return Every("retention", math.inf, retry=lambda _: math.inf, first_at=math.inf)


class Stopped(Protocol):
    """Whether the replica is stopping (an :class:`anyio.Event`)."""

    def is_set(self) -> bool:
        """True once it stops."""
        ...


class HookRetention:
    """Deletes settled hook rows past ``REACTOR_HOOK_RETENTION_SECONDS``, in small batches.

    It is a duty of the replica's cadence that runs only when brought forward: the replica's
    health check says when settled rows have outlived their retention, so a quiet outbox costs
    no statement of its own. Every replica has one; replicas purging at once share the rows (each
    locks its batch and skips the others'), and nothing another role can hold decides whose turn
    it is. Failed rows are never deleted: they need a person.
    """

    def __init__(self, settings: Settings, database: db.Database, *, stopping: Stopped) -> None:
        self.settings = settings
        self.database = database
        self.stopping = stopping
        self.late = False

    def saw(self, overdue: float, check_interval: float) -> None:
        """A health check read that the oldest settled row outlived its retention by
        ``overdue`` seconds: warn once as the purge falls behind (:func:`retention_late`), and
        say so once it has caught up."""
        late = retention_late(overdue, check_interval)
        if late and not self.late:
            log.warning(
                "hook retention has not run for a long time: settled hook rows outlived "
                "REACTOR_HOOK_RETENTION_SECONDS by %.0fs, more than %d health checks; see the "
                "lines 'hook retention failed'",
                overdue,
                LATE_CHECKS,
                extra={"overdue_s": round(overdue, 1)},
            )
        elif self.late and not late:
            log.info("hook retention caught up")
        self.late = late

    async def duty(self) -> None:
        """The purge as the schedule begins it (the count is the log's)."""
        await self.purge()

    async def purge(self, batch: int = _PURGE_BATCH) -> int:
        """Delete batches until none is full or the replica stops; the count. Raises when the
        database failed a batch (the next health check that sees expired rows brings the duty
        forward again)."""
        total = 0
        while not self.stopping.is_set():
            deleted = await self.database.purge_hooks(self.settings.hook_retention, batch)
            total += deleted
            if deleted < batch:
                break
        if total:
            log.info("deleted settled hook rows past their retention", extra={"deleted": total})
        return total
