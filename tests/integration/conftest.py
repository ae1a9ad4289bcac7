"""Running reactors in-process against the per-test database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import pytest

from reactor import db
from reactor.config import Settings
from reactor.hooks import open_hooks
from reactor.service import POOL_SIZE, Reactor

StartReactor = Callable[..., AbstractAsyncContextManager[Reactor]]


@pytest.fixture
def start_reactor(database_url: str) -> StartReactor:
    """``async with start_reactor(grace=0.3) as r:`` runs a reactor until the block ends.

    Keyword arguments are Settings fields (``database_url`` too, e.g. through a pooler); the
    reactor is started (its listener's first attempt over) on entry and stopped with its drain
    on exit.
    """

    @asynccontextmanager
    async def start(**overrides: Any) -> AsyncIterator[Reactor]:
        fields: dict[str, Any] = {
            "database_url": database_url,
            "grace": 0.5,
            "scan_interval": 30.0,
            "http_addr": None,
            "probe_interval": 1.0,
            "probe_timeout": 1.0,
            **overrides,
        }
        settings = Settings(**fields)
        async with (
            db.make_pool(settings.require_database(), max_size=POOL_SIZE) as pool,
            open_hooks(settings, pool) as hooks,
        ):
            database = db.Database(pool, grace=settings.grace, hooks=list(hooks))
            reactor = Reactor(settings, database, hooks=hooks)
            async with anyio.create_task_group() as tg:
                await tg.start(reactor.run)
                try:
                    yield reactor
                finally:
                    reactor.stop()

    return start


async def eventually(
    check: Callable[[], Any],
    *,
    timeout: float = 10.0,  # noqa: ASYNC109 -- a polling helper: the bound is its whole point
    interval: float = 0.02,
) -> Any:
    """Poll ``check`` until it returns something truthy; the database has no event to await."""
    with anyio.fail_after(timeout):
        while True:
            result = check()
            if result:
                return result
            await anyio.sleep(interval)
