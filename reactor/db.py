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
import uuid
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
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
from reactor.errors import (
    ConfigError,
    DatabaseReadOnly,
    DatabaseUnreachable,
    PrivilegeMissing,
    SchemaMissing,
)

log = logging.getLogger(__name__)

AnyConnection = psycopg.AsyncConnection[Any]

Outcome = Literal[
    "recorded", "superseded", "waiting", "busy", "dropped", "kept", "deferred", "set_aside"
]

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
# Checking out a pooled connection runs an empty query first; a dead one must fail fast. The
# check is what keeps a connection that froze in the pool (a half-open link, a stopped backend)
# from stalling a claim for the whole call timeout. It costs nothing when the reactor is idle:
# its one periodic statement runs on the LISTEN connection, not through the pool.
_CHECK_TIMEOUT = 5.0

# psycopg's own default: a statement is prepared on its fifth run. Only for a session of our
# own: behind a transaction pooler the next statement may run on a session that never saw it.
PREPARE_THRESHOLD = 5

# The migrations of two processes must not interleave; any constant works, this one is ours.
_MIGRATE_LOCK = 0x7265_6163  # "reac"
# A migration waits this long for a lock the app holds, then gives way and tries again: while a
# DDL statement waits, every app query on that table queues behind it.
_MIGRATE_LOCK_TIMEOUT = "1s"
_MIGRATE_ATTEMPTS = 30
_CONCURRENT_INDEX = re.compile(
    r"CREATE\s+INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+(\w+)", re.IGNORECASE
)

# Jobs one reconcile step walks: small enough that a step stays well inside a few tens of
# milliseconds, large enough that a pass over millions of finished jobs takes seconds.
RECONCILE_CHUNK = 1000
# How long the replica that stepped a pass keeps it; another takes over once this runs out.
RECONCILE_LEASE = 30.0
# An interval that never comes due, for a one-off pass.
_NEVER = 365 * 86400.0
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
        upstream = f" (this standby streams from {_address(sender[0], sender[1])})"
    return (
        f"the database at {_address(conn.info.host, conn.info.port)} is a read-only hot "
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
        shown = _address(host, port or None)
        if shown not in found:
            found.append(shown)
    return found


def _address(host: str | None, port: int | str | None) -> str:
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
        reconnect_timeout=_RECONNECT_WINDOW,
        reconnect_failed=_reconnect_again,
    )


# psycopg_pool retries a lost connection with backoff (1, 2, 4, 8 s...) for as long as
# reconnect_timeout, so after an outage a waiting call could sit out a pause of many seconds
# while the database has long been back. A short window ends each series of retries early and
# starts the next at once: retries stay about a second apart while calls wait, and stop while
# none does (the next checkout starts them again). The database coming back is the normal case.
_RECONNECT_WINDOW = 2.0


async def _reconnect_again(pool: AsyncConnectionPool[AnyConnection]) -> None:
    if pool.get_stats().get("requests_waiting", 0):
        await pool.check()  # grows the pool again when it has no connection left


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
    hooks_expired: bool  # settled hook rows outlived their retention: the purge has work
    reconcile_last_pass: float  # unix time the last full reconcile pass ended; 0 before any
    reconcile_requested: bool  # a pass was asked for (TRUNCATE analysis_runs)
    live_replicas: list[str]  # replicas whose heartbeat is fresh, this one included
    # The channel the job trigger notifies; '' when installed not to; None: missing, disabled.
    trigger_channel: str | None
    probes_sent: int  # 1 when the statement sent the probe notification it was given
    database_time: float  # clock_timestamp() as unix seconds, read during the statement
    set_aside: int  # queued jobs whose write failed on their own data (reactor.set_aside)
    joined_told: int  # 1 when this was the replica's first heartbeat and the others were told


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """Who checks, and what the ``health`` query needs besides the grace."""

    replica: str  # this replica's heartbeat row
    liveness: float  # seconds within which a heartbeat counts as live
    retention: float  # REACTOR_HOOK_RETENTION_SECONDS, for hooks_expired
    channel: str  # where a probe notification goes (and the joined notification)


