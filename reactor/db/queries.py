"""The reactor's named queries (``triggers/*.sql``), each written once, as methods of one class.

A :class:`Database` is those queries bound to an install (whose statements they run), to a
connector (where they run) and to its pair's settings (see :class:`~.named.NamedQueries`). It
is made of a part per concern: the queue and its record statements, and the installation's
checks, here; the heartbeat (:mod:`.health`), the reconcile (:mod:`.reconcile`) and the hook
outbox (:mod:`.outbox`) in modules of their own. Rows are decoded by column name into the types
of :mod:`.rows`. River's driver interface is the model: callers get a Database passed in, and
nothing reads a global.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime

import psycopg
from psycopg.rows import class_row, dict_row

from reactor.core.ownership import replicas_channel
from reactor.core.payload import RANG
from reactor.db import rows
from reactor.db.health import HeartbeatQueries
from reactor.db.outbox import HookQueries
from reactor.db.pool import own_check
from reactor.db.reconcile import ReconcileQueries
from reactor.db.session import first_line
from reactor.errors import PrivilegeMissing, UntrustedSchema
from reactor.install import grants


class Database(HeartbeatQueries, ReconcileQueries, HookQueries):
    """The named queries of ``install``, run on ``on``, with its pair's ``settings`` and the
    names of its ``hooks`` (see :class:`~.named.NamedQueries`): every part's, and the queue's
    and the installation's here."""

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
