"""The snapshot ``reactor status`` judges, and how it is read from the database."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from reactor import db
from reactor.core.ownership import LIVENESS_PROBES
from reactor.db import errors as db_errors
from reactor.db.health import QUEUE_WARNING as QUEUE_WARNING
from reactor.errors import PrivilegeMissing, SchemaMissing
from reactor.install import Install, null_cost, sql
from reactor.install.quote import readable
from reactor.insurance.retention import retention_late
from reactor.settings.config import Settings
from reactor.shown import printable
from reactor.telemetry import redact

RECENT_FAILURES = 5

# The migration that gave heartbeat rows their LISTEN session; before it none are read.
REPLICA_SESSIONS_VERSION = 14


@dataclass(frozen=True)
class ListenerStatus:
    """One LISTEN session of a reactor replica, as pg_stat_activity shows it."""

    pid: int
    client_addr: str | None  # None: a Unix socket, or not visible to this role
    backend_start: datetime | None


@dataclass(frozen=True)
class ReplicaStatus:
    """One replica's heartbeat row, as reactor.replicas holds it."""

    id: str
    started_at: datetime
    heartbeat_age: float  # seconds since its last health check, by the database clock
    listens: bool  # its heartbeat rides its LISTEN session
    live: bool  # the health check's rule: a fresh heartbeat, and that session still there
    grace: float | None = None  # the grace it runs with; None before migration 18
    write_error: str | None = None  # what its record statements fail with, while they fail


@dataclass(frozen=True)
class HookFailure:
    """One hook row parked as failed."""

    id: int | None  # None on a schema from before hook row ids
    hook: str
    run_id: str
    job_id: str
    attempts: int
    last_error: str | None
    updated_at: datetime


@dataclass(frozen=True)
class Hooks:
    """The hook outbox's state; counts are None when the outbox table does not exist."""

    outbox: bool
    pending: int | None = None
    running: int | None = None
    failed: int | None = None
    oldest_backlog_age: float | None = None
    recent_failures: tuple[HookFailure, ...] = ()
    # Seconds the oldest settled row outlived REACTOR_HOOK_RETENTION_SECONDS (0: none has), and
    # whether that is long enough to say the retention purge is not running.
    retention_overdue: float | None = None
    retention_late: bool = False

    @property
    def backlog(self) -> int | None:
        """Rows queued or leased."""
        if self.pending is None or self.running is None:
            return None
        return self.pending + self.running


@dataclass(frozen=True)
class SetAsideJob:
    """A queued job whose write failed on its own data, as reactor.set_aside holds it."""

    job_id: str
    error: str
    sqlstate: str | None
    failures: int
    first_failed_at: str  # ISO 8601, database clock
    retry_at: str
    # A NULL refused by a column the mapping fills: the mapping's line and the two fixes
    # (reactor.install.null_cost); None for any other error.
    fix: str | None = None


