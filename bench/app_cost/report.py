"""app_cost's result: its table, headline, figures and notes, drawn from the rounds."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bench.app_cost.figures import (
    checks_text,
    clear_of,
    gap_closed,
    paired,
    spread,
    summarize_install,
)
from bench.app_cost.installs import BASELINE, CONFIGS, NOISE, Installed
from bench.app_cost.rounds import CLIENTS, DOC_BYTES, UPDATES_PER_LIFE
from bench.result import Result, Table
from bench.stats import ratio


@dataclass(frozen=True)
class Findings:
    """What the rounds measured, with the summaries and goals drawn from it."""

    rounds: list[dict[str, Any]]
    orders: list[list[str]]
    checks: list[dict[str, Any]]
    reactor: Installed
    track_functions: str
    round_s: int
    sets: int

    @property
    def summary(self) -> dict[str, dict[str, Any]]:
        """Each install's figures over the run."""
        return {name: summarize_install(name, self.rounds) for name in CONFIGS}

    @property
    def unlogged(self) -> dict[str, str]:
        """Each install with the queue unlogged, and its logged twin."""
        return {name: c.twin for name, c in CONFIGS.items() if c.twin is not None}

    @property
    def twins(self) -> dict[str, dict[str, Any]]:
        """Each unlogged install against its twin's rounds of the same set."""
        return {name: paired(self.rounds, name, twin) for name, twin in self.unlogged.items()}

    @property
    def goals(self) -> list[tuple[str, bool | None, str]]:
        """Each goal: what it says, met or not (None: not measured), and the figure."""
        default = self.summary["default"]
        quiet = self.summary["quiet"]
        return [
            ("default >= 0.99x notify-only", default["median"] >= 0.99, ratio(default["median"])),
            ("quiet >= 0.99x none", quiet["median"] >= 0.99, ratio(quiet["median"])),
            (
                "default WAL per life <= 1.10x none's",
                default["wal_vs_base"] <= 1.10,
                ratio(default["wal_vs_base"]),
            ),
            (
                "default HOT share >= 0.95 of none's",
                default["hot_vs_base"] >= 0.95,
                f"{default['hot_vs_base']:.2f}",
            ),
            (
                "job trigger <= 25 us per finishing update (default)",
                None if math.isnan(default["trigger_us"]) else default["trigger_us"] <= 25,
                f"{default['trigger_us']:.1f} us",
            ),
        ]

    @property
    def met(self) -> bool:
        """Whether both lives/s goals were met."""
        goals = self.goals
        return bool(goals[0][1]) and bool(goals[1][1])


def result_of(found: Findings, *, settings: dict[str, Any], conditions: dict[str, Any]) -> Result:
    """The result of the run: ``settings`` and ``conditions`` as it recorded them."""
    summary, noise = found.summary, found.summary[NOISE]
    return Result(
        met=found.met,
        headline=_headline(found),
        table=_table(found),
        figures={
            "rounds": found.rounds,
            "orders": found.orders,
            "configs": summary,
            "vs_logged_twin": found.twins,
            "record_checks": found.checks,
            "noise_floor": {k: noise[k] for k in ("median", "q1", "q3", "ratios")},
            "goals": {text: ok for text, ok, _ in found.goals},
        },
        settings=settings,
        conditions=conditions,
        notes=[*_how_notes(found), *_what_notes(found), *_missed_notes(found)],
    )


def _noise_text(noise: dict[str, Any]) -> str:
    """The noise floor's spread, in words."""
    return f"none vs none: median {noise['median']:.2f}, IQR [{noise['q1']:.2f}-{noise['q3']:.2f}]"


