"""What is at risk in a snapshot, in words: the judgement ``reactor status`` exits 1 on."""

from __future__ import annotations

from collections.abc import Mapping

from reactor.status.model import Status


def risks(status: Status) -> list[str]:
    """What is at risk, one sentence each; empty when all is well."""
    found = []
    for problem in status.untrusted:
        found.append(
            f"{problem}; `reactor run` and `sweep` refuse to start until it is gone (the "
            "definer functions would run it with the owner's rights)"
        )
    for replica in status.unwritable:
        found.append(
            f"replica {replica.id} writes nothing: its record statements fail with "
            f"{replica.write_error!r}; run `reactor migrate`, or restore the column, table or "
            "grant the error names"
        )
    if status.public_creatable:
        found.append(
            "every role may create objects in the schema public (the default up to PostgreSQL "
            "14, CVE-2018-1058), where the app's tables and the names they use are found: "
            "REVOKE CREATE ON SCHEMA public FROM PUBLIC"
        )
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
            f"{duration(status.trim_horizon)} trim horizon: record it before the app trims its "
            "document"
        )
    if status.set_aside_count:
        first = status.set_aside[0]
        found.append(
            f"{status.set_aside_count} job(s) cannot be written and are set aside (first: job "
            f"{first.job_id}: {first.error}); "
            + (f"{first.fix}; " if first.fix else "fix the data or the app's constraint; ")
            + "then `reactor sweep --once` tries them again now"
        )
    if status.hooks.failed:
        found.append(
            f"{status.hooks.failed} hook call(s) failed for good and are parked: "
            "`reactor hooks list --failed` shows them, `reactor hooks retry --failed` "
            "re-queues them"
        )
    if status.hooks.retention_late:
        assert status.hooks.retention_overdue is not None
        found.append(
            "hook retention has not run for a long time: the oldest settled hook row outlived "
            f"its retention by {duration(status.hooks.retention_overdue)}; check that a reactor "
            "runs and what its log says ('hook retention failed')"
        )
    if status.schema_behind:
        found.append(
            f"the schema is at version {status.schema_version}, this reactor needs "
            f"{status.required_version}: run `reactor migrate`"
        )
    if status.mapping_changed:
        found.append(
            "the mapping file changed since the last `reactor migrate`: the installed triggers "
            "and functions still follow the old one, and `reactor run` and `sweep` refuse to "
            "start; run `reactor migrate`"
        )
    if status.queue_at_risk:
        found.append(
            f"the NOTIFY queue is {status.queue_usage:.0%} full: a session LISTENs without "
            "reading, and the app's commits fail when it is full"
        )
    if status.trigger_at_risk:
        state = "missing" if status.trigger_channel is None else "disabled"
        found.append(
            f"the job trigger on {status.jobs_table} is {state}: finished jobs are "
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


def verdict_over(statuses: Mapping[str, Status]) -> tuple[str, str]:
    """(state, reason) over several pairs: the worst pair's, named; at risk before backlog
    before ok, and the first pair by order among equals."""
    found = [(name, *verdict(status)) for name, status in statuses.items()]
    for state in ("at risk", "backlog"):
        for name, pair_state, reason in found:
            if pair_state == state:
                return state, f"pair {name}: {reason}"
    return "ok", "nothing at risk in " + ", ".join(statuses)


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
