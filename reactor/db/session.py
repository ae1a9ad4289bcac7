"""How the reactor talks to PostgreSQL: connections and the pool (each call runs by :mod:`.calls`).

What the reactor's statements mean must not depend on the session defaults a role or database
hands out (``serializable``, a read-only default, a short statement_timeout), nor leak into other
clients' sessions through a transaction-mode pooler. So each pooled connection is looked at
once, when it opens:

- A session of its own (the server's pid is the one the connection was given: no pooler in
  between) gets the reactor's settings for the session, READ COMMITTED included, and keeps
  psycopg's prepared statements. Each call is then one bare autocommit statement, as cheap as
  it gets.
- Behind a pooler it gets no session settings and no prepared statements (the next statement
  may run on another server session, one the app uses next). Each call is pinned instead:
  ``BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE``, the settings set LOCAL, the statement,
  ``COMMIT``, sent in one pipeline: one round trip, and nothing outlives the transaction.

Either way the server has the whole of a call in hand at once, so a reactor that dies or is cut
off mid-call cannot leave an idle transaction holding job rows locked.

A hot standby is refused where the reactor would write (:func:`connect`), and a pooled connection
that finds itself on one is closed (:func:`call`), so the pool's next one lands on the primary.
"""

from __future__ import annotations

import contextlib
import logging
import re
import weakref
from datetime import datetime
from typing import Any, Literal, TypeVar

import anyio
import psycopg
import psycopg.conninfo
import psycopg.errors
import psycopg.sql
import tenacity
from psycopg_pool import PoolTimeout

from reactor.errors import ConfigError, DatabaseReadOnly, DatabaseUnreachable

# The package's one logger, named as the JSON log lines have always named it.
log = logging.getLogger("reactor.db")

R = TypeVar("R")

AnyConnection = psycopg.AsyncConnection[Any]

# Errors that mean "the database is unwell right now": the work is retried, never dropped. A
# pool that cannot hand out a connection in time, a socket that fails and a call that gave up
# on its bound are the same news as an error the server sent.
DATABASE_ERRORS = (psycopg.Error, PoolTimeout, OSError, TimeoutError)

# libpq settings that make a dead peer visible within seconds instead of the kernel's hours.
_CLIENT_TCP = {
    "connect_timeout": "10",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "20000",
}

# Bounds on every statement. A session of our own gets them for the session; behind a pooler
# they are set LOCAL to each transaction (see the module docstring).
STATEMENT_BOUNDS = {
    "statement_timeout": "30s",
    "lock_timeout": "10s",
    "idle_in_transaction_session_timeout": "30s",
}

# Where a name left unqualified is looked for: public alone, never "$user", a schema any role
# with CREATE on the database can make under the name of the role the reactor runs as, with
# look-alikes in it (pg_catalog is searched first either way). The reactor's own statements
# qualify every name; this is for the app's triggers, which fire inside the reactor's writes
# and find their functions in public, as in the app's sessions. Set for a session of our own,
# and LOCAL to each pinned call behind a pooler.
NAME_PATH = {"search_path": "public"}

# The client-side TCP settings on the server side: the server drops a session whose client
# vanished instead of keeping its locks until the kernel gives up on the socket. Only for a
# session of our own: behind a pooler the server's client is the pooler, not the reactor.
_LIVENESS = {
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "20000",
    "client_connection_check_interval": "5s",
}

# Only for a session of our own: a pinned call says all this in its BEGIN.
_SESSION_DEFAULTS = {
    "default_transaction_isolation": "read committed",
    "default_transaction_read_only": "off",
}

# The start of every pinned transaction. Explicit, because the session's defaults may say
# otherwise: the claim's SKIP LOCKED and reactor.outranks_v2's fresh snapshot per query need READ
# COMMITTED; under REPEATABLE READ or SERIALIZABLE a race between writers turns into a
# serialization failure of the whole batch.

# How long the pool's check of a connection (an empty query) may take: a dead one must fail fast
# (see .pool), and so must the last-chance rollback of a call cut short (.calls).
CHECK_TIMEOUT_S = 5.0

# psycopg's own default: a statement is prepared on its fifth run. Only for a session of our
# own: behind a transaction pooler the next statement may run on a session that never saw it.
PREPARE_THRESHOLD = 5

