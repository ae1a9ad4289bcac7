"""The pairs benchmark's result: its table, headline, figures and notes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.pairs.idle import Idle
from bench.pairs.load import Phase
from bench.pairs.plan import (
    BROKEN,
    FIRST_S,
    IDLE_BUDGET,
    LATENESS_BUDGET_S,
    PAIRS,
    SATURATED_S,
    SLACK_S,
    UNCHANGED,
)
from bench.result import Result, Table
from bench.stats import ms, ratio, safe_div, summarize
from reactor.testing import (
    POOL_MAX_IDLE_S,
)


@dataclass(frozen=True)
class Findings:
    """What the idle window and the two load phases measured, and the goals judged on it."""

    idle: dict[str, Idle]
    healthy: Phase
    broken: Phase
    broken_errors: float
    broken_queued: int
    window: float
    rate: float

    @property
    def one(self) -> Idle:
        """The one process serving every pair."""
        return self.idle["one"]

    @property
    def fleet(self) -> Idle:
        """The fleet per pair."""
        return self.idle["fleet"]

    @property
    def connection_goal(self) -> float:
        """One pair's connections (the fleet's over the pairs), plus one."""
        return self.fleet.connection_count / len(PAIRS) + 1

    @property
    def late(self) -> dict[str, dict[str, float]]:
        """Each pair's lateness, healthy."""
        return {p: summarize(v) for p, v in self.healthy.late.items()}

    @property
    def first(self) -> dict[str, dict[str, float]]:
        """Each pair's lateness in the healthy load's first FIRST_S seconds."""
        return {p: summarize(v) for p, v in self.healthy.first.items()}

    @property
    def late_broken(self) -> dict[str, dict[str, float]]:
        """Each measured pair's lateness with pair BROKEN broken."""
        return {p: summarize(v) for p, v in self.broken.late.items()}

    @property
    def ratios(self) -> dict[str, float]:
        """Each measured pair's p99 with BROKEN broken over its healthy p99."""
        late, late_broken = self.late, self.late_broken
        return {p: safe_div(late_broken[p]["p99"], late[p]["p99"]) for p in late_broken}

    @property
    def unchanged(self) -> dict[str, bool]:
        """Whether each measured pair recorded everything, about as late as when healthy."""
        late, late_broken, broken = self.late, self.late_broken, self.broken
        return {
            p: broken.missing[p] == 0
            and late_broken[p]["p99"] <= max(UNCHANGED * late[p]["p99"], late[p]["p99"] + SLACK_S)
            for p in late_broken
        }

    @property
    def met_goals(self) -> dict[str, bool]:
        """Each goal, met or not."""
        one, healthy, late = self.one, self.healthy, self.late
        connection_goal, unchanged = self.connection_goal, self.unchanged
        return {
            "connections": one.connection_count <= connection_goal,
            "idle": one.statements_per_min <= IDLE_BUDGET,
            "lateness": all(
                healthy.missing[p] == 0 and late[p]["p99"] <= LATENESS_BUDGET_S for p in late
            ),
            "broken": all(unchanged.values()),
        }


def result_of(
    *,
    settings: dict[str, Any],
    cond: dict[str, Any],
    idle: dict[str, Idle],
    healthy: Phase,
    broken: Phase,
    broken_errors: float,
    broken_queued: int,
    window: float,
) -> Result:
    """The result of the measurements: ``settings`` and ``cond`` as the run recorded them."""
    found = Findings(
        idle, healthy, broken, broken_errors, broken_queued, window, settings["rate_per_pair_per_s"]
    )
    notes = [
        *_notes(found.one, found.fleet, healthy, broken, broken_errors, broken_queued, window),
        *_missed_notes(found),
    ]
    return Result(
        met=all(found.met_goals.values()),
        headline=_headline(found),
        table=_table(found),
        figures=_figures(found),
        settings=settings,
        conditions=cond,
        notes=notes,
    )


