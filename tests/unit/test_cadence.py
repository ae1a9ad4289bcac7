"""The periodic duties' schedule, pure and in its loop on a fake clock; no database."""

from __future__ import annotations

import math

import psycopg
import pytest

from reactor.core.clock import FakeClock
from reactor.insurance.cadence import Cadence, Scheduler, backoff, fleet_poll_interval
from tests.loops import running

pytestmark = pytest.mark.anyio


def cadence() -> Cadence:
    c = Cadence()
    c.add("health", 5.0, retry=lambda f: 0.0 if f == 1 else 5.0)
    c.add("scan", 30.0, retry=backoff(0.5, 30.0))
    return c


# -- the pure schedule ----------------------------------------------------------------------------


def test_every_duty_is_due_at_once_and_then_every_interval() -> None:
    c = cadence()
    assert sorted(c.due(0.0)) == ["health", "scan"]
    assert c.begin("health", 0.0)
    c.end("health", 0.1, ok=True)
    assert c.next_at() == -math.inf  # the scan is still due
    assert c.begin("scan", 0.0)
    assert c.next_at() == 5.0
    assert c.due(4.9) == []


def test_a_duty_never_runs_twice_at_once() -> None:
    c = cadence()
    assert c.begin("scan", 0.0)
    c.hasten("scan", 1.0)  # a scan was asked for while one runs
    assert not c.begin("scan", 1.0)
    c.end("scan", 2.0, ok=True)
    # ... and it runs again right after.
    assert "scan" in c.due(2.0)


def test_failures_back_off_by_the_duties_policy_and_success_resets() -> None:
    c = cadence()
    waits = []
    now = 0.0
    for _ in range(8):
        assert c.begin("scan", now)
        c.end("scan", now, ok=False)
        waits.append(c.duties["scan"].next_at - now)
        now = c.duties["scan"].next_at
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert c.begin("scan", now)
    c.end("scan", now, ok=True)
    assert c.duties["scan"].failures == 0
    assert c.duties["scan"].next_at == now + 30.0


def test_a_paced_duty_comes_back_later_once() -> None:
    c = cadence()
    assert c.begin("health", 0.0)
    c.pace("health", 10.0)  # the check found nothing to change
    c.end("health", 0.1, ok=True)
    assert c.due(9.9) == ["scan"]
    assert c.begin("health", 10.0)
    c.end("health", 10.1, ok=True)
    # Not paced this time: back at its own interval.
    assert c.begin("health", 15.0)


def test_pacing_never_delays_a_run_brought_forward() -> None:
    c = cadence()
    assert c.begin("health", 0.0)
    c.hasten("health", 1.0)  # the first heartbeat is wanted now
    c.pace("health", 10.0)
    c.end("health", 1.5, ok=True)
    assert "health" in c.due(1.5)
    # Nor a failure's retry.
    assert c.begin("health", 1.5)
    c.end("health", 2.0, ok=False)
    c.pace("health", 10.0)
    assert "health" in c.due(2.0)


def test_a_duty_may_ask_to_come_back_sooner_never_later() -> None:
    c = cadence()
    assert c.begin("scan", 0.0)
    c.end("scan", 1.0, ok=True, next_in=0.25)
    assert c.duties["scan"].next_at == 1.25
    assert c.begin("scan", 1.25)
    c.end("scan", 2.0, ok=True, next_in=100.0)
    assert c.duties["scan"].next_at == 31.25


# -- the scheduler on a fake clock ----------------------------------------------------------------


class Runs:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.at: dict[str, list[float]] = {"health": [], "scan": []}
        self.fail_scan = 0
        self.failures: list[str] = []

    def action(self, name: str):  # type: ignore[no-untyped-def]  # a test's closure factory
        async def run() -> None:
            self.at[name].append(self.clock.now())
            if name == "scan" and self.fail_scan:
                self.fail_scan -= 1
                raise psycopg.OperationalError("server closed the connection")

        return run


def on_a_fake_clock() -> tuple[FakeClock, Runs, Scheduler]:
    """A clock at 0, the record of the duties' runs, and a scheduler of both duties on it."""
    clock = FakeClock()
    runs = Runs(clock)
    return clock, runs, scheduler(clock, runs)


def scheduler(clock: FakeClock, runs: Runs) -> Scheduler:
    return Scheduler(
        cadence(),
        clock,
        {name: runs.action(name) for name in ("health", "scan")},
        on_failure=lambda name, error: runs.failures.append(name),
        failures=(psycopg.Error, OSError),
    )


async def test_the_loop_runs_each_duty_on_its_interval() -> None:
    clock, runs, s = on_a_fake_clock()
    async with running(s):
        await clock.advance(60.0)
    assert runs.at["health"] == [0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0, 45.0, 50.0,
                                 55.0, 60.0]  # fmt: skip
    assert runs.at["scan"] == [0.0, 30.0, 60.0]


async def test_a_hastened_duty_runs_at_once_and_keeps_its_interval_after() -> None:
    clock, runs, s = on_a_fake_clock()
    async with running(s):
        await clock.advance(7.0)
        s.hasten("scan")
        await clock.advance(31.0)
    assert runs.at["scan"] == [0.0, 7.0, 37.0]


async def test_a_failed_duty_is_retried_by_its_policy() -> None:
    clock, runs, s = on_a_fake_clock()
    runs.fail_scan = 3
    async with running(s):
        await clock.advance(10.0)
    assert runs.at["scan"] == [0.0, 0.5, 1.5, 3.5]
    assert runs.failures == ["scan"] * 3


async def test_a_held_duty_is_left_to_its_holder_who_hears_of_its_changes() -> None:
    clock, runs, s = on_a_fake_clock()
    woken: list[str] = []
    s.hold("health", lambda: woken.append("changed"))
    # Never due here: its holder begins it, through the cadence.
    assert s.cadence.due(0.0) == ["scan"]
    s.hasten("health")
    s.pace("health", 10.0)
    async with running(s):
        await clock.advance(60.0)
    assert runs.at["health"] == []
    assert runs.at["scan"] == [0.0, 30.0, 60.0]
    # Hastened, paced, and closed: each time the holder's loop has something to look at.
    assert woken == ["changed", "changed", "changed"]
    assert "health" not in s.cadence.due(math.inf)


@pytest.mark.parametrize(
    ("live", "grace", "interval"),
    [
        (0, 120.0, 0.25),  # before the first heartbeat: one replica's
        (1, 120.0, 0.25),
        (5, 120.0, 1.25),  # five replicas: the fleet polls four times a second in all
        (5, 2.0, 1.0),  # at most half the grace, so that every job is read before it is due
        (3, 0.3, 0.25),  # never less often than one replica alone
    ],
)
def test_a_fleet_polls_as_often_as_one_replica(live: int, grace: float, interval: float) -> None:
    assert fleet_poll_interval(0.25, live, grace) == pytest.approx(interval)
