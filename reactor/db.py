"""Every conversation with PostgreSQL: connections, the pool, migrations and the named queries.

Everything else in the reactor calls this module and never builds SQL of its own. Statements
that write are single autocommit statements: each is its own transaction and commits on the
server the moment it finishes, so a reactor that dies or is cut off mid-call cannot leave an
idle transaction holding job rows locked.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import anyio
import psycopg
import psycopg.conninfo
import psycopg.errors
import tenacity
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from reactor import grants, sql
from reactor.errors import ConfigError, DatabaseUnreachable, PrivilegeMissing, SchemaMissing

log = logging.getLogger(__name__)

AnyConnection = psycopg.AsyncConnection[Any]

Outcome = Literal["recorded", "superseded", "waiting", "busy", "dropped", "kept"]

# libpq settings that make a dead peer visible within seconds instead of the kernel's hours.
_CLIENT_TCP = {
    "connect_timeout": "10",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "20000",
}

# The same on the server side, plus bounds on every statement. The server drops a session whose
# client vanished instead of keeping its locks until the kernel gives up on the socket.
_SESSION_SETTINGS = {
    "statement_timeout": "30s",
    "lock_timeout": "10s",
    "idle_in_transaction_session_timeout": "30s",
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "20000",
    "client_connection_check_interval": "5s",
}

# Every pooled call gives up client-side after this long. TCP settings cannot see a peer that
# keeps the connection open and never answers (a frozen backend, a stuck proxy); this can.
CALL_TIMEOUT = 35.0  # statement_timeout above, plus room to hear about it
# Checking out a pooled connection runs an empty query first; a dead one must fail fast.
_CHECK_TIMEOUT = 5.0

# The migrations of two processes must not interleave; any constant works, this one is ours.
_MIGRATE_LOCK = 0x7265_6163  # "reac"
# The hook outbox's retention job runs on one replica at a time; another constant of ours.
_PURGE_LOCK = 0x7265_6170  # "reap"

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
    """Apply the session settings to a fresh connection, in one round trip when possible."""
    query = "SELECT set_config(n, v, false) FROM unnest(%s::text[], %s::text[]) AS s(n, v)"
    try:
        await conn.execute(query, (list(_SESSION_SETTINGS), list(_SESSION_SETTINGS.values())))
    except psycopg.errors.UndefinedObject:
        # An older server lacks one (client_connection_check_interval arrived in PostgreSQL 14):
        # set them one by one and go without what it does not know.
        for name, value in _SESSION_SETTINGS.items():
            try:
                await conn.execute("SELECT set_config(%s, %s, false)", (name, value))
            except psycopg.errors.UndefinedObject:
                log.debug("server does not know %s; skipped", name)


async def connect(dsn: str, role: str, *, attempts: int = 1) -> AnyConnection:
    """One dedicated autocommit connection, retried with jitter on transient failures.

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
                conn = await psycopg.AsyncConnection.connect(conninfo(dsn, role), autocommit=True)
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
    """The pool for everything but LISTEN; connections are checked before use."""
    return AsyncConnectionPool(
        conninfo(dsn, "pool"),
        min_size=1,
        max_size=max_size,
        kwargs={"autocommit": True},
        configure=configure,
        check=_check_connection,
        open=False,
        name="reactor",
        timeout=15.0,
        reconnect_timeout=86400,  # keep trying: the database coming back is the normal case
    )


@dataclass(frozen=True, slots=True)
class Health:
    """The database's side of the reactor's health."""

    queue_usage: float  # pg_notification_queue_usage(), 0..1
    oldest_overdue: float  # seconds the oldest due job has waited past its grace; 0 if none
    hook_backlog: int  # hook rows pending or running
    hook_failed: int  # hook rows parked as failed


@dataclass(frozen=True, slots=True)
class HookClaim:
    """One leased hook row: run this hook for this run, as attempt number ``attempt``.

    A superseded claim is not a lease: the claim found that the run holds a later job, and
    settled the row as superseded; the hook must not be called.
    """

    id: int
    run_id: str
    job_id: str
    hook: str
    attempt: int  # claims of this row so far, this one included; the lease's fencing token
    retry_base: int = 0  # attempts before the last `reactor hooks retry`
    superseded: bool = False

    @property
    def scheduled_attempt(self) -> int:
        """This attempt's number in the current retry schedule (1 = the first try)."""
        return self.attempt - self.retry_base


@dataclass(frozen=True, slots=True)
class HookRow:
    """One hook outbox row, as `reactor hooks list` shows it."""

    id: int
    hook: str
    status: str
    attempts: int
    run_id: str
    job_id: str
    last_error: str | None
    available_at: datetime
    leased_until: datetime | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class HookChange:
    """What `reactor hooks retry/cancel` found for one id, and whether it changed the row."""

    id: int
    status: str | None  # before the change; None: no row has this id
    changed: bool


async def _check_connection(conn: AnyConnection) -> None:
    with anyio.fail_after(_CHECK_TIMEOUT):
        await AsyncConnectionPool.check_connection(conn)


