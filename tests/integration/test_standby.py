"""Connections that meet a read-only hot standby: how :func:`db.connect` treats one, and how a
pooled connection that turns out read-only is dropped, so the pool replaces it.

The standby sits behind a fault proxy that can be re-pointed at the primary: an address that
leads to a standby after a failover, then to a writable server again, with the connection the
pool opened to the standby still open.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg.errors
import pytest

from reactor import db
from reactor.demo.embedded import EmbeddedPostgres
from reactor.errors import DatabaseReadOnly
from tests.faults.proxy import FaultProxy
from tests.faults.support import host_port, with_port

pytestmark = pytest.mark.anyio


@pytest.fixture
def proxy(standby: EmbeddedPostgres) -> Iterator[FaultProxy]:
    """A proxy that leads to the standby until re-pointed."""
    fault_proxy = FaultProxy("127.0.0.1", standby.port).start()
    try:
        yield fault_proxy
    finally:
        fault_proxy.close()


async def in_recovery(pool: Any) -> bool:
    async with pool.connection() as conn:
        [(answer,)] = await db.call(conn, "SELECT pg_is_in_recovery()")
    return bool(answer)


# A session of its own runs the statement bare: the write fails with 25006. Behind a pooler (or
# with a lock timeout of its own) the call is pinned, and its BEGIN READ WRITE fails first.
@pytest.mark.parametrize(
    ("lock_timeout", "error"),
    [(None, psycopg.errors.ReadOnlySqlTransaction), (0.5, psycopg.errors.FeatureNotSupported)],
    ids=["bare", "pinned"],
)
async def test_a_pooled_connection_that_turns_out_read_only_is_replaced(
    database_url: str,
    standby_url: str,
    proxy: FaultProxy,
    lock_timeout: float | None,
    error: type[psycopg.Error],
) -> None:
    async with db.make_pool(with_port(database_url, proxy.port), max_size=1) as pool:
        assert await in_recovery(pool)
        async with pool.connection() as conn:
            with pytest.raises(error):
                await db.call(conn, "SELECT pg_notify('c', 'p')", lock_timeout=lock_timeout)
            # Closed before it goes back: the pool discards it and opens another.
            assert conn.closed
        # The address leads to the primary now; the pool's next connection goes there.
        proxy.upstream = host_port(database_url)
        assert not await in_recovery(pool)
        async with pool.connection() as conn:
            await db.call(conn, "SELECT pg_notify('c', 'p')", lock_timeout=lock_timeout)


async def test_an_error_that_is_not_about_read_only_keeps_the_connection(
    database_url: str,
) -> None:
    async with db.make_pool(database_url, max_size=1) as pool, pool.connection() as conn:
        with pytest.raises(psycopg.errors.UndefinedTable):
            await db.call(conn, "SELECT * FROM no_such_table")
        assert not conn.closed


async def test_connect_accepts_refuses_or_retries_a_standby(
    database_url: str, standby_url: str, standby: EmbeddedPostgres
) -> None:
    async with await db.connect(standby_url, "test", configure_session=False) as conn:
        problem = await db.standby_problem(conn)
    assert problem is not None
    assert f"127.0.0.1:{standby.port} is a read-only hot standby" in problem
    # The test server's superuser may read pg_stat_wal_receiver: the primary is named.
    assert f"streams from 127.0.0.1:{host_port(database_url)[1]}" in problem
    policies: tuple[tuple[db.StandbyPolicy, int], ...] = (("refuse", 1), ("retry", 2))
    for policy, attempts in policies:
        with pytest.raises(DatabaseReadOnly) as refused:
            await db.connect(standby_url, "test", attempts=attempts, standby=policy)
        assert str(refused.value) == problem
        assert refused.value.exit_code == 3
    async with await db.connect(database_url, "test", standby="refuse") as conn:
        assert await db.standby_problem(conn) is None


async def test_a_listen_dsn_names_its_own_setting(standby_url: str) -> None:
    with pytest.raises(DatabaseReadOnly, match="point REACTOR_LISTEN_DATABASE_URL at the primary"):
        await db.connect(
            standby_url, "listener", standby="refuse", source="REACTOR_LISTEN_DATABASE_URL"
        )