# Connection failures that retrying cannot fix: the user must change the DSN or the server.
_PERMANENT = re.compile(
    r"password authentication failed|authentication failed|role .* does not exist"
    r"|database .* does not exist|no password supplied|pg_hba\.conf|invalid .* value",
    re.IGNORECASE,
)


# The role a listener connects as, so its session is named LISTENER_APPLICATION_NAME: status
# and a replica ending a stale listener find it by that name.
LISTENER_ROLE = "listener"
LISTENER_APPLICATION_NAME = f"reactor-{LISTENER_ROLE}"


def conninfo(dsn: str, role: str) -> str:
    """``dsn`` with our application_name and TCP liveness settings added."""
    return psycopg.conninfo.make_conninfo(dsn, application_name=f"reactor-{role}", **_CLIENT_TCP)


def first_line(error: BaseException) -> str:
    """The first line of a driver error: no traceback, no DSN (libpq never prints passwords)."""
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


async def configure(conn: AnyConnection) -> None:
    """Apply the session settings to a connection that is a session of its own, not one a
    transaction-mode pooler shares with other clients (the settings would leak into theirs)."""
    settings = {**STATEMENT_BOUNDS, **NAME_PATH, **_LIVENESS, **_SESSION_DEFAULTS}
    query = "SELECT set_config(n, v, false) FROM unnest(%s::text[], %s::text[]) AS s(n, v)"
    try:
        await conn.execute(query, (list(settings), list(settings.values())))
    except psycopg.errors.UndefinedObject:
        # An older server lacks one (client_connection_check_interval arrived in PostgreSQL 14):
        # set them one by one and go without what it does not know.
        for name, value in settings.items():
            try:
                await conn.execute("SELECT set_config(%s, %s, false)", (name, value))
            except psycopg.errors.UndefinedObject:
                log.debug("server does not know %s; skipped", name)


async def pin_name_path(conn: AnyConnection) -> None:
    """Set :data:`NAME_PATH` for ``conn``'s session when it is a session of its own (the pid
    the server runs it on is the one the connection was given), in one round trip. Behind a
    transaction pooler it is left as the server has it: a session setting would outlive the
    transaction on a server session the app uses next, and a startup ``options`` parameter is
    refused by PgBouncer. Such a connection's statements qualify every name they use."""
    await conn.execute(
        "SELECT CASE WHEN pg_catalog.pg_backend_pid() = %s"
        "            THEN pg_catalog.set_config('search_path', %s, false) END",
        (conn.info.backend_pid, NAME_PATH["search_path"]),
    )


# What :func:`connect` does with a server that is a read-only hot standby: ``accept`` it (the
# caller only reads, or looks for the standby itself), ``refuse`` it at once, or ``retry`` it
# like a failed connection within the attempts (a standby being promoted is writable seconds
# later). Refused, or still a standby after the last attempt: DatabaseReadOnly.
StandbyPolicy = Literal["accept", "refuse", "retry"]

# libpq's own words (fe-connect.c, not the server's) for a host that target_session_attrs
# turned down for being read-only: read-write's, then primary's.
_READ_ONLY_HOST = re.compile(
    r'server (?:at|on socket) "([^"]*)"(?:, port (\d+))? failed: '
    r"(?:session is read-only|server is in hot standby mode)"
)

# The fix a read-only database calls for, whichever form the DSN takes.
_MULTI_HOST_EXAMPLE = "postgresql://db1:5432,db2:5432/app?target_session_attrs=read-write"


