"""``reactor status``: is anything at risk of being lost, and why.

:func:`collect` reads one snapshot from the database (its statements are the ``status_*``
queries of ``triggers/status.sql``; all read-only), :func:`risks` judges it, and
:func:`as_json` / :func:`render` show it to machines and to people. The command exits 1 when
:func:`risks` finds anything, so a cron job or a CI step can alarm on the exit code alone.

The JSON shape is stable; keys are only ever added. Durations are seconds (float), times are
ISO 8601 from the database clock, and ``null`` means "unknown or not applicable"::

    {
      "checked_at": "2025-01-01T12:00:00.000000+00:00",   # database clock
      "at_risk": false,                                  # true exactly when risks is non-empty
      "risks": ["..."],                                  # one sentence per finding
      "verdict": {"state": "ok",     # "ok", "backlog" (jobs are due, nothing at risk) or
                  "reason": "..."},  # "at risk"; the reason in words (the first risk)
      "standby": false,              # a read-only hot standby (pg_is_in_recovery()): at risk,
                                     # and `reactor status` exits 3
      "jobs": {
        "due": 0,                    # need a run and are past REACTOR_GRACE_SECONDS
        "in_grace": 0,               # need a run, still inside the grace window
        "grace_seconds": 120.0,
        "oldest_due": null,          # or {"job_id": "...", "age_seconds": 3600.0}; age is
                                     # since the job's updated_at
        "trim_horizon_seconds": 86400.0,
        "at_risk": false             # oldest_due.age_seconds > trim_horizon_seconds / 2
      },
      "hooks": {
        "outbox": true,              # false (and the counts null) before the outbox migration
        "pending": 0, "running": 0,
        "backlog": 0,                # pending + running
        "failed": 0,                 # parked after their last attempt: at risk when > 0
        "oldest_backlog_age_seconds": null,
        "recent_failures": [         # newest first, at most 5
          {"id": 42,                 # what `reactor hooks retry/cancel` take; null before
                                     # the schema has row ids
           "hook": "...", "run_id": "...", "job_id": "...", "attempts": 40,
           "last_error": "...",      # URLs shown as scheme, host and path only
           "updated_at": "..."}
        ]
      },
      "listeners": {
        "mode": "listen",            # REACTOR_MODE; in poll mode zero sessions is expected
        "count": 2,
        "sessions": [{"pid": 123, "client_addr": "10.0.0.5", "backend_start": "..."}]
      },                             # client_addr and backend_start are null for a session of
                                     # another role unless this one has pg_read_all_stats
      "replicas": {                  # the heartbeat rows (reactor.replicas), oldest first
        "live": 2,
        "rows": [{"id": "reactor-...", "started_at": "...", "heartbeat_age_seconds": 1.2,
                  "listens": true,   # its heartbeat rides its LISTEN session
                  "live": true}]     # fresh heartbeat, and that session still there
      },
      "schema": {"version": 5, "required": 5, "behind": false},
      "trigger": {                   # the job trigger on analysis_jobs
        "installed": true,
        "enabled": true,             # fires for the app's sessions
        "channel": "analysis_jobs_terminal",  # what it notifies; "" when installed with
                                     # `reactor migrate --no-notify`; null when not installed
        "notifies": true,
        "at_risk": false             # missing or disabled: nothing is queued
      },
      "notify_queue": {"usage": 0.0, "at_risk": false},  # pg_notification_queue_usage()
      "set_aside": {                 # queued jobs whose write failed on their own data (the
        "count": 0,                  # app's constraint or trigger rejected the row); null
        "first": [                   # before the schema has them. At risk when count > 0.
          {"job_id": "...", "error": "...", "sqlstate": "23502", "failures": 1,
           "first_failed_at": "...", "retry_at": "..."}
        ],                           # the oldest, at most 5
        "at_risk": false
      },
      "reconcile": {
        "interval_seconds": 600.0,   # REACTOR_RECONCILE_INTERVAL_SECONDS; 0: turned off
        "in_progress": false,
        "requested": false,          # a pass was asked for (TRUNCATE analysis_runs)
        "last_pass": null,           # or {"started_at": "...", "finished_at": "...",
                                     #      "seconds": 1.2, "examined": 1400000, "found": 0,
                                     #      "example_job_id": null, "by": "reactor-..."}
        "drift": 0,                  # jobs the last pass found missing from the pending
                                     # queue (an install's first pass counts none)
        "overdue": false,            # on, and no pass ended within twice the interval
        "at_risk": false             # drift > 0 or overdue
      }                              # null before the reconcile migration
    }
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import psycopg.errors
from rich.console import Console
from rich.table import Table
from rich.text import Text

from reactor import db, grants, mapping, redact, sql
from reactor.config import Settings
from reactor.errors import PrivilegeMissing, SchemaMissing
from reactor.service import LIVENESS_PROBES
from reactor.vitals import QUEUE_WARNING

# The application_name of a listener's session: db.conninfo names sessions "reactor-<role>"
# and the listener connects with role "listener".
LISTENER_APPLICATION_NAME = "reactor-listener"

RECENT_FAILURES = 5

# The migration that gave heartbeat rows their LISTEN session; before it none are read.
REPLICA_SESSIONS_VERSION = 14


@dataclass(frozen=True)
class Listener:
    """One LISTEN session of a reactor replica, as pg_stat_activity shows it."""

    pid: int
    client_addr: str | None  # None: a Unix socket, or not visible to this role
    backend_start: datetime | None


@dataclass(frozen=True)
class Replica:
    """One replica's heartbeat row, as reactor.replicas holds it."""

    id: str
    started_at: datetime
    heartbeat_age: float  # seconds since its last health check, by the database clock
    listens: bool  # its heartbeat rides its LISTEN session
    live: bool  # the health check's rule: a fresh heartbeat, and that session still there


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
    listeners: tuple[Listener, ...]
    schema_version: int
    required_version: int
    queue_usage: float
    # The job trigger: the channel it notifies ('' for none), None when it is not installed.
    trigger_channel: str | None
    trigger_enabled: bool
    reconcile_interval: float = 0.0
    reconcile: db.ReconcilePass | None = None  # None before the reconcile migration
    set_aside_count: int | None = None  # None before the set-aside migration
    set_aside: tuple[SetAsideJob, ...] = ()  # the oldest few
    in_recovery: bool = False  # a read-only hot standby: no reactor can write here
    replicas: tuple[Replica, ...] = ()  # the heartbeat rows, oldest first

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


