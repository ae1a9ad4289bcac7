"""What the handoffs scenarios found, read once: each scenario's figures, the problems and
anomalies they reported, and whether each goal was met."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.handoffs.scale import (
    CPU_GROWTH,
    DEPLOY_GOAL_S,
    EAGER_MAX_S,
    FLEET_GOAL_S,
    Scale,
)
from bench.stats import ms, safe_div


@dataclass(frozen=True)
class Findings:
    """Every scenario's figures by name, with the verdicts drawn from them."""

    scale: Scale
    scenarios: dict[str, dict[str, Any]]
    logs: Path

    @property
    def deploy(self) -> dict[str, Any]:
        """The rolling deploys."""
        return self.scenarios["deploy"]

    @property
    def kill(self) -> dict[str, Any]:
        """The replica killed for good."""
        return self.scenarios["kill"]

    @property
    def spread(self) -> dict[str, Any]:
        """The largest fleet with the trigger spread."""
        return self.scenarios["spread"]

    @property
    def eagers(self) -> list[dict[str, Any]]:
        """The eager deploys, by replica count."""
        return [self.scenarios[f"eager{n}"] for n in self.scale.eager_replicas]

    @property
    def fleets(self) -> list[dict[str, Any]]:
        """The fleets, smallest first."""
        return [self.scenarios[f"fleet{n}"] for n in self.scale.fleet_counts]

    @property
    def first(self) -> int:
        """The smallest fleet's replica count."""
        return self.scale.fleet_counts[0]

    @property
    def small(self) -> int:
        """The next to largest fleet's replica count."""
        return self.scale.fleet_counts[-2]

    @property
    def large(self) -> int:
        """The largest fleet's replica count."""
        return self.scale.fleet_counts[-1]

    @property
    def problems(self) -> list[str]:
        """Every scenario's problems, each prefixed with its scenario."""
        return [f"{name}: {p}" for name, s in self.scenarios.items() for p in s["outcome"].problems]

    @property
    def anomalies(self) -> list[str]:
        """Every scenario's jobs late by seconds, each prefixed with its scenario."""
        return [f"{name}: {a}" for name, s in self.scenarios.items() for a in s["anomalies"]]

    @property
    def logs_note(self) -> str:
        """Where the replicas' logs are, if they were kept."""
        if self.problems or self.anomalies:
            return f"The replicas' logs are kept in {self.logs} for the problems and anomalies."
        return "No problem and no job late by seconds: the replicas' logs were deleted."

    @property
    def cpu(self) -> dict[int, dict[str, float]]:
        """The replicas' and the server's CPU per 1,000 jobs, by fleet size."""
        return {f["replicas"]: f["cpu_per_1000_jobs"] for f in self.fleets}

    @property
    def growth(self) -> float:
        """The largest fleet's p99 over the next to largest's."""
        by_count = {f["replicas"]: f for f in self.fleets}
        p99_small, p99_large = (by_count[n]["lateness"]["p99"] for n in (self.small, self.large))
        return safe_div(p99_large, p99_small)

    @property
    def cpu_growth(self) -> float:
        """The largest fleet's CPU per 1,000 jobs over the smallest's."""
        cpu = self.cpu
        return safe_div(cpu[self.large]["replicas_s"], cpu[self.first]["replicas_s"])

    @property
    def kill_ok(self) -> bool:
        """Whether every job due after the kill was recorded within the bound."""
        kill = self.kill
        return not kill["after_kill"]["max"] > kill["bound_s"]  # NaN (none due) is no miss

    @property
    def met(self) -> bool:
        """Whether every goal was met, with no problem."""
        deploy, eagers = self.deploy, self.eagers
        deploy_ok = (
            deploy["all"]["p99"] <= DEPLOY_GOAL_S
            and deploy["around_sigterm"]["p99"] <= DEPLOY_GOAL_S
        )
        eager_ok = all(
            e["all"]["p99"] <= DEPLOY_GOAL_S and e["all"]["max"] <= EAGER_MAX_S for e in eagers
        )
        p99_worst = max(f["lateness"]["p99"] for f in self.fleets)
        fleet_ok = p99_worst <= FLEET_GOAL_S and self.cpu_growth <= CPU_GROWTH
        return deploy_ok and eager_ok and self.kill_ok and fleet_ok and not self.problems


def p99_mark(value: float, goal: float) -> str:
    verdict = "met" if value <= goal else "missed"
    return f"p99 <= {ms(goal)}: {verdict}"


def n_replicas(count: int) -> str:
    return f"{count} replica" + ("" if count == 1 else "s")


def n_times(count: int) -> str:
    return {1: "once", 2: "twice", 3: "three times"}.get(count, f"{count} times")
