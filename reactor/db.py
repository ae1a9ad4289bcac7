"""Every conversation with PostgreSQL: connections, the pool, migrations and the named queries.

Everything else in the reactor calls this module and never builds SQL of its own.

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
"""

from __future__ import annotations

import logging
import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import anyio
import psycopg
import psycopg.conninfo
import psycopg.errors
import psycopg.sql
import tenacity
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from reactor import grants, sql
from reactor.errors import ConfigError, DatabaseUnreachable, PrivilegeMissing, SchemaMissing

log = logging.getLogger(__name__)

AnyConnection = psycopg.AsyncConnection[Any]

Outcome = Literal["recorded", "superseded", "waiting", "busy", "dropped", "kept", "deferred"]

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
_BOUNDS = {
    "statement_timeout": "30s",
    "lock_timeout": "10s",
    "idle_in_transaction_session_timeout": "30s",
}

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
# otherwise: the claim's SKIP LOCKED and reactor.outranks_v1's fresh snapshot per query need READ
# COMMITTED; under REPEATABLE READ or SERIALIZABLE a race between writers turns into a
# serialization failure of the whole batch.
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


_PIN_BOUNDS = _pin(_BOUNDS)

# Documents one scan statement writes at most: 500 reports of several MB each would otherwise
# pass the statement timeout together and fail the whole batch.
BATCH_BYTES = 64 * 1024 * 1024

# Every pooled call gives up client-side after this long. TCP settings cannot see a peer that
# keeps the connection open and never answers (a frozen backend, a stuck proxy); this can.
CALL_TIMEOUT = 35.0  # statement_timeout above, plus room to hear about it
# Checking out a pooled connection runs an empty query first; a dead one must fail fast.
_CHECK_TIMEOUT = 5.0

# The migrations of two processes must not interleave; any constant works, this one is ours.
_MIGRATE_LOCK = 0x7265_6163  # "reac"

