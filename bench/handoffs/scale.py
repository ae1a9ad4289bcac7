"""How big and how long each scenario of the handoffs benchmark is: the full run's, or
--quick's toy one, and the fixed figures (grace, rates, goals) every scenario shares."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reactor.testing import Settings

GRACE_S = 2.0
RATE = 50.0
FLEET_RATE = 333.0
SAVE_RATIO = 0.7
# Inside the grace, as in bench/replicas.py: a tab's save lands before the reactor's deadline.
TAB_DELAY_S = (0.1, 1.6)
WINDOW_S = 2.0  # a job "fell due around" an event when its deadline is within this of it
DEPLOY_GOAL_S = 0.020
FLEET_GOAL_S = 0.010
CPU_GROWTH = 1.2
EAGER_MAX_S = 1.0
# Eager deploys: the SIGTERM this long after the new process's start, whether it is ready or not;
# one deploy each, cycled. A replica takes about a second to be ready on a 2-core box.
EAGER_SIGTERM_AFTER_S = (0.5, 1.0, 1.5)
# The app moves the deadline of this share of the finished jobs, this share of a grace after
# their finish: the old deadline has not passed, and no notification tells anyone.
TOUCH_RATIO = 0.3
TOUCH_AT = 0.6
READY_TIMEOUT_S = 30.0
# A stopped replica drains for up to REACTOR_DRAIN_SECONDS (20 s by default), then exits.
EXIT_TIMEOUT_S = Settings.drain + 10.0
# A job late by more than this in a deploy or the fleet is an anomaly: its log lines are kept.
ANOMALY_S = 1.0

# The repository's root: where `reactor run` starts, as it would from a checkout.
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Scale:
    """How big each scenario is: the full run's, or --quick's toy one."""

    deploy_replicas: int
    deploy_seconds: float
    deploys: int
    deploy_lead: float  # load before the first deploy
    deploy_gap: float  # load after each deploy, before the next
    kill_replicas: int
    kill_seconds: float
    probe: float
    eager_replicas: tuple[int, ...]
    eager_seconds: float
    fleet_counts: tuple[int, ...]  # the last two are compared by lateness, last and first by CPU
    fleet_seconds: float
    fleet_rate: float
    side_by_side: bool  # the scenarios at once (quick: the figures only show that it runs)


FULL = Scale(
    deploy_replicas=3,
    deploy_seconds=60.0,
    deploys=3,
    deploy_lead=8.0,
    deploy_gap=10.0,
    kill_replicas=3,
    kill_seconds=60.0,
    probe=Settings.probe_interval,
    eager_replicas=(1, 3),
    eager_seconds=55.0,
    fleet_counts=(1, 3, 5),
    fleet_seconds=45.0,
    fleet_rate=FLEET_RATE,
    side_by_side=False,
)
# Quick: every process start costs about a CPU second, so fewer replicas, all scenarios at once,
# and 1 s probes; the kill comes after the victim's second check (see _kill).
QUICK = Scale(
    deploy_replicas=2,
    deploy_seconds=4.0,
    deploys=1,
    deploy_lead=1.0,
    deploy_gap=0.5,
    kill_replicas=2,
    kill_seconds=4.5,
    probe=1.0,
    eager_replicas=(1,),
    eager_seconds=4.0,
    fleet_counts=(1, 2),
    fleet_seconds=2.0,
    fleet_rate=RATE,
    side_by_side=True,
)