def health_params(
    grace: float, check: HealthCheck, probe: str | None = None, *, own_session: bool = False
) -> dict[str, Any]:
    """The parameters of the ``health`` query; ``own_session`` when it runs on the replica's
    LISTEN connection."""
    return {
        "own_session": own_session,
        "grace": grace,
        "replica": check.replica,
        "liveness": check.liveness,
        "retention": check.retention,
        "channel": check.channel,
        "probe": probe,
    }


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A queued job as ``poll_queue`` reads it."""

    job_id: str
    due_in: float  # seconds until since + grace (negative: past it)
    since: datetime


ReconcileOutcome = Literal["stepped", "completed", "idle", "busy"]


@dataclass(frozen=True, slots=True)
class ReconcileStep:
    """What one reconcile step did: see the ``reconcile_step`` query."""

    outcome: ReconcileOutcome
    pass_number: int
    examined: int | None  # jobs this step walked; None when it walked none
    found: list[tuple[str, float]]  # (job id, seconds until due) of the jobs it queued
    next_in: float | None  # idle or busy: seconds until this replica may step again
    # The pass's totals, when this step completed it; None otherwise.
    pass_examined: int | None = None
    pass_found: int | None = None
    pass_example: str | None = None
    pass_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class ReconcilePass:
    """The last completed reconcile pass, and whether one is in progress."""

    number: int
    in_progress: bool
    started_at: datetime | None
    finished_at: datetime | None
    examined: int | None
    found: int | None
    example: str | None  # a job id the pass found, for the warning and for status
    seconds: float | None
    requested: bool
    owner: str | None  # who ran it: "reactor-...", "sweep-...", "install-..." or "migrate-..."

    @property
    def drift(self) -> int:
        """Jobs the pass found missing from the queue; an install's first pass finds none."""
        return 0 if (self.owner or "").startswith("install") else self.found or 0


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
    # Not a lease either: the lease of the row's last attempt ran out (its replica died running
    # it), and the claim parked the row as failed.
    parked: bool = False

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

    async def set_aside(
        self, job_id: str, error: psycopg.Error, *, first_retry: float, max_retry: float
    ) -> tuple[int, float]:
        """Set ``job_id`` aside after its write failed with ``error`` on its own data; return
        how many times in a row it failed on the same data, and the seconds until its next try.
        """
        rows = await self._fetch(
            "set_aside",
            {
                "job": job_id,
                "error": first_line(error),
                "sqlstate": error.sqlstate,
                "first_retry": first_retry,
                "max_retry": max_retry,
            },
        )
        return rows[0][0], rows[0][1]

    async def release_set_aside(self) -> int:
        """Try every job set aside again at once; how many there were."""
        rows = await self._fetch("release_set_aside", {})
        return int(rows[0][0])

    async def upcoming(self, limit: int) -> list[tuple[str, float]]:
        """(job id, seconds until due) for jobs that need a run and are inside their grace."""
        rows = await self._fetch("upcoming", {"grace": self.grace, "limit": limit})
        return [(job_id, due_in) for job_id, due_in in rows]

    async def reconcile_step(
        self, *, owner: str, interval: float, force: bool = False
    ) -> ReconcileStep:
        """Walk the next chunk of the reconcile pass, if it is ours to walk (see the query)."""
        rows = await self._fetch(
            "reconcile_step", reconcile_params(owner, interval, self.grace, force)
        )
        return reconcile_result(rows[0])

    async def reconcile_pass(
        self, owner: str, on_progress: Callable[[int], None] | None = None
    ) -> ReconcilePass:
        """Run a fresh full pass to its end (`reactor sweep --once`); its totals."""
        owner = f"{owner}-{uuid.uuid4().hex[:8]}"

        async def step(force: bool) -> ReconcileStep:
            rows = await self._fetch(
                "reconcile_step", reconcile_params(owner, _NEVER, self.grace, force)
            )
            return reconcile_result(rows[0])

        await walk_pass(step, on_progress)
        return ReconcilePass(*(await self._fetch("reconcile_last_pass", {}))[0])

    async def reconcile_release(self, owner: str) -> None:
        """Let another replica take over the pass ``owner`` holds, at once."""
        await self._fetch("reconcile_release", {"owner": owner})

    async def health(
        self,
        check: HealthCheck,
        *,
        probe: str | None = None,
        conn: AnyConnection | None = None,
    ) -> Health:
        """The replica's periodic check, and its heartbeat; see the ``health`` query.

        On ``conn`` (the LISTEN connection, a session of our own) when given, else pooled.
        ``probe``: a payload to notify on ``check.channel`` in the same round trip.
        """
        params = health_params(self.grace, check, probe, own_session=conn is not None)
        rows = await self._fetch("health", params, conn=conn)
        return Health(*rows[0])

    async def poll_queue(
        self,
        low: datetime | None,
        *,
        ahead: float,
        limit: int,
        conn: AnyConnection | None = None,
    ) -> tuple[list[QueuedJob], datetime]:
        """Queued jobs whose deadline comes within ``ahead`` seconds, from ``low`` on (see the
        ``poll_queue`` query), and the end of the window they were read from. On ``conn`` (the
        LISTEN connection, a session of our own) when given, else pooled."""
        params = {"grace": self.grace, "low": low, "ahead": ahead, "limit": limit}
        rows = await self._fetch("poll_queue", params, conn=conn)
        jobs = [QueuedJob(job_id, due_in, since) for job_id, due_in, since, _ in rows if job_id]
        return jobs, rows[0][3]

    async def leave(self, replica: str, channel: str) -> None:
        """Drop ``replica``'s heartbeat and tell the replicas listening on ``channel``: they take
        its jobs over at once (the others at their next check)."""
        await self._fetch("replica_leave", {"replica": replica, "channel": channel})

    async def notify(self, channel: str, payload: str) -> None:
        """Send one notification from a pool connection."""
        with anyio.fail_after(CALL_TIMEOUT):
            await notify(self.pool, channel, payload)

    async def claim_hooks(
        self, limit: int, lease: float, *, max_attempts: int | None = None
    ) -> list[HookClaim]:
        """Lease up to ``limit`` runnable hook rows of our hooks, oldest first; park a row whose
        lease ran out on attempt ``max_attempts`` of its schedule (None: never)."""
        params = {"hooks": self.hooks, "limit": limit, "lease": lease, "max_attempts": max_attempts}
        rows = await self._fetch("claim_hooks", params)
        return [
            HookClaim(id, run_id, job_id, hook, attempt, base, bool(gone), parked=gone is None)
            for id, run_id, job_id, hook, attempt, base, gone in rows
        ]

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

    async def purge_hooks(self, retention: float, batch: int) -> int | None:
        """Delete up to ``batch`` settled hook rows older than ``retention`` seconds.

        Returns how many were deleted, or None when another replica's purge holds the turn.
        """
        [(ours, deleted)] = await self._fetch(
            "purge_hooks",
            {"lock": _PURGE_LOCK, "retention": retention, "batch": batch},
            filename="hooks.sql",
        )
        return int(deleted) if ours else None

    async def _hook_update(self, name: str, claim: HookClaim, params: dict[str, Any]) -> None:
        await self._fetch(name, {"id": claim.id, "attempt": claim.attempt, **params})

    async def _fetch(
        self,
        name: str,
        params: dict[str, Any],
        *,
        lock_timeout: float | None = None,
        filename: str = "queries.sql",
        conn: AnyConnection | None = None,
    ) -> list[tuple[Any, ...]]:
        query = sql.query(name, filename)
        if conn is not None:
            # A dedicated session of our own (the LISTEN connection): one bare statement, its
            # bounds set for the session; the caller bounds the wait.
            cur = await conn.execute(query, params)
            return await cur.fetchall()
        # The bound covers waiting for a connection and the whole call made on it.
        with anyio.fail_after(CALL_TIMEOUT):
            async with self.pool.connection() as pooled:
                return await call(pooled, query, params, lock_timeout=lock_timeout)


