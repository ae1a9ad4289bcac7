"""The pool's check of a connection it hands out, and the statements that are their own check
(reactor.db.pool): skipped on a connection given back lately, and run again when it was lost."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import psycopg
import psycopg.errors
import pytest
from psycopg.rows import TupleRow, tuple_row
from psycopg_pool import AsyncConnectionPool

from reactor import db
from reactor.install import REFERENCE_INSTALL

pytestmark = pytest.mark.anyio


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pool's checks of a connection, as they run (the backend's pid each)."""
    seen: list[int] = []
    check = AsyncConnectionPool.check_connection

    async def counted(conn: db.AnyConnection) -> None:
        seen.append(conn.info.backend_pid)
        await check(conn)

    monkeypatch.setattr(AsyncConnectionPool, "check_connection", staticmethod(counted))
    return seen


@pytest.fixture
async def pooled(database_url: str) -> AsyncIterator[db.Pooled]:
    async with db.make_pool(database_url, max_size=1) as pool:
        yield db.Pooled(pool)


class Counted:
    """A pooled statement that counts its tries."""

    def __init__(self, pooled: db.Pooled, query: str, lock_timeout: float | None = None) -> None:
        self.pooled, self.query, self.lock_timeout = pooled, query, lock_timeout
        self.tries = 0

    async def __call__(self) -> list[TupleRow]:
        self.tries += 1
        return await self.pooled.fetch(self.query, {}, tuple_row, lock_timeout=self.lock_timeout)


async def test_a_statement_that_is_its_own_check_skips_the_pools_on_a_connection_given_back(
    pooled: db.Pooled, checks: list[int]
) -> None:
    await pooled.fetch("SELECT 1", {}, tuple_row)
    assert len(checks) == 1  # a connection never given back is checked

    rows = await db.own_check(Counted(pooled, "SELECT 2"))
    assert rows == [(2,)]
    assert len(checks) == 1

    # Any other statement is checked as before.
    await pooled.fetch("SELECT 3", {}, tuple_row)
    assert len(checks) == 2


async def test_a_connection_lost_while_idle_costs_its_own_check_one_more_try(
    database_url: str, pooled: db.Pooled, checks: list[int]
) -> None:
    ((pid,),) = await pooled.fetch("SELECT pg_backend_pid()", {}, tuple_row)
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    statement = Counted(pooled, "SELECT pg_backend_pid()")
    ((now,),) = await db.own_check(statement)
    assert statement.tries == 2
    assert now != pid
    # The second try was checked, on the new connection.
    assert checks[-1] == now


async def test_a_statement_the_server_refuses_is_not_tried_again(
    database_url: str, pooled: db.Pooled, checks: list[int]
) -> None:
    await pooled.fetch("SELECT 1", {}, tuple_row)
    locked_out = Counted(pooled, "LOCK TABLE own_check_probe", lock_timeout=0.1)
    with psycopg.connect(database_url) as holder:
        holder.execute("CREATE TABLE IF NOT EXISTS own_check_probe ()")
        holder.commit()
        holder.execute("LOCK TABLE own_check_probe")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            await db.own_check(locked_out)
        holder.rollback()
        holder.execute("DROP TABLE own_check_probe")
        holder.commit()
    assert locked_out.tries == 1
    # Skipped: the pool's check did not run for it.
    assert len(checks) == 1


async def test_verifying_notifications_is_its_own_check(
    database_url: str, checks: list[int]
) -> None:
    async with db.make_pool(database_url, max_size=1) as pool:
        database = db.Database.pooled(REFERENCE_INSTALL, pool)
        await database.verify_hints([], [], liveness=1.0)
        assert len(checks) == 1  # a connection never given back is checked
        found = await database.verify_hints([str(uuid.uuid4())], [], liveness=1.0)
        assert found.jobs == []
        assert len(checks) == 1
