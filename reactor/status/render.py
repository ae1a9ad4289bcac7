"""A snapshot shown to machines (the stable JSON shape of the package's docstring) and to
people (a table)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

from reactor import shown
from reactor.status.model import Status
from reactor.status.risks import duration, risks, verdict, verdict_over

if TYPE_CHECKING:
    from rich.console import Console


def pairs_as_json(
    statuses: Mapping[str, Status], broken: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Several pairs' snapshots: the verdict over all of them, and each pair's own document
    (the shape of :func:`as_json`) under ``pairs``, by name. ``broken``: the pairs whose
    tables or schema do not fit, and why; each is at risk, and its document says only that."""
    broken = broken or {}
    found = [f"pair {name}: not served: {why}" for name, why in broken.items()]
    found += [f"pair {name}: {risk}" for name, status in statuses.items() for risk in risks(status)]
    state, reason = verdict_over(statuses)
    if broken:
        state, reason = "at risk", found[0]
    documents: dict[str, Any] = {name: as_json(status) for name, status in statuses.items()}
    for name, why in broken.items():
        problem = f"not served: {why}"
        documents[name] = {
            "at_risk": True,
            "risks": [problem],
            "verdict": {"state": "at risk", "reason": problem},
        }
    return {
        "at_risk": bool(found),
        "risks": found,
        "verdict": {"state": state, "reason": reason},
        "pairs": documents,
    }


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
            "own_grace_seconds": status.own_grace,
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
            "recent_failures": [_record(f) for f in status.hooks.recent_failures],
        },
        "listeners": {
            "mode": status.mode,
            "count": len(status.listeners),
            "sessions": [_record(s) for s in status.listeners],
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
                    "grace_seconds": r.grace,
                    "write_error": r.write_error,
                }
                for r in status.replicas
            ],
        },
        "schema": {
            "version": status.schema_version,
            "required": status.required_version,
            "behind": status.schema_behind,
            "mapping_changed": status.mapping_changed,
        },
        "trigger": {
            "installed": status.trigger_channel is not None,
            "enabled": status.trigger_enabled,
            "channel": status.trigger_channel,
            "notifies": bool(status.trigger_channel),
            "spread": status.trigger_spread,
            "doorbell_awake_seconds": status.doorbell_awake_for,
            "at_risk": status.trigger_at_risk,
        },
        "notify_queue": {"usage": status.queue_usage, "at_risk": status.queue_at_risk},
        "set_aside": None
        if status.set_aside_count is None
        else {
            "count": status.set_aside_count,
            "first": [_record(job) for job in status.set_aside],
            "at_risk": bool(status.set_aside_count),
        },
        "reconcile": None if status.reconcile is None else _reconcile_json(status),
    }


def _record(row: Any) -> dict[str, Any]:
    """A row of the snapshot (a dataclass whose fields are its JSON keys), times in ISO 8601."""
    return {
        f.name: value.isoformat() if isinstance(value, datetime) else value
        for f in fields(row)
        for value in (getattr(row, f.name),)
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


# The columns of the drawn table; the plain one puts the state before the value.
COLUMNS = ("check", "value", "state")


@dataclass(frozen=True)
class Check:
    """One row of the table for people: what is checked, its value, and whether it is a risk
    (else ``note`` is its state)."""

    name: str
    value: str
    risky: bool
    note: str = "ok"

    @property
    def state(self) -> str:
        return "AT RISK" if self.risky else self.note


def title(status: Status) -> str:
    """The table's title: when the snapshot was taken."""
    return f"reactor status at {status.checked_at:%Y-%m-%d %H:%M:%S %Z}"


def checks(status: Status) -> list[Check]:
    """The rows of the table for people, in the order they are shown."""
    found: list[Check] = []

    def row(check: str, value: str, risky: bool, *, note: str = "ok") -> None:
        found.append(Check(check, value, risky, note))

    grace = f"the {duration(status.grace)} grace"
    if status.own_grace is not None:
        grace += (
            f" the replicas run with (REACTOR_GRACE_SECONDS here: {duration(status.own_grace)})"
        )
    row(
        "jobs needing a run",
        f"{status.due} due, {status.in_grace} inside {grace}",
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
            if job.fix:
                held += f"\n  fix: {job.fix}"
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
        f"version {status.schema_version} (this reactor needs {status.required_version})"
        + ("\ninstalled for another mapping file" if status.mapping_changed else ""),
        status.schema_behind or status.mapping_changed,
    )
    row("job trigger", _trigger_text(status), status.trigger_at_risk)
    row("NOTIFY queue", f"{status.queue_usage:.1%} used", status.queue_at_risk)
    if status.reconcile is not None:
        row("reconcile", _reconcile_text(status), status.reconcile_at_risk)
    return found


def render(status: Status, console: Console) -> None:
    """A table for people, drawn by rich (the cli extra): one row per check, the risky ones in
    red, then the risks."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title(status))
    for column in COLUMNS:
        table.add_column(column)
    for check in checks(status):
        style = "bold red" if check.risky else "green"
        # Text, not markup: a value may quote an error or a name from the catalog, and rich
        # would act on a "[link=...]" in it, or fail on a "[/x]".
        table.add_row(
            Text(shown.printable_lines(check.name)),
            Text(shown.printable_lines(check.value)),
            Text(check.state, style=style),
        )
    console.print(table)
    found = risks(status)
    for risk in found:
        console.print(Text(f"at risk: {shown.printable(risk)}", style="red"))
    if not found:
        console.print(Text("nothing at risk", style="green"))


def plain(status: Status) -> str:
    """The same table as plain text, for a terminal without the cli extra (the image). The
    state comes before the value here: a value may run long, and nothing wraps it."""
    rows = [(check.name, check.state, check.value) for check in checks(status)]
    found = [f"at risk: {shown.printable(risk)}" for risk in risks(status)] or ["nothing at risk"]
    return "\n".join([title(status), shown.table(("check", "state", "value"), rows), *found])


def _trigger_text(status: Status) -> str:
    if status.trigger_channel is None:
        return "not installed (run `reactor migrate`)"
    if not status.trigger_enabled:
        return f"disabled ({status.enable_trigger})"
    if not status.trigger_channel:
        return "queues without notifying: the reactors poll the queue"
    if status.trigger_spread:
        text = (
            f"notifies channel {status.trigger_channel}.<share>, a channel per share of the jobs "
            "(--spread)"
        )
    else:
        text = f"notifies channel {status.trigger_channel}"
    if status.doorbell_awake_for is not None:
        text += (
            f"\ndoorbell awake {duration(status.doorbell_awake_for)} more: finishing commits "
            "skip the NOTIFY, the replicas poll the queue"
        )
    return text


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