async def connect(
    dsn: str,
    role: str,
    *,
    attempts: int = 1,
    configure_session: bool = True,
    standby: StandbyPolicy = "accept",
    source: str = "DATABASE_URL",
) -> AnyConnection:
    """One dedicated autocommit connection, retried with jitter on transient failures.

    With ``configure_session`` False the session keeps the server's settings: for connections
    that may go through a transaction-mode pooler, where a session setting would land on a
    server session other clients use next. Prepared statements are never used: a transaction
    pooler hands each statement to whichever server session is free, which never saw them.
    ``standby`` says what to do with a read-only hot standby (see :data:`StandbyPolicy`);
    ``source`` names the setting ``dsn`` came from, for the messages.

    Raises ConfigError when retrying cannot help (bad password, unknown database),
    DatabaseReadOnly for a standby the policy does not accept (also when every host of a
    ``target_session_attrs=read-write`` DSN is one), and DatabaseUnreachable when every attempt
    failed.
    """
    retrying = tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(attempts),
        wait=tenacity.wait_random_exponential(multiplier=0.5, max=5),
        retry=tenacity.retry_if_exception(lambda error: _retryable(error, standby)),
        before_sleep=_log_standby_retry,
        reraise=True,
    )
    try:
        async for attempt in retrying:
            with attempt:
                conn = await psycopg.AsyncConnection.connect(
                    conninfo(dsn, role), autocommit=True, prepare_threshold=None
                )
                try:
                    if standby != "accept":
                        await _refuse_standby(conn, source)
                    if configure_session:
                        await configure(conn)
                    else:
                        await pin_name_path(conn)
                except BaseException:
                    await conn.close()
                    raise
                return conn
    except psycopg.OperationalError as error:
        read_only = _read_only_hosts(error)
        if read_only:
            raise DatabaseReadOnly(_no_writable_host(error, read_only, source)) from None
        if _is_transient(error):
            raise DatabaseUnreachable(
                f"cannot reach the database: {first_line(error)}; check {source} and that "
                "the server is up"
            ) from None
        raise ConfigError(f"the database refused the connection: {first_line(error)}") from None
    raise AssertionError("unreachable: tenacity either returns or raises")


async def _refuse_standby(conn: AnyConnection, source: str) -> None:
    problem = await standby_problem(conn, source)
    if problem is not None:
        raise DatabaseReadOnly(problem)


async def standby_problem(conn: AnyConnection, source: str = "DATABASE_URL") -> str | None:
    """None when ``conn``'s server accepts writes; else why not, in one line naming the fix.

    Asks ``pg_is_in_recovery()`` rather than trusting the ``in_hot_standby`` the server
    reports at login: a pooler may pass on another server's, or none. The upstream a standby
    streams from is shown when this role may see it (pg_read_all_stats): most often the
    primary.
    """
    cur = await conn.execute("SELECT pg_is_in_recovery()")
    row = await cur.fetchone()
    if not row or not row[0]:
        return None
    upstream = ""
    try:
        cur = await conn.execute(
            "SELECT sender_host, sender_port FROM pg_stat_wal_receiver WHERE sender_host <> ''"
        )
        sender = await cur.fetchone()
    except psycopg.Error:  # a server or role that cannot say: the fix reads the same
        sender = None
    if sender is not None:
        upstream = f" (this standby streams from {server_address(sender[0], sender[1])})"
    return (
        f"the database at {server_address(conn.info.host, conn.info.port)} is a read-only hot "
        f"standby (pg_is_in_recovery()), and the reactor writes: point {source} at the "
        f"primary{upstream}, or list every host with target_session_attrs=read-write "
        f"({_MULTI_HOST_EXAMPLE})"
    )


def _no_writable_host(error: BaseException, read_only: list[str], source: str) -> str:
    verb = "is" if len(read_only) == 1 else "are"
    # psycopg lists each attempt of a multi-host DSN on a line of its own.
    others = str(error).count("\n- host: ") > len(read_only)
    return (
        f"no host of {source} accepts writes: {', '.join(read_only)} {verb} read-only (a hot "
        f"standby) and target_session_attrs passed over it"
        + (", the others did not answer" if others else "")
        + f"; add the primary's address to the host list ({_MULTI_HOST_EXAMPLE}), or promote a "
        "standby"
    )


def _read_only_hosts(error: BaseException) -> list[str]:
    """The hosts a connection error says target_session_attrs refused as read-only, in the
    order tried (psycopg lists every attempt of a multi-host DSN)."""
    found: list[str] = []
    for host, port in _READ_ONLY_HOST.findall(str(error)):
        shown = server_address(host, port or None)
        if shown not in found:
            found.append(shown)
    return found


def server_address(host: str | None, port: int | str | None) -> str:
    # host:port as people write it: [v6]:port, and a Unix socket's directory as is.
    host = host or "localhost"
    if host.startswith("/"):
        return host if port is None else f"{host} (port {port})"
    if ":" in host:
        host = f"[{host}]"
    return host if port is None else f"{host}:{port}"


