"""The benchmarks' own connections: opening one, reading a value, naming its database.

A benchmark's connections are named ``bench-<role>``; the reactor's are ``reactor-*``, so counting
sessions by application_name never mixes the two.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import psycopg
import psycopg.conninfo

Conn = psycopg.AsyncConnection[Any]


async def connect(dsn: str, role: str, *, autocommit: bool = True) -> Conn:
    """A plain connection for the benchmark's own work, named ``bench-<role>``.

    The reactor's own sessions are named ``reactor-*``; ours never are, so counting by
    application_name (or by database) never mixes the two.
    """
    return await psycopg.AsyncConnection.connect(
        psycopg.conninfo.make_conninfo(dsn, application_name=f"bench-{role}"),
        autocommit=autocommit,
    )


def dbname(dsn: str) -> str:
    """The database a DSN names."""
    return str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])


async def scalar(conn: Conn, query: str, params: Any = None) -> Any:
    """The first column of the first row."""
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    assert row is not None, query
    return row[0]


def asyncpg_params(dsn: str) -> dict[str, Any]:
    """Connection keywords for asyncpg, which takes no libpq key=value strings."""
    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    params: dict[str, Any] = {
        "host": parts.get("host", "127.0.0.1"),
        "port": int(str(parts.get("port", 5432))),
        "user": parts.get("user", "postgres"),
        "database": parts.get("dbname", "postgres"),
    }
    if "password" in parts:
        params["password"] = parts["password"]
    return params


async def total_sizes(conn: Conn, names: Sequence[str]) -> dict[str, int]:
    """Each relation's total size in bytes (indexes and TOAST included), by name."""
    return {
        name: int(await scalar(conn, "SELECT pg_total_relation_size(%s)", (name,)))
        for name in names
    }


async def timed(conn: Conn, query: str, params: Any = None) -> tuple[float, list[Any]]:
    """The wall time of ``query``, its rows fetched (none for a statement that returns none),
    and the rows."""
    started = time.perf_counter()
    cur = await conn.execute(query, params)
    rows = await cur.fetchall() if cur.description is not None else []
    return time.perf_counter() - started, rows
