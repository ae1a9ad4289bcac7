"""How each of the reactor's statements runs on a connection: bare, or pinned in a transaction of
its own (see :mod:`.session` for which, and why), and the connectors the named queries run on:
through the pool (:class:`Pooled`), or on a connection of the caller's own (:class:`Dedicated`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, TypeVar, overload

import anyio
import psycopg
import psycopg.errors
import psycopg.sql
from psycopg.pq import TransactionStatus
from psycopg.rows import AsyncRowFactory, TupleRow, tuple_row
from psycopg_pool import AsyncConnectionPool

from reactor.db.session import (
    CHECK_TIMEOUT_S,
    NAME_PATH,
    STATEMENT_BOUNDS,
    AnyConnection,
    first_line,
    is_own_session,
    log,
    server_address,
)

R = TypeVar("R")

# Every pooled call gives up client-side after this long. TCP settings cannot see a peer that
# keeps the connection open and never answers (a frozen backend, a stuck proxy); this can.
CALL_TIMEOUT_S = 35.0  # statement_timeout above, plus room to hear about it

_BEGIN = b"BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE"


def _pin(settings: Mapping[str, str]) -> bytes:
    """One statement that sets ``settings`` LOCAL: literals, not parameters, so the server
    has no plan to make for it (it runs unprepared on every call behind a pooler)."""
    calls = psycopg.sql.SQL(", ").join(
        psycopg.sql.SQL("set_config({}, {}, true)").format(
            psycopg.sql.Literal(name), psycopg.sql.Literal(value)
        )
        for name, value in settings.items()
    )
    return psycopg.sql.SQL("SELECT {}").format(calls).as_bytes(None)


# What a pinned call sets LOCAL: the bounds, and where unqualified names are found.
_PINNED = {**STATEMENT_BOUNDS, **NAME_PATH}
_PIN_BOUNDS = _pin(_PINNED)


@overload
async def call(
    conn: AnyConnection, query: str, params: Any = None, *, lock_timeout: float | None = None
) -> list[TupleRow]: ...


@overload
async def call(
    conn: AnyConnection,
    query: str,
    params: Any = None,
    *,
    lock_timeout: float | None = None,
    row_factory: AsyncRowFactory[R],
) -> list[R]: ...


async def call(
    conn: AnyConnection,
    query: str,
    params: Any = None,
    *,
    lock_timeout: float | None = None,
    row_factory: AsyncRowFactory[Any] = tuple_row,
) -> list[Any]:
    """Run one statement on a pool connection, as the module docstring says; its rows, made by
    ``row_factory`` (tuples unless given).

    ``lock_timeout`` (seconds) replaces the usual bound on waiting for a row lock, for this
    statement only.

    A server that turns out read-only (a hot standby: the old primary back after a failover,
    behind an address that used to be the primary's) costs the connection: it is closed, so the
    pool discards it and opens another, which with ``target_session_attrs=read-write`` lands on
    whichever host accepts writes now. The error is raised as always; the caller retries.
    """
    own = is_own_session(conn)
    try:
        if own and lock_timeout is None:
            return await run_bare(conn, query, params, row_factory=row_factory)
        if lock_timeout is None:
            return await run_pinned(conn, query, params, row_factory=row_factory)
        waiting = _lock_wait(lock_timeout)
        settings = waiting if own else {**_PINNED, **waiting}
        return await run_pinned(conn, query, params, settings, row_factory=row_factory)
    except psycopg.Error as error:
        if read_only_server(error, conn):
            await _drop(conn, error)
        raise


def _lock_wait(seconds: float) -> dict[str, str]:
    return {"lock_timeout": f"{max(1, round(seconds * 1000))}ms"}


def read_only_server(error: BaseException, conn: AnyConnection | None = None) -> bool:
    """True when ``error`` says the server is read-only: SQLSTATE 25006 (a write, LISTEN or
    NOTIFY on a hot standby), or a pinned call's ``BEGIN ... READ WRITE`` refused during
    recovery (0A000), which ``conn``'s server, when given, must not have reported a primary."""
    if isinstance(error, psycopg.errors.ReadOnlySqlTransaction):
        return True
    if not isinstance(error, psycopg.errors.FeatureNotSupported):
        return False
    # PostgreSQL 14 on reports in_hot_standby, and updates it on promotion; older servers and
    # some poolers say nothing, and then the error alone decides (none of the reactor's
    # statements is otherwise unsupported).
    return conn is None or conn.closed or conn.info.parameter_status("in_hot_standby") != "off"


def statement_refused(error: BaseException) -> bool:
    """True when the server refused the statement for what it names (a table or a schema
    gone, a privilege revoked, a lock not granted in time) and the connection and the server
    are fine: a statement about other objects would have run."""
    state = error.sqlstate if isinstance(error, psycopg.Error) else None
    # 08: the connection; 53: the server's resources; 57: the server shutting down or the
    # statement cancelled (its timeout); 25006: a read-only server.
    return state is not None and state[:2] not in ("08", "53", "57") and state != "25006"


async def _drop(conn: AnyConnection, error: BaseException) -> None:
    if conn.closed:
        return  # the pool discards it as it is
    log.debug(
        "closing a connection to a read-only server",
        extra={
            "server": server_address(conn.info.host, conn.info.port),
            "error": first_line(error),
        },
    )
    with anyio.CancelScope(shield=True):
        await conn.close()


async def run_bare(
    conn: AnyConnection, query: str, params: Any = None, *, row_factory: AsyncRowFactory[R]
) -> list[R]:
    """Run ``query`` as one autocommit statement, under the session's own settings; return its
    rows, made by ``row_factory`` (none for a command)."""
    cur = conn.cursor(row_factory=row_factory)
    await cur.execute(query, params)
    return await cur.fetchall() if cur.description is not None else []


async def run_pinned(
    conn: AnyConnection,
    query: str,
    params: Any = None,
    settings: Mapping[str, str] | None = None,
    *,
    row_factory: AsyncRowFactory[R],
) -> list[R]:
    """Run ``query`` in a READ COMMITTED transaction of its own with ``settings`` set LOCAL
    (default: the reactor's statement bounds), in one round trip; return its rows, made by
    ``row_factory`` (none for a command).

    The transaction is rolled back if anything fails, so the connection goes back idle.
    """
    pin = _PIN_BOUNDS if settings is None else _pin(settings) if settings else None
    try:
        async with conn.pipeline():
            await conn.execute(_BEGIN)
            if pin is not None:
                await conn.execute(pin)
            cur = conn.cursor(row_factory=row_factory)
            await cur.execute(query, params)
            await conn.execute(b"COMMIT")
    except BaseException:
        await _roll_back(conn)
        raise
    return await cur.fetchall() if cur.description is not None else []


async def _roll_back(conn: AnyConnection) -> None:
    # An error inside the explicit transaction leaves it aborted until ROLLBACK. A connection
    # that is broken or still running the statement (cancelled mid-call) is left to the pool,
    # which discards it.
    status = conn.info.transaction_status
    if conn.closed or status not in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        return
    with anyio.move_on_after(CHECK_TIMEOUT_S, shield=True):
        try:
            await conn.rollback()
        except psycopg.Error as error:
            log.debug("rollback after a failed call failed", extra={"error": first_line(error)})


class Connector(Protocol):
    """Where a query runs: through the pool (:class:`Pooled`), or on a connection of the
    caller's own (:class:`Dedicated`). Every named query takes one, so each is written once."""

    async def fetch(
        self,
        query: str,
        params: Any,
        row_factory: AsyncRowFactory[R],
        *,
        lock_timeout: float | None = None,
    ) -> list[R]:
        """Run ``query`` once; its rows, made by ``row_factory`` (none for a command).

        ``lock_timeout`` (seconds) replaces the usual bound on waiting for a row lock, for this
        statement only.
        """
        ...


@dataclass(frozen=True, slots=True)
class Pooled:
    """Each query on a connection of ``pool``, run as :func:`call` runs it, within ``timeout``
    seconds (None: the caller bounds the wait). ``share``, when given, caps the connections
    these queries hold at once: one pair's share of a pool that several pairs use, so that
    statements of one that hang (its tables locked) leave the others their connections."""

    pool: AsyncConnectionPool[AnyConnection]
    timeout: float | None = CALL_TIMEOUT_S
    share: anyio.CapacityLimiter | None = None

    async def fetch(
        self,
        query: str,
        params: Any,
        row_factory: AsyncRowFactory[R],
        *,
        lock_timeout: float | None = None,
    ) -> list[R]:
        """Run ``query`` on a pooled connection; see :meth:`Connector.fetch`."""
        # The bound covers waiting for a connection and the whole call made on it.
        with anyio.fail_after(self.timeout):
            async with self._turn(), self.pool.connection() as conn:
                return await call(
                    conn, query, params, lock_timeout=lock_timeout, row_factory=row_factory
                )

    def _turn(self) -> contextlib.AbstractAsyncContextManager[object]:
        # Waiting for the share counts against the same bound as waiting for the pool.
        return self.share if self.share is not None else contextlib.nullcontext()


@dataclass(frozen=True, slots=True)
class Dedicated:
    """Each query on ``conn``, a connection of the caller's own (the LISTEN connection, or a
    command's): one bare statement under its session's settings; the caller bounds the wait."""

    conn: AnyConnection

    async def fetch(
        self,
        query: str,
        params: Any,
        row_factory: AsyncRowFactory[R],
        *,
        lock_timeout: float | None = None,
    ) -> list[R]:
        """Run ``query`` on the connection; see :meth:`Connector.fetch`."""
        if lock_timeout is None:
            return await run_bare(self.conn, query, params, row_factory=row_factory)
        # A bound of its own for one statement: SET LOCAL needs a transaction around it.
        return await run_pinned(
            self.conn,
            query,
            params,
            {**NAME_PATH, **_lock_wait(lock_timeout)},
            row_factory=row_factory,
        )


# A named query runs on a connector, or on a dedicated connection as it is.
Target: TypeAlias = Connector | AnyConnection


def connector(target: Target) -> Connector:
    """``target`` as a connector: a bare connection is a :class:`Dedicated` one."""
    return Dedicated(target) if isinstance(target, psycopg.AsyncConnection) else target
