"""The reactor's named queries (``triggers/*.sql``), each written once.

Every query is a function whose first argument says where it runs: a :class:`~.session.Pooled`
connector, a :class:`~.session.Dedicated` one, or a bare connection (taken as a dedicated one).
:class:`Database` is the replica's side of them: its pool, its grace and its hooks, bound once.
Rows are decoded by column name into the types of :mod:`.rows`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import anyio
import psycopg
from psycopg.rows import class_row, dict_row, kwargs_row, tuple_row
from psycopg_pool import AsyncConnectionPool

from reactor import grants, sql
from reactor.db.rows import (
    Health,
    HookChange,
    HookClaim,
    HookRow,
    JobOutcome,
    QueuedJob,
    ReconcilePass,
    ReconcileStep,
)
from reactor.db.session import (
    AnyConnection,
    Connector,
    Dedicated,
    Pooled,
    Target,
    connector,
    first_line,
)
from reactor.errors import PrivilegeMissing

# Documents one scan statement writes at most: 500 reports of several MB each would otherwise
# pass the statement timeout together and fail the whole batch.
BATCH_BYTES = 64 * 1024 * 1024

# Jobs one reconcile step walks: small enough that a step stays well inside a few tens of
# milliseconds, large enough that a pass over millions of finished jobs takes seconds.
RECONCILE_CHUNK = 1000
# How long the replica that stepped a pass keeps it; another takes over once this runs out.
RECONCILE_LEASE = 30.0
# An interval that never comes due, for a one-off pass.
_NEVER = 365 * 86400.0
# The hook outbox's retention job runs on one replica at a time; a constant of ours.
PURGE_LOCK = 0x7265_6170  # "reap"


# -- the queue and the record statements ---------------------------------------------------------


async def record_jobs(
    on: Target,
    job_ids: Sequence[str],
    *,
    grace: float,
    hooks: Sequence[str] = (),
    lock_timeout: float | None = None,
) -> list[JobOutcome]:
    """Record the given jobs that are due; report on each of them that still needs a run.

    Every run written gets one outbox row per name in ``hooks``, in the same statement.
    ``lock_timeout`` (seconds) replaces the usual bound on waiting for another transaction's row
    lock; past it the statement fails with LockNotAvailable.
    """
    return await connector(on).fetch(
        sql.query("record_jobs"),
        {"grace": grace, "hooks": list(hooks), "ids": list(job_ids)},
        class_row(JobOutcome),
        lock_timeout=lock_timeout,
    )


async def record_oldest(
    on: Target,
    limit: int,
    *,
    grace: float,
    hooks: Sequence[str] = (),
    max_bytes: int = BATCH_BYTES,
    only: Sequence[str] | None = None,
    skip: Sequence[str] = (),
    lock_timeout: float | None = None,
) -> list[JobOutcome]:
    """Settle up to ``limit`` queued jobs past their grace, oldest first; report on each.

    ``only`` restricts the statement to those queued jobs, ``skip`` leaves those out; at most
    ``max_bytes`` of documents are written, the rest come back ``deferred``.
    """
    return await connector(on).fetch(
        sql.query("record_oldest"),
        {
            "grace": grace,
            "hooks": list(hooks),
            "limit": limit,
            "only": None if only is None else list(only),
            "skip": list(skip),
            "max_bytes": max_bytes,
        },
        class_row(JobOutcome),
        lock_timeout=lock_timeout,
    )


async def oldest_queued(
    on: Target, limit: int, *, grace: float, skip: Sequence[str] = ()
) -> list[str]:
    """The ids :func:`record_oldest` would take next, oldest first, without locking them."""
    rows = await connector(on).fetch(
        sql.query("oldest_queued"),
        {"grace": grace, "limit": limit, "skip": list(skip)},
        dict_row,
    )
    return [row["job_id"] for row in rows]


async def set_aside(
    on: Target, job_id: str, error: psycopg.Error, *, first_retry: float, max_retry: float
) -> tuple[int, float]:
    """Set ``job_id`` aside after its write failed with ``error`` on its own data; return how
    many times in a row it failed on the same data, and the seconds until its next try."""
    rows = await connector(on).fetch(
        sql.query("set_aside"),
        {
            "job": job_id,
            "error": first_line(error),
            "sqlstate": error.sqlstate,
            "first_retry": first_retry,
            "max_retry": max_retry,
        },
        dict_row,
    )
    return rows[0]["failures"], rows[0]["retry_in"]


async def release_set_aside(on: Target) -> int:
    """Try every job set aside again at once; how many there were."""
    rows = await connector(on).fetch(sql.query("release_set_aside"), {}, dict_row)
    return int(rows[0]["released"])


async def release_set_aside_job(on: Target, job_id: str) -> bool:
    """Try one job set aside again at once; False when it was not set aside."""
    rows = await connector(on).fetch(
        sql.query("release_set_aside_job", "dashboard.sql"), {"job": job_id}, dict_row
    )
    return bool(rows)


async def upcoming(on: Target, limit: int, *, grace: float) -> list[tuple[str, float]]:
    """(job id, seconds until due) for jobs that need a run and are inside their grace."""
    rows = await connector(on).fetch(
        sql.query("upcoming"), {"grace": grace, "limit": limit}, dict_row
    )
    return [(row["job_id"], row["due_in"]) for row in rows]


async def poll_queue(
    on: Target, low: datetime | None, *, grace: float, ahead: float, limit: int
) -> tuple[list[QueuedJob], datetime]:
    """Queued jobs whose deadline comes within ``ahead`` seconds, from ``low`` on (see the
    ``poll_queue`` query), and the end of the window they were read from."""
    rows = await connector(on).fetch(
        sql.query("poll_queue"),
        {"grace": grace, "low": low, "ahead": ahead, "limit": limit},
        kwargs_row(_in_window),
    )
    return [job for job, _ in rows if job is not None], rows[0][1]


def _in_window(*, high: datetime, **job: Any) -> tuple[QueuedJob | None, datetime]:
    # Every row carries the window's end; an empty window is one row whose job_id is NULL.
    return (QueuedJob(**job) if job["job_id"] else None), high


# -- the reconcile -------------------------------------------------------------------------------


async def reconcile_step(
    on: Target,
    *,
    owner: str,
    interval: float,
    grace: float,
    force: bool = False,
    limit: int = RECONCILE_CHUNK,
) -> ReconcileStep:
    """Walk the next chunk of the shared reconcile pass, if it is ``owner``'s to walk: see the
    ``reconcile_step`` query."""
    params = {
        "owner": owner,
        "interval": interval,
        "grace": grace,
        "force": force,
        "limit": limit,
        "lease": RECONCILE_LEASE,
    }
    rows = await connector(on).fetch(
        sql.query("reconcile_step"), params, kwargs_row(ReconcileStep.from_row)
    )
    return rows[0]


async def reconcile_pass(
    on: Target,
    *,
    owner: str,
    grace: float = 0.0,
    on_progress: Callable[[int], None] | None = None,
) -> ReconcilePass:
    """Run a fresh full pass to its end (`reactor migrate`, `reactor sweep --once`); its totals.

    The pass starts at once, taking over from any replica. A replica mid-step makes this wait its
    turn; replicas may walk chunks of the same pass meanwhile, which only ends it sooner.
    ``on_progress`` hears the number of jobs walked so far.
    """
    owner = f"{owner}-{uuid.uuid4().hex[:8]}"
    force = True
    walked = 0
    while True:
        taken = await reconcile_step(on, owner=owner, interval=_NEVER, grace=grace, force=force)
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
            return await last_reconcile_pass(on)


async def reconcile_release(on: Target, owner: str) -> None:
    """Let another replica take over the pass ``owner`` holds, at once."""
    await connector(on).fetch(sql.query("reconcile_release"), {"owner": owner}, tuple_row)


async def last_reconcile_pass(on: Target) -> ReconcilePass:
    """The last completed reconcile pass and whether one is running."""
    [found] = await connector(on).fetch(
        sql.query("reconcile_last_pass"), {}, class_row(ReconcilePass)
    )
    return found


# -- health and replicas -------------------------------------------------------------------------


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


async def health(
    on: Target,
    check: HealthCheck,
    *,
    grace: float,
    probe: str | None = None,
    own_session: bool = False,
) -> Health:
    """The replica's periodic check, and its heartbeat; see the ``health`` query.

    ``probe``: a payload to notify on ``check.channel`` in the same round trip. ``own_session``
    when ``on`` is the replica's LISTEN connection, a session of its own: the heartbeat names it.
    """
    rows = await connector(on).fetch(
        sql.query("health"),
        health_params(grace, check, probe, own_session=own_session),
        class_row(Health),
    )
    return rows[0]


async def leave(on: Target, replica: str, channel: str) -> None:
    """Drop ``replica``'s heartbeat and tell the replicas listening on ``channel``: they take its
    jobs over at once (the others at their next check)."""
    await connector(on).fetch(
        sql.query("replica_leave"), {"replica": replica, "channel": channel}, tuple_row
    )


async def notify(on: Target, channel: str, payload: str) -> None:
    """Send one notification."""
    await connector(on).fetch("SELECT pg_notify(%s, %s)", (channel, payload), tuple_row)


# -- the hook outbox -----------------------------------------------------------------------------


async def claim_hooks(
    on: Target,
    limit: int,
    lease: float,
    *,
    hooks: Sequence[str],
    max_attempts: int | None = None,
) -> list[HookClaim]:
    """Lease up to ``limit`` runnable hook rows of ``hooks``, oldest first; park a row whose
    lease ran out on attempt ``max_attempts`` of its schedule (None: never)."""
    params = {"hooks": list(hooks), "limit": limit, "lease": lease, "max_attempts": max_attempts}
    return await connector(on).fetch(
        sql.query("claim_hooks"), params, kwargs_row(HookClaim.from_row)
    )


async def next_hook_in(on: Target, *, hooks: Sequence[str]) -> float | None:
    """Seconds until a hook row of ``hooks`` becomes claimable; None when none is queued."""
    rows = await connector(on).fetch(sql.query("next_hook_in"), {"hooks": list(hooks)}, dict_row)
    return None if not rows or rows[0]["next_in"] is None else float(rows[0]["next_in"])


async def finish_hook(
    on: Target, claim: HookClaim, status: str, *, error: str | None = None, delay: float = 0.0
) -> None:
    """Settle an attempt: ``done``, ``pending`` (retry after ``delay``) or ``failed``."""
    params = {"status": status, "error": error, "delay": delay}
    await connector(on).fetch(sql.query("finish_hook"), _attempt(claim, params), tuple_row)


async def release_hook(on: Target, claim: HookClaim) -> None:
    """Give an interrupted attempt back for another replica to take at once."""
    await connector(on).fetch(sql.query("release_hook"), _attempt(claim, {}), tuple_row)


def _attempt(claim: HookClaim, params: dict[str, Any]) -> dict[str, Any]:
    # The fencing token: only the holder of the claim's attempt may settle it.
    return {"id": claim.id, "attempt": claim.attempt, **params}


async def purge_hooks(on: Target, retention: float, batch: int) -> int | None:
    """Delete up to ``batch`` settled hook rows older than ``retention`` seconds.

    Returns how many were deleted, or None when another replica's purge holds the turn.
    """
    [row] = await connector(on).fetch(
        sql.query("purge_hooks", "hooks.sql"),
        {"lock": PURGE_LOCK, "retention": retention, "batch": batch},
        dict_row,
    )
    return int(row["deleted"]) if row["ours"] else None


async def list_hooks(
    on: Target, *, failed_only: bool, limit: int
) -> tuple[list[HookRow], int, int]:
    """Unsettled hook rows (or the parked ones only), oldest first, at most ``limit``; and how
    many there are in all, and of them failed."""
    rows = await connector(on).fetch(
        sql.query("list_hooks", "hooks.sql"),
        {"failed_only": failed_only, "limit": limit},
        kwargs_row(_listed),
    )
    total, failed = (rows[0][1], rows[0][2]) if rows else (0, 0)
    return [row for row, _, _ in rows], total, failed


def _listed(*, total: int, failed_total: int, **row: Any) -> tuple[HookRow, int, int]:
    # Every row carries the totals of the whole list, whatever the limit.
    return HookRow(**row), int(total), int(failed_total)


async def retry_hooks(on: Target, ids: Sequence[int]) -> list[HookChange]:
    """Re-queue the given parked hook rows, all or none; one HookChange per id."""
    return await connector(on).fetch(
        sql.query("retry_hooks", "hooks.sql"), {"ids": sorted(set(ids))}, class_row(HookChange)
    )


async def retry_failed(on: Target) -> list[int]:
    """Re-queue every failed hook row; returns their ids."""
    rows = await connector(on).fetch(sql.query("retry_failed", "hooks.sql"), {}, dict_row)
    return sorted(row["id"] for row in rows)


async def cancel_hooks(on: Target, ids: Sequence[int]) -> list[HookChange]:
    """Cancel the given pending or failed hook rows, all or none; one HookChange per id."""
    return await connector(on).fetch(
        sql.query("cancel_hooks", "hooks.sql"), {"ids": sorted(set(ids))}, class_row(HookChange)
    )


# -- the installation ----------------------------------------------------------------------------


async def job_trigger(on: Target) -> tuple[str, bool] | None:
    """(channel, enabled) of the job trigger as installed (channel '': it does not notify);
    None when there is none."""
    rows = await connector(on).fetch(sql.query("job_trigger"), {}, dict_row)
    return (rows[0]["channel"], rows[0]["enabled"]) if rows else None


async def require_privileges(on: Target) -> None:
    """Raise PrivilegeMissing naming every grant of :data:`grants.REQUIRED` the role lacks."""
    rows = await connector(on).fetch(
        sql.query("missing_privileges", "status.sql"), grants.check_params(), dict_row
    )
    if rows:
        role = rows[0]["role"]
        missing = "; ".join(f"{row['grant_sql']} TO {role}" for row in rows)
        raise PrivilegeMissing(
            f"the role lacks a privilege: {missing}; "
            f"`reactor migrate --print-grants {role}` prints every grant it needs"
        )


async def fetch_dicts(on: Target, query: str, params: Any = None) -> list[dict[str, Any]]:
    """Rows as dicts, for status and reporting."""
    return await connector(on).fetch(query, params, dict_row)


# -- the replica's side --------------------------------------------------------------------------


class Database:
    """The named queries as one replica runs them: through its pool, each as one pinned
    transaction on a pooled connection, with its grace and its hooks. Each method runs the
    query function of the same name above; ``conn``, where a method takes it, runs it on that
    connection instead (the LISTEN connection, a session of our own).

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

    def _on(self, conn: AnyConnection | None = None) -> Connector:
        return Pooled(self.pool) if conn is None else Dedicated(conn)

    async def record_jobs(
        self, job_ids: Sequence[str], *, lock_timeout: float | None = None
    ) -> list[JobOutcome]:
        """See :func:`record_jobs`."""
        return await record_jobs(
            self._on(), job_ids, grace=self.grace, hooks=self.hooks, lock_timeout=lock_timeout
        )

    async def record_oldest(
        self,
        limit: int,
        *,
        only: Sequence[str] | None = None,
        skip: Sequence[str] = (),
        lock_timeout: float | None = None,
    ) -> list[JobOutcome]:
        """See :func:`record_oldest`; at most :attr:`batch_bytes` of documents are written."""
        return await record_oldest(
            self._on(),
            limit,
            grace=self.grace,
            hooks=self.hooks,
            max_bytes=self.batch_bytes,
            only=only,
            skip=skip,
            lock_timeout=lock_timeout,
        )

    async def oldest_queued(self, limit: int, *, skip: Sequence[str] = ()) -> list[str]:
        """The ids :meth:`record_oldest` would take next, oldest first, without locking them."""
        return await oldest_queued(self._on(), limit, grace=self.grace, skip=skip)

    async def set_aside(
        self, job_id: str, error: psycopg.Error, *, first_retry: float, max_retry: float
    ) -> tuple[int, float]:
        """See :func:`set_aside`."""
        return await set_aside(
            self._on(), job_id, error, first_retry=first_retry, max_retry=max_retry
        )

    async def release_set_aside(self) -> int:
        """Try every job set aside again at once; how many there were."""
        return await release_set_aside(self._on())

    async def upcoming(self, limit: int) -> list[tuple[str, float]]:
        """(job id, seconds until due) for jobs that need a run and are inside their grace."""
        return await upcoming(self._on(), limit, grace=self.grace)

    async def reconcile_step(
        self, *, owner: str, interval: float, force: bool = False
    ) -> ReconcileStep:
        """Walk the next chunk of the reconcile pass, if it is ours to walk (see the query)."""
        return await reconcile_step(
            self._on(), owner=owner, interval=interval, grace=self.grace, force=force
        )

    async def reconcile_pass(
        self, owner: str, on_progress: Callable[[int], None] | None = None
    ) -> ReconcilePass:
        """Run a fresh full pass to its end (`reactor sweep --once`); its totals."""
        return await reconcile_pass(
            self._on(), owner=owner, grace=self.grace, on_progress=on_progress
        )

    async def reconcile_release(self, owner: str) -> None:
        """Let another replica take over the pass ``owner`` holds, at once."""
        await reconcile_release(self._on(), owner)

    async def health(
        self,
        check: HealthCheck,
        *,
        probe: str | None = None,
        conn: AnyConnection | None = None,
    ) -> Health:
        """The replica's periodic check, and its heartbeat; see :func:`health`.

        On ``conn`` (the LISTEN connection, a session of our own) when given, else pooled.
        ``probe``: a payload to notify on ``check.channel`` in the same round trip.
        """
        return await health(
            self._on(conn), check, grace=self.grace, probe=probe, own_session=conn is not None
        )

    async def poll_queue(
        self,
        low: datetime | None,
        *,
        ahead: float,
        limit: int,
        conn: AnyConnection | None = None,
    ) -> tuple[list[QueuedJob], datetime]:
        """See :func:`poll_queue`. On ``conn`` (the LISTEN connection, a session of our own)
        when given, else pooled."""
        return await poll_queue(self._on(conn), low, grace=self.grace, ahead=ahead, limit=limit)

    async def leave(self, replica: str, channel: str) -> None:
        """Drop ``replica``'s heartbeat and tell the replicas listening on ``channel``: they take
        its jobs over at once (the others at their next check)."""
        await leave(self._on(), replica, channel)

    async def notify(self, channel: str, payload: str) -> None:
        """Send one notification from a pool connection."""
        await notify(self._on(), channel, payload)

    async def claim_hooks(
        self, limit: int, lease: float, *, max_attempts: int | None = None
    ) -> list[HookClaim]:
        """Lease up to ``limit`` runnable hook rows of our hooks, oldest first; park a row whose
        lease ran out on attempt ``max_attempts`` of its schedule (None: never)."""
        return await claim_hooks(
            self._on(), limit, lease, hooks=self.hooks, max_attempts=max_attempts
        )

    async def next_hook_in(self) -> float | None:
        """Seconds until one of our hook rows becomes claimable; None when none is queued."""
        return await next_hook_in(self._on(), hooks=self.hooks)

    async def finish_hook(
        self, claim: HookClaim, status: str, *, error: str | None = None, delay: float = 0.0
    ) -> None:
        """Settle an attempt: ``done``, ``pending`` (retry after ``delay``) or ``failed``."""
        await finish_hook(self._on(), claim, status, error=error, delay=delay)

    async def release_hook(self, claim: HookClaim) -> None:
        """Give an interrupted attempt back for another replica to take at once."""
        await release_hook(self._on(), claim)

    async def purge_hooks(self, retention: float, batch: int) -> int | None:
        """See :func:`purge_hooks`."""
        return await purge_hooks(self._on(), retention, batch)
