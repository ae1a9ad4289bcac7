"""``reactor hooks list/retry/cancel``: the operator's view of the hook outbox, and its hands.

The statements are in ``triggers/hooks.sql`` and run through :mod:`reactor.db`; this module
judges what they returned and shows it. :func:`judge_changes` turns the per-id result of a
retry or a cancel into a message, or into a :class:`UsageError` (exit 2) naming the ids that
do not exist or are in the wrong state; both statements are all or nothing, so then nothing
changed.

``reactor hooks list --json`` prints a stable shape (keys are only ever added; times are ISO 8601
from the database clock)::

    {
      "total": 3,            # rows that match; at most --limit of them are listed
      "failed": 1,           # of which parked as failed: the command exits 1 when > 0
      "hooks": [
        {"id": 42, "hook": "judge", "status": "failed",   # pending, running or failed
         "attempts": 40, "run_id": "...", "job_id": "...",
         "last_error": "HTTP 503 from https://judge.internal/hook",   # or null
         "next_attempt_at": "...",  # pending: when it is due; running: when its lease ends;
                                    # failed: null
         "created_at": "...", "updated_at": "..."}
      ]
    }
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from reactor import shown
from reactor.db import Database, HookChange, HookRow
from reactor.errors import UsageError
from reactor.telemetry import redact

if TYPE_CHECKING:
    from rich.console import Console

# What each command accepts, by the row's status; the SQL enforces the same.
RETRYABLE = ("failed", "cancelled")
CANCELLABLE = ("pending", "failed", "cancelled")


def parse_ids(values: Sequence[str]) -> list[int]:
    """Row ids as given on the command line; UsageError for anything but positive integers."""
    ids = []
    for value in values:
        if not value.isascii() or not value.isdigit() or int(value) == 0:
            raise UsageError(f"{value!r} is not a hook row id; `reactor hooks list` shows them")
        ids.append(int(value))
    return ids


def judge_changes(
    changes: Sequence[HookChange], *, verb: str, allowed: Sequence[str], result: str
) -> str:
    """The message for a retry or cancel that went through; UsageError naming what did not.

    ``allowed`` are the statuses the command accepts; a row already in ``result`` (the status
    it sets) is accepted as it is.
    """
    unknown = [c.id for c in changes if c.status is None]
    if unknown:
        raise UsageError(
            f"no hook row with id {_ids(unknown)}; nothing was {verb}; "
            "`reactor hooks list` shows the ids"
        )
    wrong = [c for c in changes if c.status not in allowed]
    if wrong:
        states = ", ".join(f"{c.id} is {c.status}" for c in wrong)
        accepted = " or ".join(status for status in allowed if status != result)
        raise UsageError(
            f"hook row {states}: only {accepted} rows can be {verb}; nothing was {verb}"
        )
    changed = [c.id for c in changes if c.changed]
    kept = [c.id for c in changes if not c.changed]
    message = f"{verb} {len(changed)} hook call(s)"
    if changed:
        message += f": {_ids(changed)}"
    if kept:
        message += f"; already so: {_ids(kept)}"
    return message


def next_attempt_at(row: HookRow) -> datetime | None:
    """When a row will next be tried: its due time, or the end of its lease; None if parked."""
    if row.status == "running":
        return row.leased_until
    return row.available_at if row.status == "pending" else None


def as_json(rows: Sequence[HookRow], total: int, failed: int) -> dict[str, Any]:
    """The listing in the stable JSON shape documented at the top of this module."""

    def iso(value: datetime | None) -> str | None:
        return None if value is None else value.isoformat()

    return {
        "total": total,
        "failed": failed,
        "hooks": [
            {
                "id": row.id,
                "hook": row.hook,
                "status": row.status,
                "attempts": row.attempts,
                "run_id": row.run_id,
                "job_id": row.job_id,
                "last_error": _shown(row.last_error),
                "next_attempt_at": iso(next_attempt_at(row)),
                "created_at": iso(row.created_at),
                "updated_at": iso(row.updated_at),
            }
            for row in rows
        ],
    }


# The columns of the list for people, and what it says when there is nothing to list.
COLUMNS = ("id", "hook", "status", "attempts", "next attempt", "run / job", "last error")
NOTHING = "no hook calls waiting, running or parked"


def cells(rows: Sequence[HookRow]) -> list[tuple[str, ...]]:
    """The list's rows for people, a cell per column of :data:`COLUMNS`."""
    return [_cells(row) for row in rows]


def _cells(row: HookRow) -> tuple[str, ...]:
    when = next_attempt_at(row)
    return (
        str(row.id),
        row.hook,
        row.status,
        str(row.attempts),
        "-" if when is None else f"{when:%Y-%m-%d %H:%M:%S %Z}",
        f"{row.run_id}\n{row.job_id}",
        # The error's first line: a scrubbed one may come back empty.
        next(iter((_shown(row.last_error) or "").splitlines()), "")[:120],
    )


def render(rows: Sequence[HookRow], total: int, console: Console) -> None:
    """A table for people, drawn by rich (the cli extra), with a line on what was left out."""
    from rich.table import Table
    from rich.text import Text

    if not rows:
        console.print(NOTHING)
        return
    table = Table()
    for column in COLUMNS:
        table.add_column(column, overflow="fold")
    for row in cells(rows):
        # Text, not markup: an error a hook's endpoint sent back is not rich's to act on.
        table.add_row(*(Text(shown.printable_lines(cell)) for cell in row))
    console.print(table)
    if total > len(rows):
        console.print(_left_out(rows, total))


def plain(rows: Sequence[HookRow], total: int) -> str:
    """The same table as plain text, for a terminal without the cli extra (the image)."""
    if not rows:
        return NOTHING
    text = shown.table(COLUMNS, cells(rows))
    return f"{text}\n{_left_out(rows, total)}" if total > len(rows) else text


def _left_out(rows: Sequence[HookRow], total: int) -> str:
    return f"{len(rows)} of {total} shown; --limit shows more"


def _shown(error: str | None) -> str | None:
    # Errors are stored scrubbed; a URL a hook's own message quoted is cut down here as well.
    return None if error is None else redact.scrub(error)


def _ids(ids: Sequence[int]) -> str:
    return ", ".join(map(str, ids))


async def operate(
    queries: Database,
    action: str,
    *,
    ids: list[int],
    failed: bool,
    json_out: bool,
    limit: int,
    rich: bool,
) -> int:
    """Run ``reactor hooks ACTION`` on ``queries`` and print what it did; the exit code (1 when
    a list shows parked rows, which need a person, as `reactor status` judges too). ``rich``:
    whether the cli extra is there to draw the list's table; else it is plain text."""
    if action == "list":
        rows, total, parked = await queries.list_hooks(failed_only=failed, limit=limit)
        if json_out:
            print(json.dumps(as_json(rows, total, parked), indent=2))
        elif rich:
            from rich.console import Console

            render(rows, total, Console())
        else:
            print(plain(rows, total))
        return 1 if parked else 0
    if action == "retry" and failed:
        retried = await queries.retry_failed()
        print(f"re-queued {len(retried)} failed hook call(s)")
        return 0
    if action == "retry":
        changes = await queries.retry_hooks(ids)
        message = judge_changes(changes, verb="re-queued", allowed=RETRYABLE, result="pending")
    else:
        changes = await queries.cancel_hooks(ids)
        message = judge_changes(changes, verb="cancelled", allowed=CANCELLABLE, result="cancelled")
    print(message)
    return 0