def _table(found: Findings) -> Table:
    """The setups side by side, and each pair's lateness."""
    n = len(PAIRS)
    own_connections = found.fleet.connection_count / n
    connection_goal = own_connections + 1
    own_statements = found.fleet.statements_per_min / n
    table = Table(
        ["measure", "fleet per pair (3 processes)", "one pair's (fleet / 3)", "one process",
         "goal", "met"]
    )  # fmt: skip
    table.add(
        "connections per replica, 3 pairs",
        found.fleet.connection_count,
        f"{own_connections:.1f}",
        found.one.connection_count,
        f"<= {connection_goal:.1f} (one pair's + 1)",
        _yes(found.met_goals["connections"]),
    )
    table.add(
        "idle statements/min, pool checks included",
        f"{found.fleet.statements_per_min:.2f}",
        f"{own_statements:.2f}",
        f"{found.one.statements_per_min:.2f}",
        f"<= {IDLE_BUDGET:g}",
        _yes(found.met_goals["idle"]),
    )
    table.add(
        "  of which health checks/min",
        f"{found.fleet.health_checks_per_min():.2f}",
        f"{found.fleet.health_checks_per_min() / n:.2f}",
        f"{found.one.health_checks_per_min():.2f}",
        "-",
        "-",
    )
    for p in PAIRS:
        s = found.late[p]
        table.add(
            f"lateness p50 / p99 / max, pair {p}, {found.rate:g} jobs/s each",
            "-",
            "-",
            f"{ms(s['p50'])} / {ms(s['p99'])} / {ms(s['max'])}",
            f"p99 <= {ms(LATENESS_BUDGET_S)}",
            _yes(found.healthy.missing[p] == 0 and s["p99"] <= LATENESS_BUDGET_S),
        )
    first = found.first
    for p in PAIRS:
        s = first[p]
        table.add(
            f"  the load's first {FIRST_S:g} s, pair {p} (the pool grows from idle)",
            "-",
            "-",
            f"{ms(s['p50'])} / {ms(s['p99'])} / {ms(s['max'])}",
            "-",
            "-",
        )
    for p in found.late_broken:
        s = found.late_broken[p]
        table.add(
            f"pair {BROKEN} broken: pair {p} p50 / p99 / max (p99 vs healthy)",
            "-",
            "-",
            f"{ms(s['p50'])} / {ms(s['p99'])} / {ms(s['max'])} ({ratio(found.ratios[p])})",
            "unchanged",
            _yes(found.unchanged[p]),
        )
    return table


def _headline(found: Findings) -> str:
    """The setups and the phases in one line."""
    healthy_p99 = " / ".join(ms(found.late[p]["p99"]) for p in PAIRS)
    first_max = max(found.first[p]["max"] for p in PAIRS)
    broken_p99 = " / ".join(
        f"{ms(found.late_broken[p]['p99'])} ({ratio(found.ratios[p])})" for p in found.late_broken
    )
    return (
        f"one process serving 3 pairs: {found.one.connection_count} connections (goal <= "
        f"{found.connection_goal:.1f}; a fleet per pair {found.fleet.connection_count}) and "
        f"{found.one.statements_per_min:.1f} idle statements/min (goal <= {IDLE_BUDGET:g}; a fleet "
        f"per pair {found.fleet.statements_per_min:.1f}); lateness p99 a / b / c {healthy_p99} at "
        f"{found.rate:g} jobs/s each (the first {FIRST_S:g} s, the pool growing: max "
        f"{ms(first_max)}); with c broken, a / b p99 {broken_p99}, "
        + (
            "every job recorded"
            if not any(found.broken.missing.values())
            else f"{sum(found.broken.missing.values())} of their jobs not recorded"
        )
    )


def _figures(found: Findings) -> dict[str, Any]:
    """Every figure, as the results file keeps them."""
    healthy, broken = found.healthy, found.broken
    return {
        "goals_met": found.met_goals,
        "idle": {
            who: {
                "minutes": found.minutes,
                "statements_per_min": found.statements_per_min,
                "pool_checks_per_min": found.pool_checks / found.minutes,
                "health_checks_per_min": found.health_checks_per_min(),
                "connections": found.connections,
                "by_query": {q: c / found.minutes for q, c in found.statements.items()},
            }
            for who, found in found.idle.items()
        },
        "connection_goal": found.connection_goal,
        "lateness": found.late,
        "lateness_first_s": found.first,
        "lateness_broken": found.late_broken,
        "broken_p99_ratio": found.ratios,
        "missing": healthy.missing,
        "missing_broken": broken.missing,
        "load": healthy.load,
        "load_broken": broken.load,
        "cpu_cores": healthy.cpu,
        "cpu_cores_broken": broken.cpu,
        "broken_record_errors": found.broken_errors,
        "broken_phase_s": broken.seconds,
        "broken_queued": found.broken_queued,
    }


