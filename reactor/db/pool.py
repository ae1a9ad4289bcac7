"""The pool every statement but LISTEN runs through, and how it checks a connection it hands out.

Checking out a connection runs an empty query first: a dead one must fail fast, and the check is
what keeps a connection that froze in the pool (a half-open link, a stopped backend) from
stalling a claim for the whole call timeout. It is a round trip per checkout, which an idle
replica would pay beside each health check, and a busy one beside each verification of the
notifications it heard. So a statement that is its own check (:func:`own_check`: those two,
which have short bounds of their own and are safe to run twice) skips it on a connection given
back in good order within :data:`FRESH_S` seconds, and is run again, checked, when it fails on
the connection itself.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

import anyio
import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from reactor.db.session import CHECK_TIMEOUT_S, AnyConnection, configure_pooled, conninfo

R = TypeVar("R")

# Seconds a connection beyond the first may stay unused before the pool closes it (psycopg_pool
# closes one such connection per period). A replica's start runs each pair's first duties at once
# and opens several; idle, it needs one: closed after half a minute rather than psycopg_pool's
# ten, the connections a burst opened do not outstay it. Reopening one costs a connect, at most
# once a period.
POOL_MAX_IDLE_S = 30.0

# Seconds after a connection came back in good order within which a statement that is its own
# check trusts it unchecked: an idle replica's health checks, 10 s apart at the defaults, use it
# well inside this, and the client's TCP keepalives (about 25 s) close one whose peer vanished.
FRESH_S = POOL_MAX_IDLE_S


def make_pool(dsn: str, *, max_size: int) -> AsyncConnectionPool[AnyConnection]:
    """The pool for everything but LISTEN; connections are checked before use (see the module
    docstring), and configured by :func:`.session.configure_pooled` when they open."""
    return AsyncConnectionPool(
        conninfo(dsn, "pool"),
        min_size=1,
        max_size=max_size,
        max_idle=POOL_MAX_IDLE_S,
        kwargs={"autocommit": True},
        configure=configure_pooled,
        check=_check_connection,
        reset=_given_back,
        open=False,
        name="reactor",
        timeout=15.0,
        reconnect_timeout=_RECONNECT_WINDOW_S,
        reconnect_failed=_reconnect_again,
    )


@dataclass(slots=True)
class _OwnCheck:
    skipped: bool = False


_OWN_CHECK: ContextVar[_OwnCheck | None] = ContextVar("reactor_own_check", default=None)

# When each pooled connection was last given back idle and open (time.monotonic()).
_GIVEN_BACK: weakref.WeakKeyDictionary[AnyConnection, float] = weakref.WeakKeyDictionary()


async def own_check(statement: Callable[[], Awaitable[R]]) -> R:
    """``statement()``, whose pooled statement is its own check of the connection it gets: the
    pool's check is skipped for a connection given back in good order lately, and
    ``statement()`` runs once more, checked, if it failed on such a connection."""
    with _skipping() as attempt:
        try:
            return await statement()
        except psycopg.OperationalError as error:
            if not (attempt.skipped and _connection_lost(error)):
                raise
    # Lost while it lay idle in the pool (a restart, a pooler's idle timeout): the pool has
    # discarded it; the next one is checked.
    return await statement()


def _connection_lost(error: psycopg.Error) -> bool:
    # No answer from the server (a socket that failed), a connection error (08), or the server
    # ending the session (57P01-57P03): not a statement the server refused or cancelled.
    state = error.sqlstate
    return state is None or state.startswith(("08", "57P"))


@contextlib.contextmanager
def _skipping() -> Iterator[_OwnCheck]:
    attempt = _OwnCheck()
    token = _OWN_CHECK.set(attempt)
    try:
        yield attempt
    finally:
        _OWN_CHECK.reset(token)


async def _check_connection(conn: AnyConnection) -> None:
    # The checkout runs in the caller's task: its own_check() is seen here.
    attempt = _OWN_CHECK.get()
    given_back = _GIVEN_BACK.pop(conn, None)
    if attempt is not None and given_back is not None and time.monotonic() - given_back < FRESH_S:
        attempt.skipped = True
        return
    with anyio.fail_after(CHECK_TIMEOUT_S):
        await AsyncConnectionPool.check_connection(conn)


async def _given_back(conn: AnyConnection) -> None:
    # Called as the pool takes a connection back, after it rolled back or closed a bad one.
    if not conn.closed and conn.pgconn.transaction_status == TransactionStatus.IDLE:
        _GIVEN_BACK[conn] = time.monotonic()


# psycopg_pool retries a lost connection with backoff (1, 2, 4, 8 s...) for as long as
# reconnect_timeout, so after an outage a waiting call could sit out a pause of many seconds
# while the database has long been back. A short window ends each series of retries early and
# starts the next at once; psycopg_pool shortens a retry's delay to the window's end, so retries
# are a window apart while calls wait, and stop while none does (the next checkout starts them
# again). The database coming back is the normal case, and an attempt at a server that is not
# there yet is refused at once: half a second apart, a backlog waits at most that long for it.
_RECONNECT_WINDOW_S = 0.5


async def _reconnect_again(pool: AsyncConnectionPool[AnyConnection]) -> None:
    if pool.get_stats().get("requests_waiting", 0):
        await pool.check()  # grows the pool again when it has no connection left
