"""trigger_overhead's result: each configuration against its floor, the noise, the server's
time per commit and per part of the job trigger, in a table, a headline, figures and notes."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from bench.result import Result, Table
from bench.stats import ratio, safe_div
from bench.trigger_overhead.scripts import CLIENTS
from bench.trigger_overhead.server_cost import ServerCost, parts_summary
from bench.trigger_overhead.triggers import Triggers

# Each configuration against its floor: the default install against the notify-only trigger,
# everything else against no trigger.
FLOORS = {
    "with": "notify_only",
    "quiet": "without",
    "notify_only": "without",
    "second with": "second without",
}


@dataclass(frozen=True)
class Findings:
    """What the rounds and the server's timings measured, and the ratios drawn from them."""

    rounds: list[dict[str, Any]]
    half: int  # rounds in half a block: a block is a palindrome of twice as many
    triggers: Triggers
    second_triggers: Triggers
    notified: int
    server_cost: ServerCost
    calibration: float
    round_s: int
    quick: bool

    @property
    def block(self) -> int:
        """Rounds in a block."""
        return 2 * self.half

    def mean_tps(self, config: str, among: list[dict[str, Any]] | None = None) -> float:
        """``config``'s mean tps over ``among`` (every round by default)."""
        return statistics.fmean(
            r["tps"] for r in (self.rounds if among is None else among) if r["config"] == config
        )

    def cpu_share(self, config: str) -> float:
        """The listening replica's mean share of one core in ``config``'s rounds."""
        return statistics.fmean(
            r["replica_cpu_share"] for r in self.rounds if r["config"] == config
        )

    @property
    def blocks(self) -> list[list[dict[str, Any]]]:
        """The rounds, block by block."""
        rounds, block = self.rounds, self.block
        return [rounds[i : i + block] for i in range(0, len(rounds), block)]

    @property
    def shares(self) -> dict[str, float]:
        """Each configuration's mean tps over its floor's."""
        return {c: safe_div(self.mean_tps(c), self.mean_tps(f)) for c, f in FLOORS.items()}

    @property
    def per_block(self) -> dict[str, list[float]]:
        """Each configuration over its floor, block by block, for the spread."""
        mean_tps = self.mean_tps
        return {
            c: [safe_div(mean_tps(c, b), mean_tps(f, b)) for b in self.blocks]
            for c, f in FLOORS.items()
        }

    @property
    def noise(self) -> list[float]:
        """Like against like: each configuration's round in the second half of a block over its
        round in the first half."""
        block = self.block
        return [
            safe_div(b[block - 1 - i]["tps"], b[i]["tps"])
            for b in self.blocks
            for i in range(self.half)
            if len(b) == block
        ]

    @property
    def noise_text(self) -> str:
        """The noise's median and range, in words."""
        noise = self.noise
        return f"{ratio(statistics.median(noise))} [{ratio(min(noise))}-{ratio(max(noise))}]"

    @property
    def met(self) -> bool:
        """Whether the default and the quiet install both kept 0.90x of their floors."""
        return self.shares["with"] >= 0.90 and self.shares["quiet"] >= 0.90


def result_of(found: Findings, *, settings: dict[str, Any], conditions: dict[str, Any]) -> Result:
    """The result of the run: ``settings`` and ``conditions`` as it recorded them."""
    cost = found.server_cost
    parts_saved, parts_text = parts_summary(cost)
    notes = [*_round_notes(found), *_cost_notes(found), parts_text]
    if not found.met:
        notes.append(
            "Below the goal. Above its floor a finishing commit pays the reactor's trigger "
            "function and the job's row in reactor.pending (a row and two index entries, "
            "deleted again when its timer fires): the server times above. Here 10% of 10-20k "
            "single-row commits/s (1-2k jobs finishing per second, far above a real app's "
            "rate) pay it, with the listening replica's work on the same 2 cores."
        )
    return Result(
        met=found.met,
        headline=_headline(found),
        table=_table(found),
        figures={
            "rounds": found.rounds,
            "floors": FLOORS,
            "vs_floor": found.shares,
            "block_ratios_vs_floor": found.per_block,
            "noise_like_with_like": found.noise,
            "notifications": found.notified,
            "server_us_per_finishing_commit": cost.finishing,
            "server_us_per_progress_update": cost.progress,
            "trigger_parts_us_saved": parts_saved,
            "trigger_parts_us": {
                f"{install}: {part}": times for (install, part), times in cost.parts.items()
            },
            "calibration_tps": found.calibration,
        },
        settings=settings,
        conditions=conditions,
        notes=notes,
    )


def _table(found: Findings) -> Table:
    """Each configuration's rounds, against its floor."""
    rounds, shares, floors, cost = found.rounds, found.shares, FLOORS, found.server_cost.finishing
    table = Table(
        [
            "configuration",
            "rounds",
            "mean tps",
            "min tps",
            "max tps",
            "terminal share",
            "vs its floor",
            "floor",
            "server us/finishing commit",
        ]
    )
    for config, label in (
        ("with", "as `reactor migrate` installs the triggers"),
        ("notify_only", "a trigger that only notifies on the transition (the notifying floor)"),
        ("quiet", "the triggers installed with `reactor migrate --no-notify` (queue only)"),
        ("without", "no trigger"),
        ("second with", 'second mapping (app."Job"), with the reactor\'s triggers'),
        ("second without", "second mapping, no trigger"),
    ):
        values = [r["tps"] for r in rounds if r["config"] == config]
        terminal = [r["terminal_share"] for r in rounds if r["config"] == config]
        table.add(
            label,
            len(values),
            f"{statistics.fmean(values):,.0f}",
            f"{min(values):,.0f}",
            f"{max(values):,.0f}",
            f"{statistics.fmean(terminal):.1%}",
            ratio(shares[config]) if config in floors else "1 (floor)",
            floors.get(config, "-"),
            f"{cost[config]:.1f}" if config in cost else "-",
        )
    return table