async def collect(conn: db.AnyConnection, settings: Settings) -> Status:
    """Read one snapshot; SchemaMissing or PrivilegeMissing when there is nothing to read."""
    try:
        return await _collect(conn, settings)
    except psycopg.errors.InsufficientPrivilege as error:
        raise PrivilegeMissing(
            f"cannot read the reactor's state: {db.first_line(error)}; grant what "
            "`reactor migrate --print-grants ROLE` prints, or run status as the owner"
        ) from None


async def _collect(conn: db.AnyConnection, settings: Settings) -> Status:
    server = await _one(conn, "status_server")
    if not server["app_tables"]:
        tables = mapping.in_force()
        raise SchemaMissing(
            f"table {tables.jobs_shown} or {tables.runs_shown} not found; check DATABASE_URL "
            "points at the app's database"
        )
    version = await db.schema_version(conn)
    if version is None:
        raise SchemaMissing("the database has no reactor schema; run `reactor migrate`")
    jobs_query = "status_jobs" if server["pending_queue"] else "status_jobs_unqueued"
    jobs = await _one(conn, jobs_query, {"grace": settings.grace})
    hooks = Hooks(outbox=False)
    if server["hook_outbox"]:
        counts = await _one(conn, "status_hooks")
        failures_query = (
            "status_hook_failures" if server["hook_ids"] else "status_hook_failures_unnumbered"
        )
        failures = await db.fetch_dicts(
            conn, sql.query(failures_query, "status.sql"), {"limit": RECENT_FAILURES}
        )
        hooks = Hooks(
            outbox=True,
            pending=counts["pending"],
            running=counts["running"],
            failed=counts["failed"],
            oldest_backlog_age=counts["oldest_backlog_age"],
            recent_failures=tuple(
                HookFailure(**{**row, "last_error": _shown(row["last_error"])}) for row in failures
            ),
        )
    reconcile = await db.last_reconcile_pass(conn) if server["reconcile"] else None
    held = None
    if server["set_aside"] and server["pending_queue"]:
        held = await _one(conn, "status_set_aside", {"limit": RECENT_FAILURES})
    listeners = await db.fetch_dicts(
        conn,
        sql.query("status_listeners", "status.sql"),
        {"application_name": LISTENER_APPLICATION_NAME},
    )
    replicas = []
    if version >= REPLICA_SESSIONS_VERSION:
        replicas = await db.fetch_dicts(
            conn,
            sql.query("status_replicas", "dashboard.sql"),
            {"liveness": LIVENESS_PROBES * settings.probe_interval},
        )
    return Status(
        checked_at=server["checked_at"],
        grace=settings.grace,
        trim_horizon=settings.trim_horizon,
        mode=settings.mode,
        due=jobs["due"],
        in_grace=jobs["in_grace"],
        oldest_job_id=jobs["oldest_job_id"],
        oldest_age=jobs["oldest_age"],
        hooks=hooks,
        listeners=tuple(Listener(**row) for row in listeners),
        schema_version=version,
        required_version=sql.latest_version(),
        queue_usage=server["queue_usage"],
        reconcile_interval=settings.reconcile_interval,
        reconcile=reconcile,
        trigger_channel=server["trigger_channel"],
        trigger_enabled=server["trigger_enabled"],
        in_recovery=server["in_recovery"],
        set_aside_count=None if held is None else held["count"],
        set_aside=()
        if held is None
        else tuple(
            SetAsideJob(**{**job, "error": redact.scrub(job["error"])}) for job in held["first"]
        ),
        replicas=tuple(Replica(**row) for row in replicas),
    )


