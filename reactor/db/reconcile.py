"""The reconcile's queries: the shared pass over the job table that re-queues what the queue
lost, walked a chunk at a time by whichever replica holds its lease (``triggers/queries.sql``,
the ``reconcile_*`` queries)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import anyio
from psycopg.rows import class_row, kwargs_row, tuple_row

from reactor.db import rows
from reactor.db.named import NamedQueries

# Jobs one reconcile step walks: small enough that a step stays well inside a few tens of
# milliseconds, large enough that a pass over millions of finished jobs takes seconds.
RECONCILE_CHUNK = 1000
# How long the replica that stepped a pass keeps it; another takes over once this runs out.
RECONCILE_LEASE_S = 30.0
# An interval that never comes due, for a one-off pass.
_NEVER_S = 365 * 86400.0


class ReconcileQueries(NamedQueries):
    """The reconcile pass: a step of it, a whole one, its release and its last totals."""

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
            "lease": RECONCILE_LEASE_S,
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
            taken = await self.reconcile_step(owner=owner, interval=_NEVER_S, force=force)
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
