"""The named queries of an install, bound to where they run: what every part of
:class:`~.queries.Database` stands on.

:class:`NamedQueries` holds the install whose statements run, the connector they run on (a
replica's pool, :class:`~.calls.Pooled`, or a connection of its own, :class:`~.calls.Dedicated`),
the pair's settings they read (the grace) and the names of the pair's hooks, and runs a named
query by its name. Each concern's queries are a part of their own, in a module of their own
(:mod:`.health`, :mod:`.reconcile`, :mod:`.outbox`), and :class:`~.queries.Database` is all of
them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, Self, TypeVar

import anyio
from psycopg.rows import AsyncRowFactory, dict_row
from psycopg_pool import AsyncConnectionPool

from reactor.db.calls import Connector, Dedicated, Pooled
from reactor.db.session import AnyConnection
from reactor.install import Install

R = TypeVar("R")

# Documents one scan statement writes at most: 500 reports of several MB each would otherwise
# pass the statement timeout together and fail the whole batch.
BATCH_BYTES = 64 * 1024 * 1024


class QuerySettings(Protocol):
    """What the queries read of their pair's settings (a pair's
    :class:`~reactor.settings.config.Settings` is one): read where they are, never copied."""

    @property
    def grace(self) -> float:
        """The grace window, in seconds."""
        ...


@dataclass(frozen=True)
class _NoGrace:
    grace: float = 0.0


# The settings of queries no pair's settings were given for (a command's checks, a test's own
# statements): a job is due as soon as it needs a run.
NO_GRACE: QuerySettings = _NoGrace()


@dataclass(frozen=True)
class NamedQueries:
    """The named queries of ``install``, run on ``on``.

    ``settings`` are the pair's, and ``hooks`` the names of its hooks: every run written gets
    one outbox row per name, in the same statement. ``batch_bytes`` caps the documents one scan
    statement writes (the first job is always taken, however large).
    """

    install: Install
    on: Connector = field(repr=False)
    settings: QuerySettings = field(default=NO_GRACE, repr=False)
    hooks: tuple[str, ...] = ()
    batch_bytes: int = BATCH_BYTES

    @classmethod
    def pooled(
        cls,
        install: Install,
        pool: AsyncConnectionPool[AnyConnection],
        *,
        settings: QuerySettings = NO_GRACE,
        hooks: Sequence[str] = (),
        share: anyio.CapacityLimiter | None = None,
    ) -> Self:
        """The queries through ``pool``, each as :func:`~.calls.call` runs it; ``share``
        caps the connections they hold at once (see :class:`~.calls.Pooled`)."""
        return cls(install, Pooled(pool, share=share), settings, tuple(hooks))

    @classmethod
    def dedicated(
        cls, install: Install, conn: AnyConnection, *, settings: QuerySettings = NO_GRACE
    ) -> Self:
        """The queries on ``conn``, a connection of the caller's own."""
        return cls(install, Dedicated(conn), settings)

    def using(self, conn: AnyConnection) -> Self:
        """These queries on ``conn`` instead (the LISTEN connection, a session of our own)."""
        return replace(self, on=Dedicated(conn))

    @property
    def grace(self) -> float:
        """The pair's grace, in seconds, as its settings say it."""
        return self.settings.grace

    @property
    def pool(self) -> AsyncConnectionPool[AnyConnection]:
        """The pool these queries run through (a connector that wraps a pooled one, such as a
        benchmark's counter, names it too)."""
        pool = getattr(self.on, "pool", None)
        if not isinstance(pool, AsyncConnectionPool):
            raise TypeError("this Database runs on a connection of its own, not a pool")
        return pool

    async def run(
        self,
        name: str,
        params: Any,
        row_factory: AsyncRowFactory[R],
        *,
        filename: str = "queries.sql",
        lock_timeout: float | None = None,
    ) -> list[R]:
        """Run the named query of ``triggers/<filename>``; its rows, made by ``row_factory``.
        Every query of this class goes through here (a benchmark counting them wraps it)."""
        query = self.install.query(name, filename)
        return await self.on.fetch(query, params, row_factory, lock_timeout=lock_timeout)

    async def fetch_dicts(
        self, name: str, params: Any = None, *, filename: str = "queries.sql"
    ) -> list[dict[str, Any]]:
        """The rows of the named query as dicts, for status and reporting."""
        return await self.run(name, params, dict_row, filename=filename)
