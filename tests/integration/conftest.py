"""Running reactors in-process against the per-test database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest

from reactor import db
from reactor.install.mapping import REFERENCE
from reactor.runtime.replica import open_replica
from reactor.runtime.service import Reactor
from reactor.settings.config import Settings
from reactor.settings.pairs import Pair
from tests.helpers import IN_PROCESS_SETTINGS

StartReactor = Callable[..., AbstractAsyncContextManager[Reactor]]


@pytest.fixture
def start_reactor(database_url: str) -> StartReactor:
    """``async with start_reactor(grace=0.3) as r:`` runs a reactor until the block ends.

    Keyword arguments are Settings fields (``database_url`` too, e.g. through a pooler), and
    ``instrument``, which wraps the reactor's queries (see :func:`open_replica`); the replica of
    its one pair is started (its listener's first attempt over) on entry and stopped with its drain
    on exit.
    """

    @asynccontextmanager
    async def start(
        instrument: Callable[[db.Database], db.Database] | None = None, **overrides: Any
    ) -> AsyncIterator[Reactor]:
        fields: dict[str, Any] = {
            "database_url": database_url,
            "grace": 0.5,
            **IN_PROCESS_SETTINGS,
            **overrides,
        }
        settings = Settings(**fields)
        pair = Pair.of(REFERENCE.in_public(), settings)
        async with (
            open_replica(settings, [pair], instrument=instrument) as replica,
            replica.running(),
        ):
            yield replica.reactors[pair.name]

    return start