def _table(found: Findings) -> Table:
    """Each install against its floor, with its WAL, HOT share and trigger time."""
    summary = found.summary
    table = Table(
        [
            "install",
            "sets",
            "lives/s vs its floor: median [IQR]",
            "floor",
            "mean lives/s",
            "WAL/life",
            "WAL vs none",
            "HOT share",
            "HOT vs none",
            "trigger us/finish",
        ]
    )
    for name, config in CONFIGS.items():
        s = summary[name]
        table.add(
            f"{name}: {config.label}",
            s["sets"],
            "1 (baseline)" if name == BASELINE else spread(s),
            config.floor,
            f"{s['mean_tps']:,.1f}",
            f"{s['wal_per_life'] / 1024:,.1f} KiB",
            ratio(s["wal_vs_base"]),
            f"{s['hot_share']:.1%}",
            f"{s['hot_vs_base']:.2f}",
            "-" if math.isnan(s["trigger_us"]) else f"{s['trigger_us']:.1f}",
        )
    return table


def _how_notes(found: Findings) -> list[str]:
    """How the rounds ran, the noise floor, and each set's rounds."""
    round_s, sets, rounds, summary = found.round_s, found.sets, found.rounds, found.summary
    noise = summary[NOISE]
    noise_text = _noise_text(noise)
    return [
        f"pgbench -M prepared, {CLIENTS} connections, {round_s:g} s per round; one pgbench "
        f"transaction is one job's life, {1 + UPDATES_PER_LIFE} statements each committed on "
        f"its own: the insert with a {DOC_BYTES // 1024} KiB document (TOASTed), three progress "
        "updates adding verdicts to results, and the finishing update. fsync, full_page_writes "
        "and synchronous_commit on; autovacuum off (every round starts from an empty table); "
        "one reactor replica listening throughout.",
        f"{sets} set(s) of {len(CONFIGS)} rounds, each install once per set, in an order that "
        "rotates from set to set (rows of a Williams square: every install in every position, "
        "after every other, equally often), after one uncounted warm-up round. Each round "
        "starts from an empty table (TRUNCATE) after a CHECKPOINT. Lives/s vs none is each "
        "set's ratio to its floor's round in that set ('default' and 'default_unlogged' to "
        "'notify_only', every other to 'none'): median and interquartile range over the sets.",
        f"Noise floor, {noise_text}: 'none_again' is the same install as 'none', so its "
        "spread is what this machine's disk and CPU do between two rounds of one set. A ratio "
        "whose IQR overlaps that one is not told apart from no cost at all: "
        + ", ".join(
            f"{name} {'clear of it' if clear_of(summary[name], noise) else 'within it'}"
            for name in CONFIGS
            if name not in (BASELINE, NOISE)
        )
        + ".",
        "Sets (job lives/s): "
        + "; ".join(
            f"{number}: "
            + ", ".join(f"{r['config']} {r['tps']:,.0f}" for r in rounds if r["set"] == number)
            for number in range(1, sets + 1)
        )
        + ".",
    ]