def _missed_notes(found: Findings) -> list[str]:
    """For each goal missed, what missed it and what would close it."""
    met_goals = found.met_goals
    notes: list[str] = []
    if not met_goals["broken"]:
        notes.append(
            f"What would close the broken-pair goal: pair {BROKEN}'s record statements failed "
            f"{found.broken_errors / found.broken.seconds:.0f} times a second, "
            "and the reactors' process "
            f"used {found.broken.cpu['reactor process']:.2f} cores against "
            f"{found.healthy.cpu['reactor process']:.2f} when healthy. A failed record is retried "
            "for each of its jobs a second later (the recorder's error retry), so a pair whose "
            "table is gone keeps every one of its jobs cycling; a pair whose statements all "
            "fail alike (an error no row causes: a missing table, a privilege) could back off "
            "as a whole, trying one statement per growing interval, and leave the process and "
            "the pool to the others."
        )
    if not met_goals["connections"]:
        pooled = found.one.connections.get("reactor-pool", 0)
        notes.append(
            f"The connection goal was missed by the pool's idle connections ({pooled} at the "
            "window's end). Start-up runs every pair's first duties at once, so the shared "
            "pool grows further than one pair's, and psycopg_pool closes one unused connection "
            f"per max_idle ({POOL_MAX_IDLE_S:g} s): where it ends up at the window's end depends "
            "on how far start-up grew it. Nothing used it while idle: every statement counted "
            "above is a health check on the LISTEN connection."
        )
    if not met_goals["idle"]:
        notes.append(
            f"The idle goal was missed: {found.one.health_checks_per_min():.1f} "
            "health checks/min in "
            "the one process; the shared LISTEN session sends one per probe interval for "
            "every pair while it is proven, so more means it was not carrying them."
        )
    return notes


def _notes(
    one: Idle,
    fleet: Idle,
    healthy: Phase,
    broken: Phase,
    broken_errors: float,
    broken_queued: int,
    window: float,
) -> list[str]:
    notes = [
        f"Connections at the end of the idle window, by application_name: one process "
        f"{_listed(one.connections)}; a fleet per pair {_listed(fleet.connections)}. The one "
        "process holds one LISTEN connection for its three pairs; each pool grows at start "
        "(every pair's first duties run at once) and closes one idle connection beyond its "
        f"first every {POOL_MAX_IDLE_S:g} s (max_idle), so how far it has shrunk by the "
        "window's end depends on how far it grew.",
        f"What the one process sent while idle, per minute: {_top(one)}.",
        f"Idle figures come from one window of {window:g} s, one run, on a machine shared "
        "with the server; the reconcile pass (once per 10 min per pair) may or may not fall "
        "inside a window this short.",
        "Lateness is the audit trigger's write time (clock_timestamp()) minus updated_at + "
        "grace, by the database clock, for every job finished in the phase after its first "
        f"{FIRST_S:g} s; that second is shown on its own, since each phase starts after the "
        "pool has idled down (max_idle) and psycopg_pool opens the connections a burst needs "
        "one at a time, so its first jobs wait for them. The load "
        "generator is a child process (python -m bench.pairs) with one connection per pair, "
        "finishing one job per statement on an absolute schedule, the pairs' schedules "
        f"staggered within each interval; it fell behind its schedule by at most "
        f"{healthy.behind * 1000:.1f} ms (healthy) and {broken.behind * 1000:.1f} ms "
        f"(broken). CPU while the load ran, in cores: healthy {_cores(healthy.cpu)}; broken "
        f"{_cores(broken.cpu)}.",
    ]
    if max(healthy.behind, broken.behind) > SATURATED_S:
        notes.append(
            f"The load generator fell more than {SATURATED_S * 1000:g} ms behind its own "
            "schedule: the machine was saturated (the server, the reactors' process and the "
            "generator share its cores), so the lateness tails measure the machine as much as "
            "the reactor, and can move from one run to the next by more than a broken pair "
            "moves them."
        )
    return [
        *notes,
        f"Pair {BROKEN} was broken by dropping its runs table, and kept getting the same "
        f"load: every record statement of its failed ({broken_errors:.0f} failed record "
        f"statements during the phase, {broken_queued} of its jobs still queued at the end), "
        "while pairs a and b shared its process and pool. 'Unchanged' means every job "
        f"recorded and a p99 within {UNCHANGED:g}x of the healthy phase's, or within "
        f"{SLACK_S * 1000:g} ms of it.",
        "The fleet per pair is three reactors in this process, each with its own pool and "
        "LISTEN connection: the same connections and statements three processes would make.",
    ]


def _cores(cpu: dict[str, float]) -> str:
    return ", ".join(f"{who} {share:.2f}" for who, share in cpu.items())


def _listed(found: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(found.items())) or "none"


def _top(found: Idle) -> str:
    top = sorted(found.statements.items(), key=lambda item: -item[1])[:6]
    listed = "; ".join(f"{calls / found.minutes:.2f} x `{_short(q)}`" for q, calls in top)
    pool = f"{found.pool_checks / found.minutes:.2f} x pool check"
    return f"{listed}; {pool}" if listed else pool


def _short(query: str) -> str:
    text = " ".join(query.split())
    return text if len(text) <= 60 else text[:57] + "..."


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"
