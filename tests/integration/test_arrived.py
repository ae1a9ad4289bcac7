"""reactor.db.arrived and reactor.db.kept_aside: what the listener reads its notifications with,
on a real session."""

from __future__ import annotations

import psycopg
import pytest

from reactor import db

pytestmark = pytest.mark.anyio


async def test_arrived_reads_what_reached_the_socket_in_order_without_waiting(
    database_url: str,
) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("LISTEN first_done")
        assert await db.arrived(conn) == []  # nothing yet, and no wait for it
        with psycopg.connect(database_url) as app:  # one commit, two notifications
            app.execute("SELECT pg_notify('first_done', 'a'), pg_notify('first_done', 'b')")
        await db.until_readable(conn, 10)
        notes = await db.arrived(conn)
        while len(notes) < 2:  # the two may come in two reads of the socket
            await db.until_readable(conn, 10)
            notes += await db.arrived(conn)
        assert [(n.channel, n.payload) for n in notes] == [("first_done", "a"), ("first_done", "b")]


async def test_what_psycopg_keeps_aside_during_a_statement_only_kept_aside_reads(
    database_url: str,
) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("LISTEN first_done")
        with psycopg.connect(database_url, autocommit=True) as app:
            app.execute("NOTIFY first_done, 'during'")
        # A statement on the session reads the notification with its result, and psycopg keeps
        # it aside, where the socket no longer shows it and a direct read does not find it.
        await conn.execute("SELECT pg_sleep(0.2)")
        assert await db.arrived(conn) == []
        assert [n.payload for n in await db.kept_aside(conn)] == ["during"]