async def call(
    conn: AnyConnection, query: str, params: Any = None, *, lock_timeout: float | None = None
) -> list[tuple[Any, ...]]:
    """Run one statement on a pool connection, as the module docstring says; its rows.

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
            cur = await conn.execute(query, params)
            return await cur.fetchall() if cur.description is not None else []
        if lock_timeout is None:
            return await run_pinned(conn, query, params)
        waiting = {"lock_timeout": f"{max(1, round(lock_timeout * 1000))}ms"}
        return await run_pinned(conn, query, params, waiting if own else {**_BOUNDS, **waiting})
    except psycopg.Error as error:
        if read_only_server(error, conn):
            await _drop(conn, error)
        raise


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


async def _drop(conn: AnyConnection, error: BaseException) -> None:
    if conn.closed:
        return  # the pool discards it as it is
    log.debug(
        "closing a connection to a read-only server",
        extra={"server": _address(conn.info.host, conn.info.port), "error": first_line(error)},
    )
    with anyio.CancelScope(shield=True):
        await conn.close()


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


def migration_script(
    channel: str, *, reference_schema: bool, applied: int = 0, notify: bool = True
) -> str:
    """The SQL `reactor migrate` runs from version ``applied``, for a migration tool to apply;
    with ``notify`` False, the job trigger queues without notifying.

    Each migration is one transaction; the statements that must run outside any transaction
    (index builds that leave the app writing) follow it, marked as such. The walk that queues
    the jobs which finished before the triggers existed is the reactor's, not SQL's: the script
    ends by saying to run `reactor sweep --once`, or to let a running reactor's reconcile do it.
    """
    lock = f"SELECT pg_advisory_xact_lock({_MIGRATE_LOCK});"
    timeout = f"SET LOCAL lock_timeout = '{_MIGRATE_LOCK_TIMEOUT}';"
    parts = []
    if reference_schema:
        parts += ["BEGIN;", sql.read("reference.sql"), "COMMIT;"]
    for migration in sql.migrations():
        if migration.version <= applied:
            continue
        record = (
            "INSERT INTO reactor.schema_version (version, name) "
            f"VALUES ({migration.version}, '{migration.name}') ON CONFLICT DO NOTHING;"
        )
        parts += [f"-- {migration.version:04d}_{migration.name}", "BEGIN;", lock, timeout]
        parts.append(sql.with_channel(migration.in_transaction, channel).strip())
        if not migration.outside_transaction:
            parts += [record, "COMMIT;"]
            continue
        parts.append("COMMIT;")
        # The marker names the one statement after it: run it on its own, in autocommit.
        for statement in migration.outside_transaction:
            parts += [sql.OUTSIDE_TRANSACTION, f"{statement};"]
        parts.append(record)
    parts += ["-- the triggers, repeatable", "BEGIN;", lock, timeout]
    trigger_channel = channel if notify else ""
    parts += [sql.with_channel(sql.read("notify_triggers.sql"), trigger_channel).strip(), "COMMIT;"]
    parts.append(
        "-- Jobs that finished before the triggers existed are not queued yet: run\n"
        "-- `reactor sweep --once`, or let a running reactor's reconcile pass find them."
    )
    return "\n".join(parts) + "\n"


async def migrate(
    conn: AnyConnection,
    channel: str,
    *,
    reference_schema: bool,
    notify: bool | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> list[int]:
    """Apply what is missing, then walk the jobs once; return the versions applied.

    Safe while the app writes, and safe to run concurrently: a session advisory lock makes a
    second migrate wait, then find nothing to do. Each migration is its own short transaction
    that waits at most a second for the app's locks and is retried; index builds run
    CONCURRENTLY outside it. The triggers are always re-pointed at ``channel``, so changing
    REACTOR_CHANNEL takes effect; with ``notify`` False they queue without notifying, and with
    None they keep the choice installed (notifying on a first install).

    Last comes a full reconcile pass. The triggers exist and are committed by then, so a job
    that turned eligible before they did is found by the pass, and any later one by them:
    nothing finishing during the install falls between the two. ``on_progress`` hears the
    number of jobs walked so far.
    """
    # Unbounded: an index build over a big table takes what it takes, and only waits.
    await conn.execute("SELECT set_config('statement_timeout', '0', false)")
    await _take_migrate_lock(conn)
    try:
        if reference_schema:
            await _migration_transaction(conn, sql.read("reference.sql"))
        await _require_app_tables(conn)
        applied = await schema_version(conn) or 0
        done = []
        for migration in sql.migrations():
            if migration.version <= applied:
                continue
            text = sql.with_channel(migration.in_transaction, channel)
            outside = migration.outside_transaction
            await _migration_transaction(conn, text, None if outside else migration)
            for statement in outside:
                await _outside_transaction(conn, statement)
            if outside:
                await _record_version(conn, migration)
            done.append(migration.version)
        if notify is None:
            installed = await job_trigger(conn)
            notify = installed is None or installed[0] != ""
        await _migration_transaction(
            conn, sql.with_channel(sql.read("notify_triggers.sql"), channel if notify else "")
        )
        # After an install, the pass queues what finished before the triggers existed: that is
        # expected, not drift. After a plain re-run, whatever it finds is drift.
        owner = "install" if done else "migrate"
        await reconcile_pass(conn, owner=owner, on_progress=on_progress)
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATE_LOCK,))
    return done


async def job_trigger(conn: AnyConnection) -> tuple[str, bool] | None:
    """(channel, enabled) of the job trigger as installed (channel '': it does not notify);
    None when there is none."""
    cur = await conn.execute(sql.query("job_trigger"))
    row = await cur.fetchone()
    return None if row is None else (row[0], row[1])


async def _take_migrate_lock(conn: AnyConnection) -> None:
    # Polled, never waited for inside a statement: a waiting statement holds a snapshot, and
    # the other migrate's CREATE INDEX CONCURRENTLY waits for every older snapshot to end.
    # Waiting in the lock would deadlock the two.
    waited = False
    while True:
        cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (_MIGRATE_LOCK,))
        row = await cur.fetchone()
        if row and row[0]:
            return
        if not waited:
            log.info("another `reactor migrate` is running; waiting for it to finish")
            waited = True
        await anyio.sleep(0.2)


async def _migration_transaction(
    conn: AnyConnection, text: str, migration: sql.Migration | None = None
) -> None:
    # Retried whole when a lock wait gives way to the app (each attempt rolls back cleanly).
    retrying = tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(_MIGRATE_ATTEMPTS),
        wait=tenacity.wait_random_exponential(multiplier=0.2, max=5),
        retry=tenacity.retry_if_exception_type(psycopg.errors.LockNotAvailable),
        reraise=True,
    )
    try:
        async for attempt in retrying:
            with attempt:
                async with conn.transaction():
                    await conn.execute(
                        "SELECT set_config('lock_timeout', %s, true)", (_MIGRATE_LOCK_TIMEOUT,)
                    )
                    await conn.execute(text)
                    if migration is not None:
                        await _record_version(conn, migration)
    except psycopg.errors.LockNotAvailable:
        raise DatabaseUnreachable(
            f"migrate could not take a table lock in {_MIGRATE_ATTEMPTS} tries of "
            f"{_MIGRATE_LOCK_TIMEOUT}: a long transaction holds analysis_jobs or analysis_runs; "
            "nothing was changed by the last try, run `reactor migrate` again later"
        ) from None


async def _outside_transaction(conn: AnyConnection, statement: str) -> None:
    index = _CONCURRENT_INDEX.search(statement)
    if index:
        # A CONCURRENTLY build that failed (a crash, a cancel) leaves an invalid index behind
        # that IF NOT EXISTS would keep for ever: drop it and build again.
        cur = await conn.execute(
            "SELECT NOT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(%s)",
            (index.group(1),),
        )
        row = await cur.fetchone()
        if row and row[0]:
            log.warning("dropping an invalid index left by an earlier build: %s", index.group(1))
            await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index.group(1)}")
    # It waits for old transactions to end, which blocks nobody: no lock timeout for it.
    cur = await conn.execute("SELECT current_setting('lock_timeout')")
    row = await cur.fetchone()
    await conn.execute("SELECT set_config('lock_timeout', '0', false)")
    try:
        await conn.execute(statement)
    finally:
        if row is not None:
            await conn.execute("SELECT set_config('lock_timeout', %s, false)", (row[0],))


async def _record_version(conn: AnyConnection, migration: sql.Migration) -> None:
    await conn.execute(
        "INSERT INTO reactor.schema_version (version, name) VALUES (%s, %s) ON CONFLICT DO NOTHING",
        (migration.version, migration.name),
    )


def reconcile_params(
    owner: str, interval: float, grace: float, force: bool, limit: int = RECONCILE_CHUNK
) -> dict[str, Any]:
    """The parameters of the ``reconcile_step`` query."""
    return {
        "owner": owner,
        "interval": interval,
        "grace": grace,
        "force": force,
        "limit": limit,
        "lease": RECONCILE_LEASE,
    }


def reconcile_result(row: tuple[Any, ...]) -> ReconcileStep:
    """The ``reconcile_step`` query's one row, read."""
    outcome, number, examined, found_ids, found_due_in, next_in, *totals = row
    found = list(zip(found_ids, found_due_in, strict=True))
    return ReconcileStep(outcome, number, examined, found, next_in, *totals)