def _shown(error: str | None) -> str | None:
    # Migration 0009 cleaned the errors stored before it; this covers anything a hook's own
    # message quoted since, such as a URL with a token in its query string.
    return None if error is None else redact.scrub(error)


async def _one(conn: db.AnyConnection, name: str, params: Any = None) -> dict[str, Any]:
    # With parameters always, {} when none: a named query's filled-in % are doubled for them.
    rows = await db.fetch_dicts(conn, sql.query(name, "status.sql"), params or {})
    return rows[0]


def risks(status: Status) -> list[str]:
    """What is at risk, one sentence each; empty when all is well."""
    found = []
    if status.in_recovery:
        found.append(
            "the database is a read-only hot standby: no reactor can record a run here, and "
            "what this report shows lags the primary; point DATABASE_URL at the primary, or "
            "list every host with target_session_attrs=read-write"
        )
    if status.oldest_at_risk:
        assert status.oldest_age is not None
        found.append(
            f"the oldest due job ({status.oldest_job_id}) was last updated "
            f"{duration(status.oldest_age)} ago, past half the "
            f"{duration(status.trim_horizon)} trim horizon: record it before doc_html is trimmed"
        )
    if status.set_aside_count:
        first = status.set_aside[0]
        found.append(
            f"{status.set_aside_count} job(s) cannot be written and are set aside (first: job "
            f"{first.job_id}: {first.error}); fix the data or the app's constraint, then "
            "`reactor sweep --once` tries them again now"
        )
    if status.hooks.failed:
        found.append(
            f"{status.hooks.failed} hook call(s) failed for good and are parked: "
            "`reactor hooks list --failed` shows them, `reactor hooks retry --failed` "
            "re-queues them"
        )
    if status.schema_behind:
        found.append(
            f"the schema is at version {status.schema_version}, this reactor needs "
            f"{status.required_version}: run `reactor migrate`"
        )
    if status.queue_at_risk:
        found.append(
            f"the NOTIFY queue is {status.queue_usage:.0%} full: a session LISTENs without "
            "reading, and the app's commits fail when it is full"
        )
    if status.trigger_at_risk:
        state = "missing" if status.trigger_channel is None else "disabled"
        found.append(
            f"the job trigger on {mapping.in_force().jobs_shown} is {state}: finished jobs are "
            "not queued and "
            "only the reconcile finds them; run `reactor migrate`"
        )
    if status.mode == "listen" and status.due and not status.listeners:
        found.append(f"{status.due} job(s) are due and no reactor is LISTENing")
    if status.reconcile is not None and status.reconcile.drift:
        found.append(
            f"the last reconcile pass found {status.reconcile.drift} job(s) missing from the "
            f"pending queue (e.g. job {status.reconcile.example}): something went around the "
            "reactor's triggers (a restore, replication, a disabled trigger, deleted queue rows); "
            "they were queued, and `reactor sweep --once` repairs the rest now"
        )
    if status.reconcile_overdue:
        found.append(
            f"no full reconcile pass ended in the last {duration(2 * status.reconcile_interval)}:"
            " check that a reactor runs and what its log says"
        )
    return found