@dataclass(frozen=True)
class Status:
    """One snapshot of everything ``reactor status`` reports."""

    checked_at: datetime
    grace: float
    trim_horizon: float
    mode: str
    due: int
    in_grace: int
    oldest_job_id: str | None  # the oldest due job, or None when none is due
    oldest_age: float | None  # seconds since that job's updated_at
    hooks: Hooks
    listeners: tuple[ListenerStatus, ...]
    schema_version: int
    required_version: int
    queue_usage: float
    # The job trigger: the channel it notifies ('' for none), None when it is not installed.
    trigger_channel: str | None
    trigger_enabled: bool
    trigger_spread: bool = False  # each share of the jobs on a channel of its own
    reconcile_interval: float = 0.0
    reconcile: db.ReconcilePass | None = None  # None before the reconcile migration
    set_aside_count: int | None = None  # None before the set-aside migration
    set_aside: tuple[SetAsideJob, ...] = ()  # the oldest few
    in_recovery: bool = False  # a read-only hot standby: no reactor can write here
    replicas: tuple[ReplicaStatus, ...] = ()  # the heartbeat rows, oldest first
    # The job table as messages name it, and the statement that re-enables its trigger, as a
    # person must type it: names quoted as needed, the trigger named after the reactor's schema.
    jobs_table: str = "analysis_jobs"
    enable_trigger: str = "ALTER TABLE public.analysis_jobs ENABLE TRIGGER reactor_job_update"
    # What the reactor's schema holds, or allows, that its owner did not make: `reactor run`
    # and `sweep` refuse to start while any is there (see triggers/trust.sql).
    untrusted: tuple[str, ...] = ()
    # This command's own REACTOR_GRACE_SECONDS, when the live replicas run with another grace
    # (which `grace` then is): the report's split at the grace is theirs.
    own_grace: float | None = None
    # PUBLIC may create in the schema public (PostgreSQL 14 and earlier, unless revoked): any
    # role can put objects where the app's unqualified names, and the reactor's, are found.
    public_creatable: bool = False
    # The installed triggers and functions were rendered from another version of the mapping
    # file than this command's (reactor/db/drift.py): `reactor migrate` re-installs them.
    mapping_changed: bool = False
    # The seconds the channel's doorbell is still awake (the app's finishing commits skip their
    # NOTIFY, the replicas poll the queue); None while it is silent or before its migration.
    doorbell_awake_for: float | None = None

    @property
    def unwritable(self) -> tuple[ReplicaStatus, ...]:
        """The live replicas whose record statements fail on the pair's own objects."""
        return tuple(r for r in self.replicas if r.live and r.write_error)

    @property
    def trigger_at_risk(self) -> bool:
        """The job trigger is missing or disabled: finished jobs are not queued."""
        return self.trigger_channel is None or not self.trigger_enabled

    @property
    def reconcile_overdue(self) -> bool:
        """The reconcile is on and no full pass ended within twice its interval."""
        if self.reconcile is None or not self.reconcile_interval:
            return False
        finished = self.reconcile.finished_at
        return (
            finished is None
            or (self.checked_at - finished).total_seconds() > 2 * self.reconcile_interval
        )

    @property
    def reconcile_at_risk(self) -> bool:
        """The last pass found drift, or passes stopped happening."""
        return bool(self.reconcile and self.reconcile.drift) or self.reconcile_overdue

    @property
    def oldest_at_risk(self) -> bool:
        """The oldest due job is past half the trim horizon: its document may go soon."""
        return self.oldest_age is not None and self.oldest_age > self.trim_horizon / 2

    @property
    def schema_behind(self) -> bool:
        """The database lacks migrations this release needs."""
        return self.schema_version < self.required_version

    @property
    def queue_at_risk(self) -> bool:
        """The NOTIFY queue is past the share where the app's commits are in danger."""
        return self.queue_usage >= QUEUE_WARNING


async def collect(conn: db.AnyConnection, install: Install, settings: Settings) -> Status:
    """Read one snapshot of ``install`` on ``conn``; SchemaMissing or PrivilegeMissing when
    there is nothing to read."""
    try:
        with db_errors.translated(db_errors.PrivilegeDenied):
            queries = db.Database.dedicated(install, conn, settings=settings)
            return await _collect(conn, queries, settings)
    except db_errors.PrivilegeDenied as error:
        raise PrivilegeMissing(
            f"cannot read the reactor's state: {error}; grant what "
            "`reactor migrate --print-grants ROLE` prints, or run status as the owner"
        ) from None