class Database:
    """The reactor's named queries, run on a pool of autocommit connections.

    ``hooks`` are the names of the configured follow-up hooks: every run written gets one
    outbox row per name, in the same statement.
    """

    def __init__(
        self,
        pool: AsyncConnectionPool[AnyConnection],
        *,
        grace: float,
        hooks: Sequence[str] = (),
    ) -> None:
        self.pool = pool
        self.grace = grace
        self.hooks = list(hooks)

    async def record_jobs(self, job_ids: Sequence[str]) -> list[JobOutcome]:
        """Record the given jobs that are due; report on each of them that still needs a run."""
        return await self._outcomes("record_jobs", {"ids": list(job_ids)})

    async def record_oldest(self, limit: int) -> list[JobOutcome]:
        """Settle up to ``limit`` queued jobs past their grace, oldest first; report on each."""
        return await self._outcomes("record_oldest", {"limit": limit})

    async def upcoming(self, limit: int) -> list[tuple[str, float]]:
        """(job id, seconds until due) for jobs that need a run and are inside their grace."""
        async with self._connection() as conn:
            cur = await conn.execute(sql.query("upcoming"), {"grace": self.grace, "limit": limit})
            return [(job_id, due_in) for job_id, due_in in await cur.fetchall()]

    async def health(self) -> Health:
        """What the watch loop checks every probe interval."""
        async with self._connection() as conn:
            cur = await conn.execute(sql.query("health"), {"grace": self.grace})
            row = await cur.fetchone()
            assert row is not None
            return Health(*row)

    async def notify(self, channel: str, payload: str) -> None:
        """Send one notification from a pool connection."""
        with anyio.fail_after(CALL_TIMEOUT):
            await notify(self.pool, channel, payload)

    async def claim_hooks(self, limit: int, lease: float) -> list[HookClaim]:
        """Lease up to ``limit`` runnable hook rows of our hooks, oldest first."""
        async with self._connection() as conn:
            cur = await conn.execute(
                sql.query("claim_hooks"), {"hooks": self.hooks, "limit": limit, "lease": lease}
            )
            return [HookClaim(*row) for row in await cur.fetchall()]

    async def next_hook_in(self) -> float | None:
        """Seconds until one of our hook rows becomes claimable; None when none is queued."""
        async with self._connection() as conn:
            cur = await conn.execute(sql.query("next_hook_in"), {"hooks": self.hooks})
            row = await cur.fetchone()
            return None if row is None or row[0] is None else float(row[0])

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

    async def purge_hooks(self, retention: float, batch: int) -> int | None:
        """Delete up to ``batch`` settled hook rows older than ``retention`` seconds.

        Returns how many were deleted, or None when another replica's purge holds the turn.
        """
        async with self._connection() as conn:
            cur = await conn.execute(
                sql.query("purge_hooks", "hooks.sql"),
                {"lock": _PURGE_LOCK, "retention": retention, "batch": batch},
            )
            row = await cur.fetchone()
            assert row is not None
            ours, deleted = row
            return int(deleted) if ours else None

    async def _hook_update(self, name: str, claim: HookClaim, params: dict[str, Any]) -> None:
        async with self._connection() as conn:
            await conn.execute(
                sql.query(name), {"id": claim.id, "attempt": claim.attempt, **params}
            )

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[AnyConnection]:
        # The bound covers waiting for a connection and the whole call made on it.
        with anyio.fail_after(CALL_TIMEOUT):
            async with self.pool.connection() as conn:
                yield conn

    async def _outcomes(self, name: str, params: dict[str, Any]) -> list[JobOutcome]:
        async with self._connection() as conn:
            cur = await conn.execute(
                sql.query(name), {"grace": self.grace, "hooks": self.hooks, **params}
            )
            return [JobOutcome(*row) for row in await cur.fetchall()]


async def notify(pool: AsyncConnectionPool[AnyConnection], channel: str, payload: str) -> None:
    """Send one notification from a connection of ``pool``."""
    async with pool.connection() as conn:
        await conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


async def list_hooks(
    conn: AnyConnection, *, failed_only: bool, limit: int
) -> tuple[list[HookRow], int, int]:
    """Unsettled hook rows (or the parked ones only), oldest first, at most ``limit``; and how
    many there are in all, and of them failed."""
    cur = await conn.execute(
        sql.query("list_hooks", "hooks.sql"), {"failed_only": failed_only, "limit": limit}
    )
    rows = await cur.fetchall()
    total, failed = (int(rows[0][-2]), int(rows[0][-1])) if rows else (0, 0)
    return [HookRow(*row[:-2]) for row in rows], total, failed


async def retry_hooks(conn: AnyConnection, ids: Sequence[int]) -> list[HookChange]:
    """Re-queue the given parked hook rows, all or none; one HookChange per id."""
    return await _hook_changes(conn, "retry_hooks", ids)


async def retry_failed(conn: AnyConnection) -> list[int]:
    """Re-queue every failed hook row; returns their ids."""
    cur = await conn.execute(sql.query("retry_failed", "hooks.sql"))
    return sorted(row[0] for row in await cur.fetchall())


async def cancel_hooks(conn: AnyConnection, ids: Sequence[int]) -> list[HookChange]:
    """Cancel the given pending or failed hook rows, all or none; one HookChange per id."""
    return await _hook_changes(conn, "cancel_hooks", ids)


async def _hook_changes(conn: AnyConnection, name: str, ids: Sequence[int]) -> list[HookChange]:
    cur = await conn.execute(sql.query(name, "hooks.sql"), {"ids": sorted(set(ids))})
    return [HookChange(*row) for row in await cur.fetchall()]


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
