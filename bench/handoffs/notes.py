"""The handoffs benchmark's notes: how each scenario ran, in words, with its figures."""

from __future__ import annotations

import os

from bench.handoffs.findings import Findings, n_replicas, n_times
from bench.handoffs.scale import (
    CPU_GROWTH,
    EAGER_SIGTERM_AFTER_S,
    GRACE_S,
    RATE,
    SAVE_RATIO,
    TAB_DELAY_S,
    TOUCH_AT,
    TOUCH_RATIO,
    WINDOW_S,
)
from bench.stats import ratio, safe_div
from reactor.testing import Settings


def notes(found: Findings, *, quick: bool) -> list[str]:
    """The notes of the report, scenario by scenario, then the checks."""
    found_notes = [*_deploy_notes(found), *_fleet_notes(found), *_check_notes(found)]
    if quick:
        found_notes.insert(
            0,
            "--quick: toy scale, every scenario side by side on 2 cores, so the figures only "
            "show that the benchmark runs.",
        )
    return found_notes


def _deploy_notes(found: Findings) -> list[str]:
    """How the load ran, and the rolling and eager deploys."""
    scale, eagers, steps = found.scale, found.eagers, found.deploy["steps"]
    ready_s = ", ".join(f"{s['new_ready_s']:.2f} s" for s in steps if s["new_ready_s"])
    stop_s = ", ".join(f"{s['stop_s']:.2f} s" for s in steps if s["stop_s"])
    return [
        f"Every replica is a `reactor run` process with a {GRACE_S:g} s grace; the worker runs in "
        f"a process of its own, and tabs save {SAVE_RATIO:.0%} of the jobs "
        f"{TAB_DELAY_S[0]:g}-{TAB_DELAY_S[1]:g} s after they finish (inside the grace), so the "
        "reactor writes the other 30% and lateness is measured on those: the audit row of the "
        "reactor's write minus updated_at + grace, by the database clock.",
        f"Rolling deploys: {scale.deploy_replicas} replicas at {RATE:g} jobs/s for "
        f"{scale.deploy_seconds:g} s; {n_times(scale.deploys)}, a new process started, waited "
        f"for until its /readyz answered 200 ({ready_s} after its start), then the oldest got "
        f"SIGTERM and was waited for (exited after {stop_s}). A job counts as around a SIGTERM "
        f"when its deadline is within {WINDOW_S:g} s of it; the SIGTERM follows the new "
        "replica's readiness within a millisecond, so the window covers its joining too. "
        "Replicas log at info.",
        f"Eager deploys: {', '.join(n_replicas(e['replicas']) for e in eagers)} at {RATE:g} "
        f"jobs/s for {scale.eager_seconds:g} s, each on a fresh database; "
        f"{n_times(scale.deploys)}, a new process started and the oldest got SIGTERM "
        + ", ".join(f"{d:g}" for d in EAGER_SIGTERM_AFTER_S[: scale.deploys])
        + " s later, ready or not (new replicas were ready after "
        + "; ".join(
            ", ".join(f"{s['new_ready_s']:.2f} s" for s in e["steps"] if s["new_ready_s"])
            for e in eagers
        )
        + f"; {sum(s['sigterm_at'] < s['ready_at'] for e in eagers for s in e['steps'])} of "
        f"{sum(len(e['steps']) for e in eagers)} SIGTERMs came before the new replica was "
        f"ready). The app touched {TOUCH_RATIO:.0%} of the finished jobs {TOUCH_AT:g} grace after "
        "their finish ("
        + ", ".join(str(e["outcome"].play.touched) for e in eagers)
        + " jobs): a touch moves the deadline and sends no notification. Replicas log at info.",
    ]


def _fleet_notes(found: Findings) -> list[str]:
    """The replica killed for good, the fleets, and what they cost in CPU."""
    scale, kill, fleets, cpu = found.scale, found.kill, found.fleets, found.cpu
    first, large, cpu_growth = found.first, found.large, found.cpu_growth
    spread_cpu = found.spread["cpu_per_1000_jobs"]
    probe_source = (
        "the default" if scale.probe == Settings.probe_interval else "shortened for --quick"
    )
    return [
        f"Killed for good: {scale.kill_replicas} replicas at {RATE:g} jobs/s for "
        f"{scale.kill_seconds:g} s, {kill['killed']} SIGKILLed {kill['killed_after_s']:.1f} s "
        f"after its start ({scale.kill_seconds / 3:g} s into the load) and never restarted; "
        f"probe interval {scale.probe:g} s ({probe_source}), so the bound is "
        f"{kill['bound_s']:g} s. {kill['late_over_half_s']} job(s) due after the kill were "
        "recorded more than 0.5 s late (the killed replica's share, until the others' next "
        "check). Record statements per finished job: "
        f"{kill['record_statements_per_job']:.3f} (pg_stat_statements: the timer's and the "
        "scan's claim-and-write statements). Replicas log at info.",
        f"Fleet: {scale.fleet_seconds:g} s at {scale.fleet_rate:g} jobs/s with "
        + ", then ".join(n_replicas(n) for n in scale.fleet_counts)
        + ", each on a fresh database, the load started once every replica saw them all live. "
        "The trigger is installed as `reactor migrate` installs it (one channel: each replica "
        "hears every job until the doorbell rings, then polls the queue), in every scenario "
        "but the last row's, where it spreads the jobs over a channel per share (`reactor "
        f"migrate --spread`: each of the {large} replicas hears its shares' jobs, and nobody "
        "rings the doorbell). "
        "Record statements per finished job: "
        + ", ".join(f"{f['record_statements_per_job']:.3f} at {f['replicas']}" for f in fleets)
        + ". Replicas log at warning.",
        "CPU per 1,000 finished jobs, from the load's start until every run was written, read "
        "from /proc: all replicas together "
        + ", ".join(f"{c['replicas_s']:.3f} s at {n}" for n, c in cpu.items())
        + f" ({ratio(cpu_growth)} at {large} of {first}'s; goal {CPU_GROWTH:g}x), and "
        f"{spread_cpu['replicas_s']:.3f} s at {large} with the trigger spread "
        f"({ratio(safe_div(spread_cpu['replicas_s'], cpu[first]['replicas_s']))}); the server's "
        "processes "
        + ", ".join(f"{c['server_s']:.3f} s at {n}" for n, c in cpu.items())
        + "; the 1-minute load average at the end "
        + ", ".join(f"{c['load_1m']:.2f} at {n}" for n, c in cpu.items())
        + f" ({os.cpu_count()} CPUs; the worker, the tabs and this harness run beside them).",
    ]


def _check_notes(found: Findings) -> list[str]:
    """How far the worker lagged, and what the checks found."""
    behind = ", ".join(
        f"{s['outcome'].play.behind_s * 1000:.0f} ms ({n})" for n, s in found.scenarios.items()
    )
    return [
        f"The worker fell behind its schedule by at most {behind}; a lagging worker offers less "
        "than the stated rate.",
        "Checked in every scenario: every finished job has exactly one run; the audit finds no "
        "lost, duplicate, clobbering, early or wrong write; every replica stopped with SIGTERM "
        "exited 0 within its drain and deleted its heartbeat; no replica logged an error. "
        + (
            "Problems: " + "; ".join(found.problems) + "."
            if found.problems
            else "No problem found."
        ),
        ("Jobs late by seconds: " + "; ".join(found.anomalies) + ". " if found.anomalies else "")
        + found.logs_note,
    ]
