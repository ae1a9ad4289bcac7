"""`reactor migrate` compiles every function body it creates, whatever the database's owner set:
a body that ended early (a name that closed its dollar quote) fails its transaction before the
rest of the text runs."""

from __future__ import annotations

import psycopg
import psycopg.errors
import pytest

from reactor import db
from reactor.db.online_ddl import migration_transaction
from tests.helpers import no_function_body_checks

pytestmark = pytest.mark.anyio

# A body cut short: what a name holding the delimiter would leave of one, then a statement.
CUT_SHORT = (
    "CREATE FUNCTION public.cut_short() RETURNS boolean LANGUAGE plpgsql AS $$"
    " BEGIN RETURN coalesce(saved_by = 'w$$;"
    " CREATE TABLE public.after_the_body ();"
)


async def test_a_migration_transaction_compiles_function_bodies_when_the_database_does_not(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    no_function_body_checks(url)
    async with await db.connect(url, "test") as conn:
        cur = await conn.execute("SHOW check_function_bodies")
        assert await cur.fetchone() == ("off",)

        with pytest.raises(psycopg.errors.SyntaxError):
            await migration_transaction(conn, CUT_SHORT)

        cur = await conn.execute(
            "SELECT to_regprocedure('public.cut_short()'), to_regclass('public.after_the_body')"
        )
        assert await cur.fetchone() == (None, None)