async def reconcile_step(
    conn: AnyConnection,
    *,
    owner: str,
    interval: float,
    grace: float,
    force: bool = False,
    limit: int = RECONCILE_CHUNK,
) -> ReconcileStep:
    """One step of the shared reconcile pass on a dedicated connection; see the query."""
    cur = await conn.execute(
        sql.query("reconcile_step"), reconcile_params(owner, interval, grace, force, limit)
    )
    row = await cur.fetchone()
    assert row is not None
    return reconcile_result(row)


async def reconcile_pass(
    conn: AnyConnection,
    *,
    owner: str,
    grace: float = 0.0,
    on_progress: Callable[[int], None] | None = None,
) -> ReconcilePass:
    """Run a fresh full pass to its end on a dedicated connection (`reactor migrate`)."""
    owner = f"{owner}-{uuid.uuid4().hex[:8]}"

    async def step(force: bool) -> ReconcileStep:
        return await reconcile_step(conn, owner=owner, interval=_NEVER, grace=grace, force=force)

    await walk_pass(step, on_progress)
    return await last_reconcile_pass(conn)


async def walk_pass(
    step: Callable[[bool], Awaitable[ReconcileStep]],
    on_progress: Callable[[int], None] | None = None,
) -> None:
    """Start a fresh pass at once, taking over from any replica, and step it to its end.

    ``step(force)`` runs one step. A replica mid-step makes this wait its turn; replicas may
    walk chunks of the same pass meanwhile, which only ends it sooner.
    """
    force = True
    walked = 0
    while True:
        taken = await step(force)
        walked += taken.examined or 0
        if on_progress is not None:
            on_progress(walked)
        if taken.outcome == "busy":
            # Another replica is mid-step (or, after a second forced pass, holds the lease).
            await anyio.sleep(0.05)
            continue
        force = False
        # Idle: the pass ended in another replica's step, and no new one is due.
        if taken.outcome in ("completed", "idle"):
            return


async def last_reconcile_pass(conn: AnyConnection) -> ReconcilePass:
    """The last completed reconcile pass and whether one is running."""
    [row] = await fetch_dicts(conn, sql.query("reconcile_last_pass"))
    return ReconcilePass(**row)


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