def verdict(status: Status) -> tuple[str, str]:
    """(state, reason): ``at risk`` when :func:`risks` finds anything (the reason is the first
    finding), ``backlog`` when jobs are due and nothing is at risk, else ``ok``."""
    found = risks(status)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        return "at risk", found[0] + more
    if status.due:
        assert status.oldest_age is not None
        return "backlog", (
            f"{status.due} job(s) are due and not recorded yet; the oldest was last updated "
            f"{duration(status.oldest_age)} ago, well inside the {duration(status.trim_horizon)}"
            " trim horizon"
        )
    return "ok", (
        f"nothing at risk: no job is past its {duration(status.grace)} grace without a run"
    )


def as_json(status: Status) -> dict[str, Any]:
    """The snapshot in the stable JSON shape documented at the top of this module."""
    found = risks(status)
    state, reason = verdict(status)
    return {
        "checked_at": status.checked_at.isoformat(),
        "at_risk": bool(found),
        "risks": found,
        "verdict": {"state": state, "reason": reason},
        "standby": status.in_recovery,
        "jobs": {
            "due": status.due,
            "in_grace": status.in_grace,
            "grace_seconds": status.grace,
            "oldest_due": None
            if status.oldest_job_id is None
            else {"job_id": status.oldest_job_id, "age_seconds": status.oldest_age},
            "trim_horizon_seconds": status.trim_horizon,
            "at_risk": status.oldest_at_risk,
        },
        "hooks": {
            "outbox": status.hooks.outbox,
            "pending": status.hooks.pending,
            "running": status.hooks.running,
            "backlog": status.hooks.backlog,
            "failed": status.hooks.failed,
            "oldest_backlog_age_seconds": status.hooks.oldest_backlog_age,
            "recent_failures": [
                {
                    "id": f.id,
                    "hook": f.hook,
                    "run_id": f.run_id,
                    "job_id": f.job_id,
                    "attempts": f.attempts,
                    "last_error": f.last_error,
                    "updated_at": f.updated_at.isoformat(),
                }
                for f in status.hooks.recent_failures
            ],
        },
        "listeners": {
            "mode": status.mode,
            "count": len(status.listeners),
            "sessions": [
                {
                    "pid": s.pid,
                    "client_addr": s.client_addr,
                    "backend_start": s.backend_start.isoformat() if s.backend_start else None,
                }
                for s in status.listeners
            ],
        },
        "replicas": {
            "live": sum(r.live for r in status.replicas),
            "rows": [
                {
                    "id": r.id,
                    "started_at": r.started_at.isoformat(),
                    "heartbeat_age_seconds": r.heartbeat_age,
                    "listens": r.listens,
                    "live": r.live,
                }
                for r in status.replicas
            ],
        },
        "schema": {
            "version": status.schema_version,
            "required": status.required_version,
            "behind": status.schema_behind,
        },
        "trigger": {
            "installed": status.trigger_channel is not None,
            "enabled": status.trigger_enabled,
            "channel": status.trigger_channel,
            "notifies": bool(status.trigger_channel),
            "at_risk": status.trigger_at_risk,
        },
        "notify_queue": {"usage": status.queue_usage, "at_risk": status.queue_at_risk},
        "set_aside": None
        if status.set_aside_count is None
        else {
            "count": status.set_aside_count,
            "first": [vars(job) for job in status.set_aside],
            "at_risk": bool(status.set_aside_count),
        },
        "reconcile": None if status.reconcile is None else _reconcile_json(status),
    }


def _reconcile_json(status: Status) -> dict[str, Any]:
    last = status.reconcile
    assert last is not None
    return {
        "interval_seconds": status.reconcile_interval,
        "in_progress": last.in_progress,
        "requested": last.requested,
        "last_pass": None
        if last.finished_at is None
        else {
            "started_at": last.started_at.isoformat() if last.started_at else None,
            "finished_at": last.finished_at.isoformat(),
            "seconds": last.seconds,
            "examined": last.examined,
            "found": last.found,
            "example_job_id": last.example,
            "by": last.owner,
        },
        "drift": last.drift,
        "overdue": status.reconcile_overdue,
        "at_risk": status.reconcile_at_risk,
    }


