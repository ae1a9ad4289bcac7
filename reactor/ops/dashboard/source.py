"""The ``status`` report the page shows, collected at most once every :data:`REPORT_TTL_S` seconds
however many tabs refresh, each collection bounded by :data:`REPORT_TIMEOUT_S`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import anyio

from reactor import db
from reactor.db import errors as db_errors
from reactor.errors import ReactorError
from reactor.settings.config import Settings
from reactor.telemetry import redact

# How long one report serves every request.
REPORT_TTL_S = 2.0
# The most one collection may take, waiting for a pool connection included.
REPORT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Snapshot:
    """What one request is served: the last report (None before any answered) and, when the
    latest attempt failed, why."""

    document: dict[str, Any] | None
    error: str | None
    taken_at: float  # monotonic time of the attempt
    document_at: float | None  # monotonic time the document was collected


@dataclass(eq=False, repr=False)
class StatusSource:
    """The ``status`` report for the page, collected at most once every ``ttl`` seconds."""

    settings: Settings
    # Where the report is read: the pooled queries of the install shown (None: not yet, and
    # ``absent`` says why).
    queries: Callable[[], db.Database | None]
    _: KW_ONLY
    ttl: float = REPORT_TTL_S
    timeout: float = REPORT_TIMEOUT_S
    clock: Callable[[], float] = time.monotonic
    absent: Callable[[], str] = lambda: "no replica runs yet: the database is being checked"
    collections: int = field(default=0, init=False)  # how many times the database was asked
    _last: Snapshot | None = field(default=None, init=False)
    _lock: anyio.Lock = field(default_factory=anyio.Lock, init=False)

    def invalidate(self) -> None:
        """Forget the report: an action changed what it says."""
        self._last = None

    async def get(self) -> Snapshot:
        """The report, fresh within ``ttl``; waits at most ``timeout`` for it."""
        last = self._last
        if last is not None and self.clock() - last.taken_at < self.ttl:
            return last
        with anyio.move_on_after(self.timeout):
            async with self._lock:
                last = self._last
                if last is not None and self.clock() - last.taken_at < self.ttl:
                    return last  # collected while this request waited for the lock
                self._last = await self._collect()
                return self._last
        # Another request's collection holds the lock past the bound: the database is slow.
        return self._failed(f"the database did not answer within {self.timeout:g} s")

    async def _collect(self) -> Snapshot:
        self.collections += 1
        started = self.clock()
        database = self.queries()
        if database is None:
            return self._failed(self.absent())
        # Here, not at start: the report's module brings rich (its terminal rendering), which
        # only `reactor status` uses and a replica need not load before it is ready.
        from reactor import status

        try:
            with anyio.fail_after(self.timeout), db_errors.translated():
                async with database.pool.connection(timeout=self.timeout) as conn:
                    report = await status.collect(conn, database.install, self.settings)
        except TimeoutError:
            return self._failed(f"the database did not answer within {self.timeout:g} s")
        except ReactorError as error:  # the database's errors arrive translated
            return self._failed(str(error) or type(error).__name__)
        return Snapshot(status.as_json(report), None, started, started)

    def _failed(self, reason: str) -> Snapshot:
        last = self._last
        return Snapshot(
            None if last is None else last.document,
            redact.scrub(reason),
            self.clock(),
            None if last is None else last.document_at,
        )