# Connection failures that retrying cannot fix: the user must change the DSN or the server.
_PERMANENT = re.compile(
    r"password authentication failed|authentication failed|role .* does not exist"
    r"|database .* does not exist|no password supplied|pg_hba\.conf|invalid .* value",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What one record statement did with one job."""

    job_id: str
    run_id: str | None  # None for a queued job the scan found gone
    outcome: Outcome
    # Seconds until updated_at + grace by the database clock (negative: how late); None when
    # the scan did not claim the job.
    due_in: float | None


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
    settings = {**_BOUNDS, **_LIVENESS, **_SESSION_DEFAULTS}
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


async def connect(
    dsn: str, role: str, *, attempts: int = 1, configure_session: bool = True
) -> AnyConnection:
    """One dedicated autocommit connection, retried with jitter on transient failures.

    With ``configure_session`` False the session keeps the server's settings: for connections
    that may go through a transaction-mode pooler, where a session setting would land on a
    server session other clients use next. Prepared statements are never used: a transaction
    pooler hands each statement to whichever server session is free, which never saw them.

    Raises ConfigError when retrying cannot help (bad password, unknown database) and
    DatabaseUnreachable when every attempt failed.
    """
    retrying = tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(attempts),
        wait=tenacity.wait_random_exponential(multiplier=0.5, max=5),
        retry=tenacity.retry_if_exception(_is_transient),
        reraise=True,
    )
    try:
        async for attempt in retrying:
            with attempt:
                conn = await psycopg.AsyncConnection.connect(
                    conninfo(dsn, role), autocommit=True, prepare_threshold=None
                )
                if configure_session:
                    try:
                        await configure(conn)
                    except BaseException:
                        await conn.close()
                        raise
                return conn
    except psycopg.OperationalError as error:
        if _is_transient(error):
            raise DatabaseUnreachable(
                f"cannot reach the database: {first_line(error)}; check DATABASE_URL and that "
                "the server is up"
            ) from None
        raise ConfigError(f"the database refused the connection: {first_line(error)}") from None
    raise AssertionError("unreachable: tenacity either returns or raises")


def _is_transient(error: BaseException) -> bool:
    return isinstance(error, psycopg.OperationalError) and not _PERMANENT.search(str(error))


def make_pool(dsn: str, *, max_size: int) -> AsyncConnectionPool[AnyConnection]:
    """The pool for everything but LISTEN; connections are checked before use, and configured
    by :func:`configure_pooled` when they open."""
    return AsyncConnectionPool(
        conninfo(dsn, "pool"),
        min_size=1,
        max_size=max_size,
        kwargs={"autocommit": True},
        configure=configure_pooled,
        check=_check_connection,
        open=False,
        name="reactor",
        timeout=15.0,
        reconnect_timeout=86400,  # keep trying: the database coming back is the normal case
    )


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


@dataclass(frozen=True, slots=True)
class Health:
    """The database's side of the reactor's health."""

    queue_usage: float  # pg_notification_queue_usage(), 0..1
    oldest_overdue: float  # seconds the oldest due job has waited past its grace; 0 if none
    hook_backlog: int  # hook rows pending or running
    hook_failed: int  # hook rows parked as failed


@dataclass(frozen=True, slots=True)
class HookClaim:
    """One leased hook row: run this hook for this run, as attempt number ``attempt``."""

    run_id: str
    job_id: str
    hook: str
    attempt: int


async def _check_connection(conn: AnyConnection) -> None:
    with anyio.fail_after(_CHECK_TIMEOUT):
        await AsyncConnectionPool.check_connection(conn)


class Database:
    """The reactor's named queries, each run as one pinned transaction on a pooled connection.

    ``hooks`` are the names of the configured follow-up hooks: every run written gets one
    outbox row per name, in the same statement. ``batch_bytes`` caps the documents one scan
    statement writes (the first job is always taken, however large).
    """

    def __init__(
        self,
        pool: AsyncConnectionPool[AnyConnection],
        *,
        grace: float,
        hooks: Sequence[str] = (),
        batch_bytes: int = BATCH_BYTES,
    ) -> None:
        self.pool = pool
        self.grace = grace
        self.hooks = list(hooks)
        self.batch_bytes = batch_bytes

    async def record_jobs(
        self, job_ids: Sequence[str], *, lock_timeout: float | None = None
    ) -> list[JobOutcome]:
        """Record the given jobs that are due; report on each of them that still needs a run.

        ``lock_timeout`` (seconds) replaces the usual bound on waiting for another
        transaction's row lock; past it the statement fails with LockNotAvailable.
        """
        rows = await self._fetch(
            "record_jobs",
            {"grace": self.grace, "hooks": self.hooks, "ids": list(job_ids)},
            lock_timeout=lock_timeout,
        )
        return [JobOutcome(*row) for row in rows]

    async def record_oldest(
        self,
        limit: int,
        *,
        only: Sequence[str] | None = None,
        skip: Sequence[str] = (),
        lock_timeout: float | None = None,
    ) -> list[JobOutcome]:
        """Settle up to ``limit`` queued jobs past their grace, oldest first; report on each.

        ``only`` restricts the statement to those queued jobs, ``skip`` leaves those out; at
        most :attr:`batch_bytes` of documents are written, the rest come back ``deferred``.
        """
        rows = await self._fetch(
            "record_oldest",
            {
                "grace": self.grace,
                "hooks": self.hooks,
                "limit": limit,
                "only": None if only is None else list(only),
                "skip": list(skip),
                "max_bytes": self.batch_bytes,
            },
            lock_timeout=lock_timeout,
        )
        return [JobOutcome(*row) for row in rows]

    async def oldest_queued(self, limit: int, *, skip: Sequence[str] = ()) -> list[str]:
        """The ids :meth:`record_oldest` would take next, oldest first, without locking them."""
        rows = await self._fetch(
            "oldest_queued", {"grace": self.grace, "limit": limit, "skip": list(skip)}
        )
        return [job_id for (job_id,) in rows]

    async def upcoming(self, limit: int) -> list[tuple[str, float]]:
        """(job id, seconds until due) for jobs that need a run and are inside their grace."""
        rows = await self._fetch("upcoming", {"grace": self.grace, "limit": limit})
        return [(job_id, due_in) for job_id, due_in in rows]

    async def health(self) -> Health:
        """What the watch loop checks every probe interval."""
        rows = await self._fetch("health", {"grace": self.grace})
        return Health(*rows[0])

    async def notify(self, channel: str, payload: str) -> None:
        """Send one notification from a pool connection."""
        with anyio.fail_after(CALL_TIMEOUT):
            await notify(self.pool, channel, payload)

    async def claim_hooks(self, limit: int, lease: float) -> list[HookClaim]:
        """Lease up to ``limit`` runnable hook rows of our hooks, oldest first."""
        rows = await self._fetch(
            "claim_hooks", {"hooks": self.hooks, "limit": limit, "lease": lease}
        )
        return [HookClaim(*row) for row in rows]

    async def next_hook_in(self) -> float | None:
        """Seconds until one of our hook rows becomes claimable; None when none is queued."""
        rows = await self._fetch("next_hook_in", {"hooks": self.hooks})
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    async def finish_hook(
        self, claim: HookClaim, status: str, *, error: str | None = None, delay: float = 0.0
    ) -> None:
        """Settle an attempt: ``done``, ``pending`` (retry after ``delay``) or ``failed``."""
        await self._hook_update(
            "finish_hook", claim, {"status": status, "error": error, "delay": delay}
        )

    async def release_hook(self, claim: HookClaim) -> None:
        """Give an interrupted attempt back for another replica to take at once."""
        await self._hook_update("release_hook", claim, {})

    async def _hook_update(self, name: str, claim: HookClaim, params: dict[str, Any]) -> None:
        await self._fetch(
            name,
            {
                "run_id": claim.run_id,
                "job_id": claim.job_id,
                "hook": claim.hook,
                "attempt": claim.attempt,
                **params,
            },
        )

    async def _fetch(
        self, name: str, params: dict[str, Any], *, lock_timeout: float | None = None
    ) -> list[tuple[Any, ...]]:
        # The bound covers waiting for a connection and the whole call made on it.
        with anyio.fail_after(CALL_TIMEOUT):
            async with self.pool.connection() as conn:
                return await call(conn, sql.query(name), params, lock_timeout=lock_timeout)


async def call(
    conn: AnyConnection, query: str, params: Any = None, *, lock_timeout: float | None = None
) -> list[tuple[Any, ...]]:
    """Run one statement on a pool connection, as the module docstring says; its rows.

    ``lock_timeout`` (seconds) replaces the usual bound on waiting for a row lock, for this
    statement only.
    """
    own = is_own_session(conn)
    if own and lock_timeout is None:
        cur = await conn.execute(query, params)
        return await cur.fetchall() if cur.description is not None else []
    if lock_timeout is None:
        return await run_pinned(conn, query, params)
    waiting = {"lock_timeout": f"{max(1, round(lock_timeout * 1000))}ms"}
    return await run_pinned(conn, query, params, waiting if own else {**_BOUNDS, **waiting})


async def run_pinned(
    conn: AnyConnection,
    query: str,
    params: Any = None,
    settings: Mapping[str, str] | None = None,
) -> list[tuple[Any, ...]]:
    """Run ``query`` in a READ COMMITTED transaction of its own with ``settings`` set LOCAL
    (default: the reactor's statement bounds), in one round trip; return its rows (none for a
    command).

    The transaction is rolled back if anything fails, so the connection goes back idle.
    """
    pin = _PIN_BOUNDS if settings is None else _pin(settings) if settings else None
    try:
        async with conn.pipeline():
            await conn.execute(_BEGIN)
            if pin is not None:
                await conn.execute(pin)
            cur = await conn.execute(query, params)
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
    with anyio.move_on_after(_CHECK_TIMEOUT, shield=True):
        try:
            await conn.rollback()
        except psycopg.Error as error:
            log.debug("rollback after a failed call failed", extra={"error": first_line(error)})


async def notify(pool: AsyncConnectionPool[AnyConnection], channel: str, payload: str) -> None:
    """Send one notification from a connection of ``pool``."""
    async with pool.connection() as conn:
        await call(conn, "SELECT pg_notify(%s, %s)", (channel, payload))


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
        (pid, started, "reactor-listener"),
    )
    row = await cur.fetchone()
    return bool(row and row[0])


async def schema_version(conn: AnyConnection) -> int | None:
    """The newest applied migration, or None when the reactor's schema is absent."""
    cur = await conn.execute("SELECT to_regclass('reactor.schema_version') IS NOT NULL")
    row = await cur.fetchone()
    if not row or not row[0]:
        return None
    cur = await conn.execute("SELECT max(version) FROM reactor.schema_version")
    row = await cur.fetchone()
    return row[0] if row else None


async def require_schema(conn: AnyConnection) -> None:
    """Raise SchemaMissing unless every migration of this release is applied."""
    found = await schema_version(conn)
    needed = sql.latest_version()
    if found is None or found < needed:
        have = "no reactor schema" if found is None else f"schema version {found}"
        raise SchemaMissing(
            f"the database has {have}, this reactor needs version {needed}; "
            "run `reactor migrate` (or apply `reactor migrate --print`)"
        )


async def require_privileges(conn: AnyConnection) -> None:
    """Raise PrivilegeMissing naming every grant of :data:`grants.REQUIRED` the role lacks."""
    cur = await conn.execute(sql.query("missing_privileges", "status.sql"), grants.check_params())
    rows = await cur.fetchall()
    if rows:
        role = rows[0][1]
        missing = "; ".join(f"{grant} TO {role}" for grant, _ in rows)
        raise PrivilegeMissing(
            f"the role lacks a privilege: {missing}; "
            f"`reactor migrate --print-grants {role}` prints every grant it needs"
        )


def migration_script(channel: str, *, reference_schema: bool, applied: int = 0) -> str:
    """The SQL `reactor migrate` runs from version ``applied``, as one transaction."""
    parts = ["BEGIN;", f"SELECT pg_advisory_xact_lock({_MIGRATE_LOCK});"]
    if reference_schema:
        parts.append(sql.read("reference.sql"))
    for migration in sql.migrations():
        if migration.version > applied:
            parts.append(f"-- {migration.version:04d}_{migration.name}")
            parts.append(sql.with_channel(migration.text, channel))
            parts.append(
                "INSERT INTO reactor.schema_version (version, name) "
                f"VALUES ({migration.version}, '{migration.name}') ON CONFLICT DO NOTHING;"
            )
    parts.append(sql.with_channel(sql.read("notify_triggers.sql"), channel))
    parts.append("COMMIT;")
    return "\n".join(parts) + "\n"


async def migrate(conn: AnyConnection, channel: str, *, reference_schema: bool) -> list[int]:
    """Apply what is missing; return the versions applied. Safe to run concurrently.

    The advisory lock serialises concurrent runs: the second waits, then finds nothing to do.
    The trigger is always re-pointed at ``channel``, so changing REACTOR_CHANNEL takes effect.
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATE_LOCK,))
        if reference_schema:
            await conn.execute(sql.read("reference.sql"))
        await _require_app_tables(conn)
        applied = await schema_version(conn) or 0
        done = []
        for migration in sql.migrations():
            if migration.version > applied:
                await conn.execute(sql.with_channel(migration.text, channel))
                await conn.execute(
                    "INSERT INTO reactor.schema_version (version, name) VALUES (%s, %s)",
                    (migration.version, migration.name),
                )
                done.append(migration.version)
        await conn.execute(sql.with_channel(sql.read("notify_triggers.sql"), channel))
    return done


async def _require_app_tables(conn: AnyConnection) -> None:
    cur = await conn.execute(
        "SELECT name FROM unnest(ARRAY['analysis_jobs', 'analysis_runs']) AS name "
        "WHERE to_regclass(name) IS NULL"
    )
    missing = [name for (name,) in await cur.fetchall()]
    if missing:
        raise SchemaMissing(
            f"table {', '.join(missing)} not found; create the app's tables first, "
            "or run `reactor migrate --reference-schema` for the reference ones"
        )


async def fetch_dicts(conn: AnyConnection, query: str, params: Any = None) -> list[dict[str, Any]]:
    """Rows as dicts, for status and reporting."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, params)
        return await cur.fetchall()