def _what_notes(found: Findings) -> list[str]:
    """What each install is, how each figure is read, the goals and the unlogged queue."""
    quiet, floor = found.summary["quiet"], found.summary["notify_only"]
    verdicts = {True: "met", False: "missed", None: "not measured"}
    goals = found.goals
    return [
        f"'default' is what `reactor migrate` left on analysis_jobs, read back from the catalog: "
        f"the triggers ({', '.join(found.reactor.triggers.names)}) and the index "
        f"({'; '.join(definition for _, definition in found.reactor.indexes)}). "
        "'quiet' renders the "
        "job triggers as `reactor migrate --no-notify` does (jobs queued in reactor.pending, "
        "nobody notified). 'none' drops the reactor's triggers and index on analysis_jobs, "
        "leaving the app's primary key; the reactor's schema and its triggers on analysis_runs "
        "stay (restored as installed before every round). 'notify_only' is 'none' plus a "
        "trigger that does nothing but pg_notify on the transition into a terminal status, on "
        "the reactor's channel with its payload (the listening replica receives the same "
        "messages): the floor PostgreSQL sets for any install that notifies.",
        "WAL per life: pg_current_wal_lsn() after the round minus before (after the "
        "checkpoint), over the round's job lives; what the replica writes meanwhile is "
        "included. HOT share: n_tup_hot_upd / n_tup_upd over the round's updates. Trigger "
        "time: pg_stat_user_functions.total_time of the reactor's job_changed* functions (of "
        "bench_notify_only for 'notify_only') "
        f"(track_functions = {found.track_functions}), over the round's job lives; it includes the "
        "functions the trigger calls, not the NOTIFY's work at commit. Stats are read after "
        "pgbench's sessions have exited, which flushes them.",
        "Goals: "
        + "; ".join(f"{text}: {verdicts[ok]} ({value})" for text, ok, value in goals)
        + f" (quiet's trigger: {quiet['trigger_us']:.1f} us per finish; the notify-only "
        f"trigger's: {floor['trigger_us']:.1f} us; notify-only vs none: {spread(floor)}).",
        "Queue unlogged (a measurement only: an unlogged queue would need a rebuild after "
        "every crash and promotion): "
        + "; ".join(
            f"{name} {spread(found.summary[name])} of {CONFIGS[name].floor} vs {twin}'s "
            f"{spread(found.summary[twin])}, {spread(found.twins[name])} of {twin} "
            "in the same set, "
            f"so {gap_closed(found.summary[name], found.summary[twin])} of {twin}'s "
            "gap to its floor; "
            f"WAL/life {found.summary[name]['wal_per_life'] / 1024:,.1f} KiB vs "
            f"{found.summary[twin]['wal_per_life'] / 1024:,.1f} KiB"
            for name, twin in found.unlogged.items()
        )
        + ". The share of the gap is (unlogged median - logged median) / (1 - logged median). "
        + checks_text(found.checks),
        "The listening replica's share of one core during the rounds (this process's CPU "
        "time; pgbench runs in a child): "
        + ", ".join(f"{name} {found.summary[name]['replica_cpu_share']:.1%}" for name in CONFIGS)
        + ". On this machine that is taken from PostgreSQL and pgbench.",
    ]


def _missed_notes(found: Findings) -> list[str]:
    """Why a goal was missed, when one was."""
    default, met = found.summary["default"], found.met
    notes: list[str] = []
    if default["hot_vs_base"] < 0.95:
        notes.append(
            "HOT: the progress updates change results and updated_at only, which no reactor "
            "index names, so they stay HOT; the finishing update changes status, which the "
            "walk index's predicate names, so with the index it writes index entries: at most "
            f"{UPDATES_PER_LIFE - 1} in {UPDATES_PER_LIFE} of the app's updates can be HOT. "
            "That is a property of the index as designed, not noise."
        )
    if not met:
        notes.append(
            "Below the goal. Above its floor the reactor adds, on the finishing update only: "
            "its trigger function (the guard, the eligibility test, the notification queue's "
            "limit), the job's row and its index entries in reactor.pending, the walk index's "
            "entry and that update's loss of HOT. The NOTIFY itself, whose commit-time lock on "
            "the server-wide queue serialises the clients' finishing commits, is in the floor: "
            "'notify_only' against 'none' is its price. At this rate of jobs finishing "
            "(hundreds per second, far above a real app's) the replica's CPU also comes out of "
            "the same cores."
        )
    return notes


def _headline(found: Findings) -> str:
    """The run in one line."""
    summary, unlogged = found.summary, found.unlogged
    default, quiet, noise = summary["default"], summary["quiet"], summary[NOISE]
    floor = summary["notify_only"]
    noise_text = _noise_text(noise)
    return (
        f"default {spread(default)} of notify-only's {floor['mean_tps']:,.0f}, quiet "
        f"{spread(quiet)} of none's {summary[BASELINE]['mean_tps']:,.0f} job lives/s "
        f"(notify-only {spread(floor)} of none; {noise_text}); WAL/life "
        f"{ratio(default['wal_vs_base'])}; HOT {default['hot_share']:.0%} vs "
        f"{summary[BASELINE]['hot_share']:.0%}; trigger {default['trigger_us']:.1f} us/finish; "
        "queue unlogged: " + ", ".join(f"{name} {spread(summary[name])}" for name in unlogged)
    )
