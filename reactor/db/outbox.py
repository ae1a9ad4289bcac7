"""The hook outbox's queries: leasing rows to a replica's hooks, settling their attempts, and
what `reactor hooks` and the retention purge do to the rows (``triggers/queries.sql`` and
``triggers/hooks.sql``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg.rows import class_row, dict_row, kwargs_row, tuple_row

from reactor.db import rows
from reactor.db.named import NamedQueries


class HookQueries(NamedQueries):
    """The rows of the pair's hooks (:attr:`hooks`): claimed, settled, listed, re-queued,
    cancelled and purged."""

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


def _attempt(claim: rows.HookClaim, params: dict[str, Any]) -> dict[str, Any]:
    # The fencing token: only the holder of the claim's attempt may settle it, and a success
    # only for the finish the attempt ran for.
    return {"id": claim.id, "attempt": claim.attempt, "finish": claim.finish, **params}


def _listed(*, total: int, failed_total: int, **row: Any) -> tuple[rows.HookRow, int, int]:
    # Every row carries the totals of the whole list, whatever the limit.
    return rows.HookRow(**row), int(total), int(failed_total)