def render(status: Status, console: Console) -> None:
    """A table for people: one row per check, the risky ones in red."""
    table = Table(title=f"reactor status at {status.checked_at:%Y-%m-%d %H:%M:%S %Z}")
    table.add_column("check")
    table.add_column("value")
    table.add_column("state")

    def row(check: str, value: str, risky: bool, *, note: str = "ok") -> None:
        state = Text("AT RISK", style="bold red") if risky else Text(note, style="green")
        table.add_row(check, value, state)

    row(
        "jobs needing a run",
        f"{status.due} due, {status.in_grace} inside the {duration(status.grace)} grace",
        False,
        note="ok" if not status.due else "backlog",
    )
    oldest = "none due"
    if status.oldest_age is not None:
        oldest = (
            f"{duration(status.oldest_age)} (job {status.oldest_job_id}); "
            f"at risk past {duration(status.trim_horizon / 2)}"
        )
    row("oldest due job", oldest, status.oldest_at_risk)
    if status.set_aside_count is not None:
        held = f"{status.set_aside_count} whose write failed"
        for job in status.set_aside:
            held += f"\njob {job.job_id}: {job.error[:80]}"
        row("jobs set aside", held, bool(status.set_aside_count))
    hooks = "no outbox yet (run `reactor migrate`)"
    if status.hooks.outbox:
        hooks = (
            f"{status.hooks.pending} pending, {status.hooks.running} running, "
            f"{status.hooks.failed} failed"
        )
        if status.hooks.oldest_backlog_age is not None:
            hooks += f"; oldest waiting {duration(status.hooks.oldest_backlog_age)}"
        for failure in status.hooks.recent_failures:
            error = (failure.last_error or "").splitlines()[:1]
            hooks += f"\n#{failure.id} {failure.hook} run {failure.run_id}: {''.join(error)[:80]}"
    row("hooks", hooks, bool(status.hooks.failed))
    sessions = [
        f"{s.client_addr or 'local'} since {s.backend_start:%Y-%m-%d %H:%M:%S}"
        if s.backend_start
        else f"pid {s.pid}"
        for s in status.listeners
    ]
    no_listener = status.mode == "listen" and bool(status.due) and not status.listeners
    row(
        "LISTEN sessions",
        "\n".join([str(len(status.listeners)), *sessions]),
        no_listener,
        note="ok" if status.mode == "listen" else "poll mode",
    )
    row(
        "schema",
        f"version {status.schema_version} (this reactor needs {status.required_version})",
        status.schema_behind,
    )
    row("job trigger", _trigger_text(status), status.trigger_at_risk)
    row("NOTIFY queue", f"{status.queue_usage:.1%} used", status.queue_at_risk)
    if status.reconcile is not None:
        row("reconcile", _reconcile_text(status), status.reconcile_at_risk)
    console.print(table)
    found = risks(status)
    for risk in found:
        console.print(Text(f"at risk: {risk}", style="red"))
    if not found:
        console.print(Text("nothing at risk", style="green"))


def _trigger_text(status: Status) -> str:
    if status.trigger_channel is None:
        return "not installed (run `reactor migrate`)"
    if not status.trigger_enabled:
        # The statement as it must be typed: the table's names quoted as needed (app.Job is
        # app.job to PostgreSQL), and the trigger named after the reactor's schema.
        m = mapping.in_force()
        schema, name = m.jobs.table if len(m.jobs.table) == 2 else ("public", m.jobs.table[-1])
        table = grants.quoted(name) if schema == "public" else grants.quoted(schema, name)
        trigger = grants.quoted(f"{m.reactor_schema}_job_update")
        return f"disabled (ALTER TABLE {table} ENABLE TRIGGER {trigger})"
    if not status.trigger_channel:
        return "queues without notifying: the reactors poll the queue"
    return f"notifies channel {status.trigger_channel}"


def _reconcile_text(status: Status) -> str:
    last = status.reconcile
    assert last is not None
    every = (
        f"every {duration(status.reconcile_interval)}" if status.reconcile_interval else "off here"
    )
    if last.finished_at is None:
        return f"no pass yet ({every})"
    ago = duration(max(0.0, (status.checked_at - last.finished_at).total_seconds()))
    text = (
        f"last pass {ago} ago, {duration(last.seconds or 0.0)}: walked {last.examined}, "
        f"found {last.found}"
    )
    if last.drift:
        text += f" (e.g. job {last.example})"
    if last.in_progress:
        text += "; a pass is running"
    return f"{text} ({every})"


def duration(seconds: float) -> str:
    """``3725`` -> ``1h 2m 5s``; sub-minute values keep one decimal."""
    if seconds < 60:
        return f"{seconds:.1f}s".replace(".0s", "s")
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    return " ".join(f"{n}{unit}" for n, unit in parts if n) or "0s"
