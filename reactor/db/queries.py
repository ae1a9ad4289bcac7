"""The reactor's named queries (``triggers/*.sql``), each written once, as methods of one class.

A :class:`Database` is those queries bound to an install (whose statements they run) and to a
connector (where they run): a replica's pool (:class:`~.calls.Pooled`), or a connection of
its own (:class:`~.calls.Dedicated`: the LISTEN connection, a command's). It also carries what
the replica's statements need besides: the grace and the names of the configured hooks. Rows
are decoded by column name into the types of :mod:`.rows`. River's driver interface is the
model: callers get a Database passed in, and nothing reads a global.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypeVar

import anyio
import psycopg
from psycopg.rows import AsyncRowFactory, class_row, dict_row, kwargs_row, tuple_row
from psycopg_pool import AsyncConnectionPool

from reactor.core.ownership import replicas_channel
from reactor.core.payload import RANG
from reactor.db import rows
from reactor.db.calls import Connector, Dedicated, Pooled
from reactor.db.health import HealthCheck, health_params
from reactor.db.pool import own_check
from reactor.db.session import AnyConnection, first_line
from reactor.errors import PrivilegeMissing, UntrustedSchema
from reactor.install import Install, grants

R = TypeVar("R")

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


@dataclass(frozen=True)
class Database:
    """The named queries of ``install``, run on ``on``.

    ``grace`` and ``hooks`` are the replica's: every run written gets one outbox row per name in
    ``hooks``, in the same statement. ``batch_bytes`` caps the documents one scan statement
    writes (the first job is always taken, however large).
    """

    install: Install
    on: Connector = field(repr=False)
    grace: float = 0.0
    hooks: tuple[str, ...] = ()
    batch_bytes: int = BATCH_BYTES

    @classmethod
    def pooled(
        cls,
        install: Install,
        pool: AsyncConnectionPool[AnyConnection],
        *,
        grace: float = 0.0,
        hooks: Sequence[str] = (),
        share: anyio.CapacityLimiter | None = None,
    ) -> Database:
        """The queries through ``pool``, each as :func:`~.calls.call` runs it; ``share``
        caps the connections they hold at once (see :class:`~.calls.Pooled`)."""
        return cls(install, Pooled(pool, share=share), grace, tuple(hooks))

    @classmethod
    def dedicated(cls, install: Install, conn: AnyConnection, *, grace: float = 0.0) -> Database:
        """The queries on ``conn``, a connection of the caller's own."""
        return cls(install, Dedicated(conn), grace)

    def using(self, conn: AnyConnection) -> Database:
        """These queries on ``conn`` instead (the LISTEN connection, a session of our own)."""
        return replace(self, on=Dedicated(conn))

    @property
    def pool(self) -> AsyncConnectionPool[AnyConnection]:
        """The pool these queries run through (a connector that wraps a pooled one, such as a
        benchmark's counter, names it too)."""
        pool = getattr(self.on, "pool", None)
        if not isinstance(pool, AsyncConnectionPool):
            raise TypeError("this Database runs on a connection of its own, not a pool")
        return pool

    async def run(
        self,
        name: str,
        params: Any,
        row_factory: AsyncRowFactory[R],
        *,
        filename: str = "queries.sql",
        lock_timeout: float | None = None,
    ) -> list[R]:
        """Run the named query of ``triggers/<filename>``; its rows, made by ``row_factory``.
        Every query of this class goes through here (a benchmark counting them wraps it)."""
        query = self.install.query(name, filename)
        return await self.on.fetch(query, params, row_factory, lock_timeout=lock_timeout)

    # -- the queue and the record statements -----------------------------------------------------

    async def record_jobs(
        self, job_ids: Sequence[str], *, lock_timeout: float | None = None
    ) -> list[rows.JobOutcome]:
        """Record the given jobs that are due; report on each of them that still needs a run.

        Every run written gets its hook rows in the same statement. ``lock_timeout`` (seconds)
        replaces the usual bound on waiting for another transaction's row lock; past it the
        statement fails with LockNotAvailable.
        """
        params = {"grace": self.grace, "hooks": list(self.hooks), "ids": list(job_ids)}
        return await self.run(
            "record_jobs", params, class_row(rows.JobOutcome), lock_timeout=lock_timeout
        )

    async def record_oldest(
        self,
        limit: int,
        *,
        only: Sequence[str] | None = None,
        skip: Sequence[str] = (),
        lock_timeout: float | None = None,
    ) -> list[rows.JobOutcome]:
        """Settle up to ``limit`` queued jobs past their grace, oldest first; report on each.

        ``only`` restricts the statement to those queued jobs, ``skip`` leaves those out; at
        most :attr:`batch_bytes` of documents are written, the rest come back ``deferred``.
        """
        params = {
            "grace": self.grace,
            "hooks": list(self.hooks),
            "limit": limit,
            "only": None if only is None else list(only),
            "skip": list(skip),
            "max_bytes": self.batch_bytes,
        }
        return await self.run(
            "record_oldest", params, class_row(rows.JobOutcome), lock_timeout=lock_timeout
        )

    async def oldest_queued(self, limit: int, *, skip: Sequence[str] = ()) -> list[str]:
        """The ids :meth:`record_oldest` would take next, oldest first, without locking them."""
        params = {"grace": self.grace, "limit": limit, "skip": list(skip)}
        found = await self.run("oldest_queued", params, dict_row)
        return [row["job_id"] for row in found]

    async def set_aside(
        self, job_id: str, error: psycopg.Error, *, first_retry: float, max_retry: float
    ) -> tuple[int, float]:
        """Set ``job_id`` aside after its write failed with ``error`` on its own data; return
        how many times in a row it failed on the same data, and the seconds until its next
        try."""
        params = {
            "job": job_id,
            "error": first_line(error),
            "sqlstate": error.sqlstate,
            "first_retry": first_retry,
            "max_retry": max_retry,
        }
        found = await self.run("set_aside", params, dict_row)
        return found[0]["failures"], found[0]["retry_in"]

    async def release_set_aside(self) -> int:
        """Try every job set aside again at once; how many there were."""
        found = await self.run("release_set_aside", {}, dict_row)
        return int(found[0]["released"])

    async def release_set_aside_job(self, job_id: str) -> bool:
        """Try one job set aside again at once; False when it was not set aside."""
        found = await self.run(
            "release_set_aside_job", {"job": job_id}, dict_row, filename="dashboard.sql"
        )
        return bool(found)

    async def upcoming(self, limit: int) -> list[tuple[str, float]]:
        """(job id, seconds until due) for jobs that need a run and are inside their grace."""
        found = await self.run("upcoming", {"grace": self.grace, "limit": limit}, dict_row)
        return [(row["job_id"], row["due_in"]) for row in found]

    async def verify_hints(
        self, job_ids: Sequence[str], replicas: Sequence[str], *, liveness: float
    ) -> rows.Verified:
        """Of ``job_ids``, those queued with the seconds until each is due; of ``replicas``,
        those whose heartbeat is within ``liveness`` seconds (see the ``verify_hints`` query)."""
        params = {
            "grace": self.grace,
            "jobs": list(job_ids),
            "replicas": list(replicas),
            "liveness": liveness,
        }
        # Its own check of the connection, as the health check is: it reads only, is safe to
        # run twice, and its caller bounds it (a hung one costs a re-read of the queue, not a
        # hint). Under a stream of notifications it runs every few milliseconds, where the
        # pool's check would add a round trip to each.
        found = await own_check(lambda: self.run("verify_hints", params, dict_row))
        jobs = [(row["id"], row["due_in"]) for row in found if row["kind"] == "job"]
        live = frozenset(row["id"] for row in found if row["kind"] == "replica")
        return rows.Verified(jobs, live)

    async def poll_queue(
        self,
        low: datetime | None,
        *,
        ahead: float,
        limit: int,
        ring: bool = False,
        lease: float = 0.0,
        recent: float = 0.0,
        shares: Collection[int] | None = None,
    ) -> rows.Polled:
        """Queued jobs whose deadline comes within ``ahead`` seconds, from ``low`` on, of
        ``shares`` (None: every share), with the end of the window they were read from; with
        ``ring``, the doorbell kept awake ``lease`` seconds; the jobs queued in the last
        ``recent`` seconds counted (see the ``poll_queue`` query)."""
        params = {
            "grace": self.grace,
            "low": low,
            "ahead": ahead,
            "limit": limit,
            "channel": self.install.channel,
            "replicas_channel": replicas_channel(self.install.schema, self.install.channel),
            "ring": ring,
            "rang": f"{RANG}{self.install.channel}",
            "lease": lease,
            "recent": recent,
            "shares": None if shares is None else sorted(shares),
        }
        found = await self.run("poll_queue", params, dict_row)
        # Every row carries the window's end and the bell; an empty window is one row whose
        # job_id is NULL.
        first = found[0]
        jobs = [
            rows.QueuedJob(row["job_id"], row["due_in"], row["since"])
            for row in found
            if row["job_id"] is not None
        ]
        return rows.Polled(jobs, first["high"], first["bell_in"], first["arrivals"])

    # -- the reconcile ---------------------------------------------------------------------------

    async def reconcile_step(
        self, *, owner: str, interval: float, force: bool = False, limit: int = RECONCILE_CHUNK
    ) -> rows.ReconcileStep:
        """Walk the next chunk of the shared reconcile pass, if it is ``owner``'s to walk: see
        the ``reconcile_step`` query."""
        params = {
            "owner": owner,
            "interval": interval,
            "grace": self.grace,
            "force": force,
            "limit": limit,
            "lease": RECONCILE_LEASE,
        }
        found = await self.run("reconcile_step", params, kwargs_row(rows.ReconcileStep.from_row))
        return found[0]

    async def reconcile_pass(
        self, owner: str, *, on_progress: Callable[[int], None] | None = None
    ) -> rows.ReconcilePass:
        """Run a fresh full pass to its end (`reactor migrate`, `reactor sweep --once`); its
        totals.

        The pass starts at once, taking over from any replica. A replica mid-step makes this
        wait its turn; replicas may walk chunks of the same pass meanwhile, which only ends it
        sooner. ``on_progress`` hears the number of jobs walked so far.
        """
        owner = f"{owner}-{uuid.uuid4().hex[:8]}"
        force = True
        walked = 0
        while True:
            taken = await self.reconcile_step(owner=owner, interval=_NEVER, force=force)
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
                return await self.last_reconcile_pass()

    async def reconcile_release(self, owner: str) -> None:
        """Let another replica take over the pass ``owner`` holds, at once."""
        await self.run("reconcile_release", {"owner": owner}, tuple_row)

    async def last_reconcile_pass(self) -> rows.ReconcilePass:
        """The last completed reconcile pass and whether one is running."""
        [found] = await self.run("reconcile_last_pass", {}, class_row(rows.ReconcilePass))
        return found

    # -- health and replicas ---------------------------------------------------------------------

    async def health(
        self,
        check: HealthCheck,
        *,
        probe: str | None = None,
        own_session: bool = False,
        session_pid: int | None = None,
        holding: bool = True,
        write_error: str | None = None,
    ) -> rows.Health:
        """The replica's periodic check, and its heartbeat; see the ``health`` query.

        ``probe``: a payload to notify on the install's channel in the same round trip.
        ``own_session`` when this runs on the replica's LISTEN connection, a session of its
        own: the heartbeat names it, as it names ``session_pid`` (the replica's proven LISTEN
        session) from the pool. ``holding`` False: the replica has not read its share yet,
        and writes no heartbeat, so nobody counts it as an owner. ``write_error``: what its
        record statements fail with while they cannot write, for `reactor status`.
        """
        params = health_params(
            self.install,
            self.grace,
            check,
            probe,
            own_session=own_session,
            holding=holding,
            write_error=write_error,
            session_pid=session_pid,
        )
        return (await self.run("health", params, class_row(rows.Health)))[0]

    async def leave(self, replica: str) -> None:
        """Drop ``replica``'s heartbeat and tell the replicas listening on the channel: they
        take its jobs over at once (the others at their next check)."""
        install = self.install
        params = {"replica": replica, "channel": replicas_channel(install.schema, install.channel)}
        await self.run("replica_leave", params, tuple_row)

    async def notify(self, payload: str, channel: str | None = None) -> None:
        """Send one notification, on the install's channel unless ``channel`` is given."""
        await self.on.fetch(
            "SELECT pg_notify(%s, %s)", (channel or self.install.channel, payload), tuple_row
        )

    # -- the hook outbox -------------------------------------------------------------------------

    async def claim_hooks(
        self,
        limit: int,
        lease: float,
        *,
        replica: str | None = None,
        max_attempts: int | None = None,
    ) -> list[rows.HookClaim]:
        """Lease up to ``limit`` runnable rows of our hooks to ``replica``, oldest first (the
        others take them back when they see it die); park a row whose lease ran out on attempt
        ``max_attempts`` of its schedule (None: never)."""
        params = {
            "hooks": list(self.hooks),
            "limit": limit,
            "lease": lease,
            "replica": replica,
            "max_attempts": max_attempts,
        }
        return await self.run("claim_hooks", params, kwargs_row(rows.HookClaim.from_row))

    async def next_hook_in(self) -> float | None:
        """Seconds until one of our hook rows becomes claimable; None when none is queued."""
        found = await self.run("next_hook_in", {"hooks": list(self.hooks)}, dict_row)
        return None if not found or found[0]["next_in"] is None else float(found[0]["next_in"])

    async def finish_hook(
        self, claim: rows.HookClaim, status: str, *, error: str | None = None, delay: float = 0.0
    ) -> None:
        """Settle an attempt: ``done``, ``pending`` (retry after ``delay``) or ``failed``."""
        params = {"status": status, "error": error, "delay": delay}
        await self.run("finish_hook", _attempt(claim, params), tuple_row)

    async def release_hook(self, claim: rows.HookClaim) -> None:
        """Give an interrupted attempt back for another replica to take at once."""
        await self.run("release_hook", _attempt(claim, {}), tuple_row)

    async def purge_hooks(self, retention: float, batch: int) -> int:
        """Delete up to ``batch`` settled hook rows older than ``retention`` seconds, none that
        another replica's purge holds; how many were deleted."""
        params = {"retention": retention, "batch": batch}
        [row] = await self.run("purge_hooks", params, dict_row, filename="hooks.sql")
        return int(row["deleted"])

    async def list_hooks(
        self, *, failed_only: bool, limit: int
    ) -> tuple[list[rows.HookRow], int, int]:
        """Unsettled hook rows (or the parked ones only), oldest first, at most ``limit``; and
        how many there are in all, and of them failed."""
        params = {"failed_only": failed_only, "limit": limit}
        found = await self.run("list_hooks", params, kwargs_row(_listed), filename="hooks.sql")
        total, failed = (found[0][1], found[0][2]) if found else (0, 0)
        return [row for row, _, _ in found], total, failed

    async def retry_hooks(self, ids: Sequence[int]) -> list[rows.HookChange]:
        """Re-queue the given parked hook rows, all or none; one HookChange per id."""
        params = {"ids": sorted(set(ids))}
        return await self.run(
            "retry_hooks", params, class_row(rows.HookChange), filename="hooks.sql"
        )

    async def retry_failed(self) -> list[int]:
        """Re-queue every failed hook row; returns their ids."""
        found = await self.run("retry_failed", {}, dict_row, filename="hooks.sql")
        return sorted(row["id"] for row in found)

    async def cancel_hooks(self, ids: Sequence[int]) -> list[rows.HookChange]:
        """Cancel the given pending or failed hook rows, all or none; one HookChange per id."""
        params = {"ids": sorted(set(ids))}
        return await self.run(
            "cancel_hooks", params, class_row(rows.HookChange), filename="hooks.sql"
        )

    # -- the installation ------------------------------------------------------------------------

    async def job_trigger(self) -> rows.JobTrigger | None:
        """The job trigger as installed; None when there is none."""
        found = await self.run("job_trigger", {}, class_row(rows.JobTrigger))
        return found[0] if found else None

    async def require_privileges(self) -> None:
        """Raise PrivilegeMissing naming every grant of :func:`grants.required` the role
        lacks."""
        params = grants.check_params(self.install.mapping)
        found = await self.run("missing_privileges", params, dict_row, filename="status.sql")
        if found:
            role = found[0]["role"]
            missing = "; ".join(f"{row['grant_sql']} TO {role}" for row in found)
            raise PrivilegeMissing(
                f"the role lacks a privilege: {missing}; "
                f"`reactor migrate --print-grants {role}` prints every grant it needs"
            )

    async def untrusted(self) -> list[str]:
        """What the reactor's schema holds, or allows, that its owner did not make: one
        sentence each (see ``triggers/trust.sql``); empty when it is the reactor's alone."""
        found = await self.run("untrusted", {}, dict_row, filename="trust.sql")
        return [row["problem"] for row in found]

    async def require_trusted(self) -> None:
        """Raise UntrustedSchema naming the first of :meth:`untrusted`'s problems."""
        problems = await self.untrusted()
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise UntrustedSchema(
                f"{problems[0]}{more}; the reactor's definer functions would run it with the "
                "owner's rights, so nothing runs until it is gone: drop what the reactor did not "
                "make (or, if the owner made it, ALTER ... OWNER TO the owner) and try again; "
                "`reactor status` lists every problem"
            )

    async def fetch_dicts(
        self, name: str, params: Any = None, *, filename: str = "queries.sql"
    ) -> list[dict[str, Any]]:
        """The rows of the named query as dicts, for status and reporting."""
        return await self.run(name, params, dict_row, filename=filename)


def _attempt(claim: rows.HookClaim, params: dict[str, Any]) -> dict[str, Any]:
    # The fencing token: only the holder of the claim's attempt may settle it, and a success
    # only for the finish the attempt ran for.
    return {"id": claim.id, "attempt": claim.attempt, "finish": claim.finish, **params}


def _listed(*, total: int, failed_total: int, **row: Any) -> tuple[rows.HookRow, int, int]:
    # Every row carries the totals of the whole list, whatever the limit.
    return rows.HookRow(**row), int(total), int(failed_total)
