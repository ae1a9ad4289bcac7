"""The install lock on an existing install: a lease on the row of reactor.install_lock, which
only the schema's owner may change. A live holder makes `reactor migrate` wait and the printed
script refuse; a holder whose session ended holds nothing; a role without privileges on the
table cannot take it."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import psycopg
import psycopg.conninfo
import psycopg.errors
import pytest

from reactor import db
from reactor.install import REFERENCE_INSTALL
from reactor.install.mapping import REFERENCE
from tests.conftest import NewRole
from tests.integration.test_schema import execute
from tests.polling import eventually

pytestmark = pytest.mark.anyio

TAKE = REFERENCE_INSTALL.query("take_install_lock", "install_lock.sql")


def take(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(TAKE).fetchone()
    assert row is not None
    return bool(row[0])


async def test_a_live_holder_makes_migrate_wait_and_a_dead_one_holds_nothing(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reactor.db")
    holder = psycopg.connect(database_url, autocommit=True)
    assert take(holder)
    pid = holder.info.backend_pid
    done = anyio.Event()

    async def migrate() -> None:
        async with await db.connect(database_url, "test") as conn:
            await db.migrate(conn, REFERENCE)
        done.set()

    def waiting() -> bool:
        return any(f"is running (pid {pid}," in r.getMessage() for r in caplog.records)

    async with anyio.create_task_group() as tg:
        tg.start_soon(migrate)
        await eventually(waiting)
        assert not done.is_set()
        # The holder's session ends without giving the lease up, as a killed migrate's would.
        holder.close()
        with anyio.fail_after(30):
            await done.wait()
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT pid FROM reactor.install_lock").fetchone()
        assert row == (None,), "migrate gave its lease up"


async def test_the_printed_script_refuses_while_another_session_holds_the_lease(
    database_url: str,
) -> None:
    script = db.migration_script(REFERENCE_INSTALL, reference_schema=False, applied=21)
    # What an install at the current version applies: the repeatable part, on the lease road.
    repeatable = script.split("-- the triggers, repeatable", 1)[1]
    with psycopg.connect(database_url, autocommit=True) as holder:
        assert take(holder)
        with pytest.raises(psycopg.errors.RaiseException, match="another session runs"):
            execute(database_url, repeatable)
    # The holder gone, the whole script applies, and gives the lease up at its end.
    execute(database_url, repeatable)
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert conn.execute("SELECT pid FROM reactor.install_lock").fetchone() == (None,)


def test_a_role_without_privileges_cannot_take_the_lease(
    database_url: str, new_login_role: NewRole
) -> None:
    stranger = new_login_role("stranger")
    with psycopg.connect(database_url, autocommit=True) as admin:
        # Even with USAGE on the schema and SELECT on the table, a row lock needs UPDATE.
        admin.execute(f'GRANT USAGE ON SCHEMA reactor TO "{stranger}"')
        admin.execute(f'GRANT SELECT ON reactor.install_lock TO "{stranger}"')
    dsn = psycopg.conninfo.make_conninfo(database_url, user=stranger)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in (
            TAKE,
            "SELECT 1 FROM reactor.install_lock FOR UPDATE",
            "BEGIN; LOCK TABLE reactor.install_lock IN SHARE UPDATE EXCLUSIVE MODE; COMMIT",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)


async def test_a_row_deleted_by_hand_is_put_back_and_taken(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM reactor.install_lock")
    async with await db.connect(database_url, "test") as conn:
        assert (await db.migrate(conn, REFERENCE)).applied == []
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert conn.execute("SELECT pid FROM reactor.install_lock").fetchall() == [(None,)]