def _retryable(error: BaseException, standby: StandbyPolicy) -> bool:
    if isinstance(error, DatabaseReadOnly) or _read_only_hosts(error):
        return standby == "retry"
    return _is_transient(error)


def _log_standby_retry(state: tenacity.RetryCallState) -> None:
    # Debug only: like a failed connection, a standby that stays one ends in a single line.
    error = state.outcome.exception() if state.outcome is not None else None
    if isinstance(error, DatabaseReadOnly) or (error is not None and _read_only_hosts(error)):
        log.debug(
            "the database is a read-only hot standby; trying again in case it is being promoted",
            extra={"attempt": state.attempt_number, "error": first_line(error)},
        )


def _is_transient(error: BaseException) -> bool:
    return isinstance(error, psycopg.OperationalError) and not _PERMANENT.search(str(error))


# Pool connections found to be sessions of their own: see the module docstring.
_OWN_SESSIONS: weakref.WeakSet[AnyConnection] = weakref.WeakSet()


async def configure_pooled(conn: AnyConnection) -> None:
    """Tell a session of its own from one behind a pooler, and set it up accordingly.

    A pooler hands its client a cancel key of its own making, so the pid in it is not the pid of
    the server session that runs the statements. Session pooling is taken for a pooler too: safe,
    a little slower.
    """
    cur = await conn.execute("SELECT pg_backend_pid()", prepare=False)
    row = await cur.fetchone()
    if row is not None and row[0] == conn.info.backend_pid:
        await configure(conn)
        _OWN_SESSIONS.add(conn)
    else:
        # Named prepared statements break on PgBouncer before 1.21, and on any version with
        # max_prepared_statements = 0: they were made on another server session.
        conn.prepare_threshold = None


def is_own_session(conn: AnyConnection) -> bool:
    """True for a pool connection :func:`configure_pooled` found to be a session of its own."""
    return conn in _OWN_SESSIONS


async def until_readable(conn: AnyConnection, seconds: float) -> None:
    """Returns when something arrives on ``conn``'s socket, or after ``seconds``, with no
    wake-up between: psycopg's ``notifies(timeout=)`` looks every 100 ms, which a session that
    waits minutes for a notification pays ten times a second."""
    with anyio.move_on_after(seconds):
        await anyio.wait_readable(conn.fileno())


async def arrived(conn: AnyConnection) -> list[psycopg.Notify]:
    """The notifications that have reached ``conn``'s socket, read without waiting.

    psycopg's ``notifies()`` waits for the socket before it reads it, readable or not: a turn
    of the event loop (a reader added and removed, a timer) on every read, which a session woken
    by :func:`until_readable` has already paid for. What psycopg kept aside while a statement
    ran is not read here: :func:`kept_aside` hands that on."""
    async with conn.lock:
        pgconn = conn.pgconn
        pgconn.consume_input()
        encoding = conn.info.encoding
        found = []
        while (note := pgconn.notifies()) is not None:
            found.append(
                psycopg.Notify(
                    note.relname.decode(encoding), note.extra.decode(encoding), note.be_pid
                )
            )
        return found


async def kept_aside(conn: AnyConnection) -> list[psycopg.Notify]:
    """What psycopg kept aside of ``conn``'s notifications while a statement ran on it (the
    socket cannot say so), then one read of the socket."""
    # Never left in the middle of a batch: psycopg drops what it has not yielded yet.
    # Closed explicitly: the generator holds the connection's lock.
    arriving = conn.notifies(timeout=0.0, stop_after=1)
    async with contextlib.aclosing(arriving):
        return [note async for note in arriving]


async def session_identity(conn: AnyConnection) -> tuple[int, datetime]:
    """(pid, backend_start) of the server session serving ``conn`` right now.

    Through a pooler this is whichever server session the pooler picked, not one of our own.
    """
    cur = await conn.execute(
        "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), row[1]


async def end_listener_session(conn: AnyConnection, pid: int, started: datetime) -> bool:
    """End the reactor listener session ``pid`` if it is still the one that started at
    ``started`` (a pid alone may by now belong to another session); True if it was ended."""
    cur = await conn.execute(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE pid = %s AND backend_start = %s AND application_name = %s",
        (pid, started, LISTENER_APPLICATION_NAME),
    )
    row = await cur.fetchone()
    return bool(row and row[0])