def _round_notes(found: Findings) -> list[str]:
    """How the rounds ran, their noise, and each configuration against its floor by block."""
    round_s, triggers, rounds = found.round_s, found.triggers, found.rounds
    notified = found.notified
    block, noise_text, per_block, floors = found.block, found.noise_text, found.per_block, FLOORS
    return [
        f"pgbench -M prepared, {CLIENTS} connections, 2 threads, {round_s:g} s per round; every "
        "transaction is one single-row UPDATE committed on its own (fsync off on this cluster, "
        "which makes commits cheap and the commit-time NOTIFY lock relatively larger).",
        f"'Without' drops the reactor's triggers ({', '.join(triggers.names)}); 'with' "
        "re-creates them as they were installed; 'quiet' installs them as `reactor migrate "
        "--no-notify` does, so the job is still queued in reactor.pending but nobody is "
        "notified (the replica polls the queue instead); 'notify_only' is a trigger that does "
        "nothing but pg_notify on the transition into a terminal status, on the reactor's "
        "channel with its payload: what every notifying install pays at least, the commit-time "
        "lock on the cluster's notification queue included. Rounds in order: "
        + ", ".join(f"{r['config']} {r['tps']:,.0f}" for r in rounds)
        + f". The reference's listening replica accepted {notified:,} notifications.",
        f"Noise: each block is a palindrome of {block} rounds, so every configuration is "
        "measured twice in it the same way; its second round over its first, over all "
        f"configurations and blocks: median {noise_text} (min-max). A ratio inside that range "
        "is not told apart from its floor.",
        "Ratio to its floor per block of rounds: "
        + "; ".join(
            f"{c} / {f}: " + ", ".join(ratio(v) for v in per_block[c]) for c, f in floors.items()
        )
        + ".",
    ]


def _cost_notes(found: Findings) -> list[str]:
    """The second mapping, the replica's CPU, and the server's time per commit."""
    second_triggers, cpu_share, quick = found.second_triggers, found.cpu_share, found.quick
    cost, progress_cost = found.server_cost.finishing, found.server_cost.progress
    return [
        "The second mapping (tests/mappings/second.sql, mapped by second.toml) runs the same "
        'two scripts on app."Job" in a database of its own: progress updates set "updatedAt" '
        "(naive UTC), terminal transitions set state to 'done' (an enum) by a bigint \"jobId\". "
        f"'With' and 'without' as above ({', '.join(second_triggers.names)}); its listening "
        "replica is a `reactor run` process with REACTOR_CONFIG naming second.toml (one process "
        "runs one mapping), so its CPU time is not in the shares below. Each replica idles "
        "while the other database's rounds run.",
        "The listening replica's share of one core during the rounds (this process's CPU "
        "time; pgbench runs in a child of its own): "
        + ", ".join(
            f"{config} {cpu_share(config):.1%}"
            for config in ("with", "notify_only", "quiet", "without")
        )
        + ". On this 2-core machine that is taken from PostgreSQL and pgbench.",
        "Server time per finishing commit: one session finishes jobs in a procedure that "
        "COMMITs after each update, inside the server (no round trips, no other client, no "
        f"listener; median of {1 if quick else 3} rotated repetitions): no trigger "
        f"{cost['without']:.1f} us, notify only {cost['notify_only']:.1f} us, queued "
        f"{cost['quiet']:.1f} us, queued and notified {cost['with']:.1f} us. The default "
        f"install's own share is {cost['with'] - cost['notify_only']:.1f} us above the "
        f"notifying floor, the quiet one's {cost['quiet'] - cost['without']:.1f} us above none. "
        "With reactor.pending unlogged (what an unlogged queue would save, at the price of a "
        f"rebuild after every crash and failover): queued {cost['quiet unlogged']:.1f} us, "
        f"queued and notified {cost['with unlogged']:.1f} us.",
        "Server time per progress update, the same way (each job updated once, still running, "
        f"before it finishes): no trigger {progress_cost['without']:.1f} us, notify only "
        f"{progress_cost['notify_only']:.1f} us, queued {progress_cost['quiet']:.1f} us, queued "
        f"and notified {progress_cost['with']:.1f} us. No trigger function runs on these; what "
        "a trigger adds is its WHEN, prepared again in every statement.",
    ]


def _headline(found: Findings) -> str:
    """The ratios in one line."""
    shares, mean_tps, noise_text = found.shares, found.mean_tps, found.noise_text
    share, quiet_share, second_share = shares["with"], shares["quiet"], shares["second with"]
    return (
        f"default {ratio(share)} of notify-only ({mean_tps('with'):,.0f} vs "
        f"{mean_tps('notify_only'):,.0f} tps, goal >= 0.90x); quiet {ratio(quiet_share)} of no "
        f"trigger (goal >= 0.90x); notify-only {ratio(shares['notify_only'])} of no trigger; "
        f"second mapping {ratio(second_share)}; noise {noise_text}"
    )
