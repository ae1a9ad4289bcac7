"""The rows the reactor's named queries return, one frozen dataclass each.

Rows are decoded by column name (psycopg's ``class_row``, or a ``from_row`` for a row whose
columns do not map one to one onto fields), so a field and the SQL alias that fills it carry
the same name: a renamed column fails loudly instead of filling the wrong field.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

Outcome = Literal[
    "recorded", "superseded", "waiting", "busy", "dropped", "kept", "deferred", "set_aside"
]


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What one record statement did with one job."""

    job_id: str
    run_id: str | None  # None for a queued job the scan found gone
    outcome: Outcome
    # Seconds until updated_at + grace by the database clock (negative: how late); None when
    # the scan did not claim the job.
    due_in: float | None


@dataclass(frozen=True, slots=True)
class Health:
    """The database's side of the reactor's health."""

    queue_usage: float  # pg_notification_queue_usage(), 0..1
    oldest_overdue: float  # seconds the oldest due job has waited past its grace; 0 if none
    hook_backlog: int  # hook rows pending or running
    hook_failed: int  # hook rows parked as failed
    hooks_expired: bool  # settled hook rows outlived their retention: the purge has work
    reconcile_last_pass: float  # unix time the last full reconcile pass ended; 0 before any
    reconcile_requested: bool  # a pass was asked for (a TRUNCATE of the runs)
    live_replicas: list[str]  # replicas whose heartbeat is fresh, this one included
    # The channel the job trigger notifies; '' when installed not to; None: missing, disabled.
    trigger_channel: str | None
    trigger_spread: bool  # it notifies each share of the jobs on a channel of its own
    probes_sent: int  # 1 when the statement sent the probe notification it was given
    database_time: float  # clock_timestamp() as unix seconds, read during the statement
    set_aside: int  # queued jobs whose write failed on their own data (reactor.set_aside)
    joined_told: int  # 1 when this was the replica's first heartbeat and the others were told
    hooks_orphaned: int  # running hook rows of replicas no longer live, made due at once
    queued: bool  # the pending queue holds a job, any replica's
    bell_in: float | None = None  # seconds the channel's doorbell is still awake; None: silent
    # Seconds the oldest settled hook row has outlived its retention; 0 when none has.
    hooks_overdue: float = 0.0


@dataclass(frozen=True, slots=True)
class JobTrigger:
    """The job trigger as installed."""

    channel: str  # the channel it notifies; '' when installed not to
    spread: bool  # each share of the jobs on a channel of its own (`reactor migrate --spread`)
    enabled: bool  # it fires for the app's sessions


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A queued job as ``poll_queue`` reads it."""

    job_id: str
    due_in: float  # seconds until since + grace (negative: past it)
    since: datetime


@dataclass(frozen=True, slots=True)
class Polled:
    """What one ``poll_queue`` read: the jobs coming due, where its window ended, and the
    doorbell as the statement left it."""

    jobs: list[QueuedJob]
    high: datetime  # the end of the window the jobs were read from
    bell_in: float | None  # seconds the channel's doorbell is still awake; None: silent
    arrivals: int  # jobs queued within the poll's recent seconds


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

    @classmethod
    def from_row(
        cls, *, found_ids: list[str], found_due_in: list[float], **columns: Any
    ) -> ReconcileStep:
        """The ``reconcile_step`` row, by column name; it sends the jobs it found as two arrays
        in step (their ids, and the seconds until each is due)."""
        return cls(found=list(zip(found_ids, found_due_in, strict=True)), **columns)


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
    # Which finish of the job this row runs for: 0 for its first, one more for each later
    # finish whose write queued the row again (a retried job).
    finish: int = 0
    superseded: bool = False
    # Not a lease either: the lease of the row's last attempt ran out (its replica died running
    # it), and the claim parked the row as failed.
    parked: bool = False

    @classmethod
    def from_row(cls, *, superseded: bool | None, **columns: Any) -> HookClaim:
        """The ``claim_hooks`` row, by column name; its ``superseded`` is NULL for a row the
        claim parked."""
        return cls(superseded=bool(superseded), parked=superseded is None, **columns)

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


@dataclass(frozen=True, slots=True)
class Verified:
    """What the verify_hints statement found: the notified jobs that are queued, with the
    seconds until each is due, and the replicas named that are live by their heartbeats."""

    jobs: list[tuple[str, float]]
    live: frozenset[str]
