"""``reactor status``: is anything at risk of being lost, and why.

:func:`collect` reads one snapshot from the database (:mod:`.model`; its statements are the
``status_*`` queries of ``triggers/status.sql``, all read-only), :func:`risks` judges it
(:mod:`.risks`), and :func:`as_json` / :func:`render` show it to machines and to people
(:mod:`.render`; :func:`plain` where the cli extra's rich is not installed). Nothing here
imports the running reactor. The command exits 1 when :func:`risks` finds anything, so a cron
job or a CI step can alarm on the exit code alone.

With several pairs (REACTOR_CONFIG names several files) the command shows a section per pair;
its JSON is ``{"at_risk", "risks", "verdict", "pairs": {name: <the shape below>}}``, each risk
prefixed with its pair, and the verdict the worst pair's.

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
        "grace_seconds": 120.0,      # the grace the live replicas publish in their heartbeat
        "own_grace_seconds": null,   # this command's REACTOR_GRACE_SECONDS when it differs
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
                  "live": true,      # fresh heartbeat, and that session still there
                  "grace_seconds": 120.0,  # the grace it runs with
                  "write_error": null}]    # what its record statements fail with: at risk
      },
      "schema": {"version": 5, "required": 5, "behind": false,
                 "mapping_changed": false},  # installed for another version of the mapping
                                     # file: at risk, `reactor migrate` re-installs
      "trigger": {                   # the job trigger on the job table
        "installed": true,
        "enabled": true,             # fires for the app's sessions
        "channel": "analysis_jobs_terminal",  # what it notifies; "" when installed with
                                     # `reactor migrate --no-notify`; null when not installed
        "notifies": true,
        "spread": false,             # a channel per share of the jobs (`--spread`)
        "doorbell_awake_seconds": null,  # while a stream of jobs keeps the doorbell awake,
                                     # the seconds it still is: finishing commits skip the
                                     # NOTIFY and the replicas poll; null while it is silent
        "at_risk": false             # missing or disabled: nothing is queued
      },
      "notify_queue": {"usage": 0.0, "at_risk": false},  # pg_notification_queue_usage()
      "set_aside": {                 # queued jobs whose write failed on their own data (the
        "count": 0,                  # app's constraint or trigger rejected the row); null
        "first": [                   # before the schema has them. At risk when count > 0.
          {"job_id": "...", "error": "...", "sqlstate": "23502", "failures": 1,
           "first_failed_at": "...", "retry_at": "...",
           "fix": "reactor.toml:23: ..."}  # a NULL refused by a column [runs.columns]
        ],                           # fills: the mapping's line and the two fixes (else
                                     # null). The oldest, at most 5
        "at_risk": false
      },
      "reconcile": {
        "interval_seconds": 600.0,   # REACTOR_RECONCILE_INTERVAL_SECONDS; 0: turned off
        "in_progress": false,
        "requested": false,          # a pass was asked for (a TRUNCATE of the runs)
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

from reactor.status.model import (
    QUEUE_WARNING,
    HookFailure,
    Hooks,
    ListenerStatus,
    ReplicaStatus,
    SetAsideJob,
    Status,
    collect,
)
from reactor.status.render import as_json, pairs_as_json, plain, render
from reactor.status.risks import duration, risks, verdict, verdict_over

__all__ = [
    "QUEUE_WARNING",
    "HookFailure",
    "Hooks",
    "ListenerStatus",
    "ReplicaStatus",
    "SetAsideJob",
    "Status",
    "as_json",
    "collect",
    "duration",
    "pairs_as_json",
    "plain",
    "render",
    "risks",
    "verdict",
    "verdict_over",
]
