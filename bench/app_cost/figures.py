"""app_cost's figures drawn from its rounds: each install against its floor, set by set."""

from __future__ import annotations

import math
import statistics
from typing import Any

from bench.app_cost.installs import BASELINE, CONFIGS
from bench.app_cost.rounds import CHECK_GRACE_S
from bench.stats import percentile, safe_div


def summarize_install(name: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One install's figures over the run: per-set ratios to its floor, and totals (WAL and HOT
    against the baseline's)."""
    mine = [r for r in rounds if r["config"] == name]
    base = {r["set"]: r for r in rounds if r["config"] == BASELINE}
    floor = {r["set"]: r for r in rounds if r["config"] == CONFIGS[name].floor}
    ratios = [safe_div(r["tps"], floor[r["set"]]["tps"]) for r in mine]
    lives = sum(r["lives"] for r in mine)
    base_lives = sum(r["lives"] for r in base.values())
    wal_per_life = safe_div(sum(r["wal_bytes"] for r in mine), lives)
    base_wal = safe_div(sum(r["wal_bytes"] for r in base.values()), base_lives)
    hot_share = safe_div(sum(r["hot"] for r in mine), sum(r["updates"] for r in mine))
    base_hot = safe_div(
        sum(r["hot"] for r in base.values()), sum(r["updates"] for r in base.values())
    )
    return {
        "sets": len(mine),
        "ratios": ratios,
        "median": statistics.median(ratios),
        "q1": percentile(ratios, 0.25),
        "q3": percentile(ratios, 0.75),
        "mean_tps": statistics.fmean(r["tps"] for r in mine),
        "wal_per_life": wal_per_life,
        "wal_vs_base": safe_div(wal_per_life, base_wal),
        "hot_share": hot_share,
        "hot_vs_base": safe_div(hot_share, base_hot),
        "trigger_calls": sum(r["trigger_calls"] for r in mine),
        # No calls counted: no trigger, or a server not timing functions (not zero time).
        "trigger_us": safe_div(sum(r["trigger_ms"] for r in mine) * 1000, lives)
        if sum(r["trigger_calls"] for r in mine)
        else math.nan,
        "replica_cpu_share": statistics.fmean(r["replica_cpu_share"] for r in mine),
    }


def paired(rounds: list[dict[str, Any]], name: str, other: str, **among: Any) -> dict[str, Any]:
    """``name``'s rounds over ``other``'s of the same set (and of the same ``among``, e.g. the
    client count): the median of those ratios and their interquartile range."""

    def mine(config: str) -> list[dict[str, Any]]:
        return [
            r
            for r in rounds
            if r["config"] == config and all(r[key] == value for key, value in among.items())
        ]

    theirs = {r["set"]: r["tps"] for r in mine(other)}
    ratios = [safe_div(r["tps"], theirs[r["set"]]) for r in mine(name)]
    return {
        "ratios": ratios,
        "median": statistics.median(ratios),
        "q1": percentile(ratios, 0.25),
        "q3": percentile(ratios, 0.75),
    }


def gap_closed(unlogged: dict[str, Any], logged: dict[str, Any]) -> str:
    """The share of the logged install's gap to its floor that the unlogged one closes."""
    gap = 1 - logged["median"]
    if gap <= 0:
        return "none (the logged install is at or above its floor: no gap)"
    return f"{(unlogged['median'] - logged['median']) / gap:.0%}"


def checks_text(checks: list[dict[str, Any]]) -> str:
    """The record checks, in a sentence."""
    return (
        "Record check (uncounted, after the rounds): "
        + "; ".join(
            f"{c['config']} (reactor.pending relpersistence '{c['persistence']}'): "
            f"{c['jobs'] - c['missing']} of {c['jobs']} finished jobs recorded by a replica of "
            f"{CHECK_GRACE_S:g} s grace, {c['left_in_queue']} left in the queue"
            for c in checks
        )
        + (
            f"; foreign keys to or from the queue: {checks[0]['foreign_keys'] or 'none'}."
            if checks
            else "."
        )
    )


def clear_of(s: dict[str, Any], noise: dict[str, Any]) -> bool:
    """Whether the interquartile ranges of ``s`` and the noise floor do not overlap."""
    return bool(s["q3"] < noise["q1"] or s["q1"] > noise["q3"])


def spread(s: dict[str, Any]) -> str:
    """A median ratio with its interquartile range, e.g. ``0.93x [0.91-0.95]``."""
    return f"{s['median']:.2f}x [{s['q1']:.2f}-{s['q3']:.2f}]"
