"""One pool, several pairs: each pair's queries hold at most their share of its connections."""

from __future__ import annotations

import time

import anyio
import pytest
from psycopg.rows import tuple_row

from reactor import db
from tests.helpers import scalar_from
from tests.polling import eventually

pytestmark = pytest.mark.anyio


def running(database_url: str) -> int:
    """The pg_sleep statements running now."""
    sleeping = (
        "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(3)'"
        " AND state = 'active'"
    )
    return int(scalar_from(database_url, sleeping))


async def test_a_pair_whose_statements_hang_leaves_the_others_their_connections(
    database_url: str,
) -> None:
    async with db.make_pool(database_url, max_size=3) as pool:
        stuck = db.Pooled(pool, share=anyio.CapacityLimiter(2))
        healthy = db.Pooled(pool, share=anyio.CapacityLimiter(2))

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(stuck.fetch, "SELECT pg_sleep(3)", {}, tuple_row)
            # The database is the witness that they run.
            await eventually(lambda: running(database_url) >= 2, timeout=10)
            # Five statements of the stuck pair wait for their share, two hold it; the pool's
            # third connection is the healthy pair's.
            began = time.monotonic()
            rows = await healthy.fetch("SELECT 1", {}, tuple_row)
            took = time.monotonic() - began
            # Never more of them than the share.
            assert running(database_url) == 2
            tg.cancel_scope.cancel()
        assert rows == [(1,)]
        assert took < 2.0
