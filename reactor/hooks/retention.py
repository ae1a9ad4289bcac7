"""Deleting settled hook rows once ``REACTOR_HOOK_RETENTION_SECONDS`` have passed."""

from __future__ import annotations

import logging
from collections.abc import Callable

from reactor import db
from reactor.config import Settings

log = logging.getLogger("reactor.hooks")

_PURGE_BATCH = 1000


class HookRetention:
    """Deletes settled hook rows past ``REACTOR_HOOK_RETENTION_SECONDS``, in small batches.

    It is a duty of the replica's cadence that runs only when brought forward: the replica's
    health check says when settled rows have outlived their retention, so a quiet outbox costs
    no statement of its own. Every replica has one; replicas purging at once share the rows (each
    locks its batch and skips the others'), and nothing another role can hold decides whose turn
    it is. Failed rows are never deleted: they need a person.
    """

    def __init__(
        self, settings: Settings, database: db.Database, *, is_stopping: Callable[[], bool]
    ) -> None:
        self.settings = settings
        self.database = database
        self.is_stopping = is_stopping

    async def purge(self, batch: int = _PURGE_BATCH) -> int:
        """Delete batches until none is full or the replica stops; the count. Raises when the
        database failed a batch (the next health check that sees expired rows brings the duty
        forward again)."""
        total = 0
        while not self.is_stopping():
            deleted = await self.database.purge_hooks(self.settings.hook_retention, batch)
            total += deleted
            if deleted < batch:
                break
        if total:
            log.info("deleted settled hook rows past their retention", extra={"deleted": total})
        return total