async def _collect(conn: db.AnyConnection, queries: db.Database, settings: Settings) -> Status:
    install = queries.install
    server = await _one(queries, "status_server")
    if not server["app_tables"]:
        tables = install.mapping
        raise SchemaMissing(
            f"table {tables.jobs_shown} or {tables.runs_shown} not found; check DATABASE_URL "
            "points at the app's database"
        )
    version = await db.schema_version(conn, install.schema)
    if version is None:
        raise SchemaMissing("the database has no reactor schema; run `reactor migrate`")
    replicas = []
    if version >= REPLICA_SESSIONS_VERSION:
        rows = await queries.fetch_dicts(
            "status_replicas",
            {"liveness": LIVENESS_PROBES * settings.probe_interval},
            filename="dashboard.sql",
        )
        replicas = [ReplicaStatus(**row) for row in rows]
    grace = running_grace(replicas, settings.grace)
    jobs_query = "status_jobs" if server["pending_queue"] else "status_jobs_unqueued"
    jobs = await _one(queries, jobs_query, {"grace": grace})
    hooks = Hooks(outbox=False)
    if server["hook_outbox"]:
        counts = await _one(queries, "status_hooks", {"retention": settings.hook_retention})
        failures_query = (
            "status_hook_failures" if server["hook_ids"] else "status_hook_failures_unnumbered"
        )
        failures = await queries.fetch_dicts(
            failures_query, {"limit": RECENT_FAILURES}, filename="status.sql"
        )
        hooks = Hooks(
            outbox=True,
            pending=counts["pending"],
            running=counts["running"],
            failed=counts["failed"],
            oldest_backlog_age=counts["oldest_backlog_age"],
            retention_overdue=counts["retention_overdue"],
            retention_late=retention_late(counts["retention_overdue"], settings.probe_interval),
            recent_failures=tuple(
                HookFailure(**{**row, "last_error": _shown(row["last_error"])}) for row in failures
            ),
        )
    reconcile = await queries.last_reconcile_pass() if server["reconcile"] else None
    held = None
    if server["set_aside"] and server["pending_queue"]:
        held = await _one(queries, "status_set_aside", {"limit": RECENT_FAILURES})
    bell = []
    # A hot standby cannot read an unlogged table; nothing rings a standby's bell anyway.
    if server["doorbell"] and not server["in_recovery"]:
        bell = await queries.fetch_dicts(
            "status_doorbell", {"channel": install.channel}, filename="status.sql"
        )
    listeners = await queries.fetch_dicts(
        "status_listeners",
        {"application_name": db.LISTENER_APPLICATION_NAME},
        filename="status.sql",
    )
    return Status(
        checked_at=server["checked_at"],
        grace=grace,
        own_grace=None if grace == settings.grace else settings.grace,
        trim_horizon=settings.trim_horizon,
        mode=settings.mode,
        due=jobs["due"],
        in_grace=jobs["in_grace"],
        oldest_job_id=jobs["oldest_job_id"],
        oldest_age=jobs["oldest_age"],
        hooks=hooks,
        listeners=tuple(ListenerStatus(**row) for row in listeners),
        schema_version=version,
        required_version=sql.latest_version(),
        queue_usage=server["queue_usage"],
        reconcile_interval=settings.reconcile_interval,
        reconcile=reconcile,
        trigger_channel=server["trigger_channel"],
        trigger_enabled=server["trigger_enabled"],
        trigger_spread=server["trigger_spread"],
        in_recovery=server["in_recovery"],
        set_aside_count=None if held is None else held["count"],
        set_aside=()
        if held is None
        else tuple(
            SetAsideJob(
                **{
                    **job,
                    # The app's constraint names reach the terminal: escaped.
                    "error": printable(redact.scrub(job["error"])),
                    "fix": null_cost.set_aside_fix(
                        install.mapping, job["sqlstate"], redact.scrub(job["error"])
                    ),
                }
            )
            for job in held["first"]
        ),
        replicas=tuple(replicas),
        untrusted=tuple(await queries.untrusted()),
        public_creatable=server["public_creatable"],
        mapping_changed=await db.mapping_changed(conn, install),
        doorbell_awake_for=bell[0]["awake_for"] if bell else None,
        jobs_table=install.mapping.jobs_shown,
        enable_trigger=_enable_trigger(install),
    )


def running_grace(replicas: list[ReplicaStatus], own: float) -> float:
    """The grace the live replicas run with (the longest, should they differ: no job is due to
    all of them before it); ``own``, this command's setting, when none publishes one."""
    published = [r.grace for r in replicas if r.live and r.grace is not None]
    return max(published) if published else own


def _enable_trigger(install: Install) -> str:
    table = install.mapping.jobs.table
    schema, name = table if len(table) == 2 else ("public", table[-1])
    return (
        f"ALTER TABLE {readable(schema, name)} ENABLE TRIGGER "
        f"{readable(f'{install.schema}_job_update')}"
    )


def _shown(error: str | None) -> str | None:
    # Migration 0009 cleaned the errors stored before it; this covers anything a hook's own
    # message quoted since, such as a URL with a token in its query string.
    return None if error is None else redact.scrub(error)


async def _one(queries: db.Database, name: str, params: Any = None) -> dict[str, Any]:
    # With parameters always, {} when none: a named query's filled-in % are doubled for them.
    rows = await queries.fetch_dicts(name, params or {}, filename="status.sql")
    return rows[0]
