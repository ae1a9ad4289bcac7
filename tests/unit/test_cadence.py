"""The periodic duties' schedule, pure and in its loop on a fake clock; no database."""

from __future__ import annotations

import math

import anyio
import psycopg
import pytest

from reactor.cadence import Cadence, Carrier, Scheduler, backoff
from reactor.clock import FakeClock

pytestmark = pytest.mark.anyio


def cadence() -> Cadence:
    c = Cadence()
    c.add("health", 5.0, retry=lambda f: 0.0 if f == 1 else 5.0, listener_may_carry=True)
    c.add("scan", 30.0, retry=backoff(0.5, 30.0))
    return c


# -- the pure schedule ----------------------------------------------------------------------------


def test_every_duty_is_due_at_once_and_then_every_interval() -> None:
    c = cadence()
    assert sorted(c.due(0.0, "pool")) == ["health", "scan"]
    assert c.begin("health", "pool", 0.0)
    c.end("health", "pool", 0.1, ok=True)
    assert c.next_at("pool") == -math.inf  # the scan is still due
    assert c.begin("scan", "pool", 0.0)
    assert c.next_at("pool") == 5.0
    assert c.due(4.9, "pool") == []


def test_a_duty_never_runs_twice_at_once() -> None:
    c = cadence()
    assert c.begin("scan", "pool", 0.0)
    c.hasten("scan", 1.0)  # a scan was asked for while one runs
    assert not c.begin("scan", "pool", 1.0)
    c.end("scan", "pool", 2.0, ok=True)
    # ... and it runs again right after.
    assert "scan" in c.due(2.0, "pool")


def test_the_listener_carries_the_check_only_while_proven() -> None:
    c = cadence()
    c.listener_carries = True
    assert c.due(0.0, "pool") == ["scan"]
    assert c.due(0.0, "listener") == ["health"]
    assert c.begin("health", "listener", 0.0)
    # The listener is lost mid-check: the pool may not start a second one meanwhile.
    c.listener_carries = False
    assert not c.begin("health", "pool", 0.0)
    c.end("health", "listener", 0.5, ok=False)
    # The failure policy: the pool checks at once.
    assert "health" in c.due(0.5, "pool")


def test_a_stale_token_cannot_end_another_roads_run() -> None:
    c = cadence()
    assert c.begin("health", "pool", 0.0)
    c.end("health", "listener", 1.0, ok=False)  # not the listener's run
    assert c.duties["health"].running == "pool"


def test_failures_back_off_by_the_duties_policy_and_success_resets() -> None:
    c = cadence()
    waits = []
    now = 0.0
    for _ in range(8):
        assert c.begin("scan", "pool", now)
        c.end("scan", "pool", now, ok=False)
        waits.append(c.duties["scan"].next_at - now)
        now = c.duties["scan"].next_at
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert c.begin("scan", "pool", now)
    c.end("scan", "pool", now, ok=True)
    assert c.duties["scan"].failures == 0
    assert c.duties["scan"].next_at == now + 30.0


def test_a_paced_duty_comes_back_later_once() -> None:
    c = cadence()
    assert c.begin("health", "pool", 0.0)
    c.pace("health", 10.0)  # the check found nothing to change
    c.end("health", "pool", 0.1, ok=True)
    assert c.due(9.9, "pool") == ["scan"]
    assert c.begin("health", "pool", 10.0)
    c.end("health", "pool", 10.1, ok=True)
    # Not paced this time: back at its own interval.
    assert c.begin("health", "pool", 15.0)


def test_pacing_never_delays_a_run_brought_forward() -> None:
    c = cadence()
    assert c.begin("health", "pool", 0.0)
    c.hasten("health", 1.0)  # the first heartbeat is wanted now
    c.pace("health", 10.0)
    c.end("health", "pool", 1.5, ok=True)
    assert "health" in c.due(1.5, "pool")
    # Nor a failure's retry.
    assert c.begin("health", "pool", 1.5)
    c.end("health", "pool", 2.0, ok=False)
    c.pace("health", 10.0)
    assert "health" in c.due(2.0, "pool")


def test_a_duty_may_ask_to_come_back_sooner_never_later() -> None:
    c = cadence()
    assert c.begin("scan", "pool", 0.0)
    c.end("scan", "pool", 1.0, ok=True, next_in=0.25)
    assert c.duties["scan"].next_at == 1.25
    assert c.begin("scan", "pool", 1.25)
    c.end("scan", "pool", 2.0, ok=True, next_in=100.0)
    assert c.duties["scan"].next_at == 31.25


# -- the scheduler on a fake clock ----------------------------------------------------------------


class Runs:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.at: dict[str, list[float]] = {"health": [], "scan": []}
        self.fail_scan = 0
        self.failures: list[tuple[str, Carrier]] = []

    def action(self, name: str):  # type: ignore[no-untyped-def]  # a test's closure factory
        async def run() -> None:
            self.at[name].append(self.clock.now())
            if name == "scan" and self.fail_scan:
                self.fail_scan -= 1
                raise psycopg.OperationalError("server closed the connection")

        return run


def scheduler(clock: FakeClock, runs: Runs) -> Scheduler:
    return Scheduler(
        cadence(),
        clock,
        {name: runs.action(name) for name in ("health", "scan")},
        on_failure=lambda name, carrier, error: runs.failures.append((name, carrier)),
    )


async def test_the_loop_runs_each_duty_on_its_interval() -> None:
    clock = FakeClock()
    runs = Runs(clock)
    s = scheduler(clock, runs)
    async with anyio.create_task_group() as tg:
        tg.start_soon(s.run, tg)
        await clock.advance(60.0)
        s.close()
    assert runs.at["health"] == [0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0, 45.0, 50.0,
                                 55.0, 60.0]  # fmt: skip
    assert runs.at["scan"] == [0.0, 30.0, 60.0]


async def test_a_hastened_duty_runs_at_once_and_keeps_its_interval_after() -> None:
    clock = FakeClock()
    runs = Runs(clock)
    s = scheduler(clock, runs)
    async with anyio.create_task_group() as tg:
        tg.start_soon(s.run, tg)
        await clock.advance(7.0)
        s.hasten("scan")
        await clock.advance(31.0)
        s.close()
    assert runs.at["scan"] == [0.0, 7.0, 37.0]


async def test_a_failed_duty_is_retried_by_its_policy() -> None:
    clock = FakeClock()
    runs = Runs(clock)
    runs.fail_scan = 3
    s = scheduler(clock, runs)
    async with anyio.create_task_group() as tg:
        tg.start_soon(s.run, tg)
        await clock.advance(10.0)
        s.close()
    assert runs.at["scan"] == [0.0, 0.5, 1.5, 3.5]
    assert runs.failures == [("scan", "pool")] * 3


async def test_the_listener_road_holds_the_token_and_hands_it_back() -> None:
    clock = FakeClock()
    runs = Runs(clock)
    s = scheduler(clock, runs)
    async with anyio.create_task_group() as tg:
        tg.start_soon(s.run, tg)
        await clock.advance(1.0)  # the pool's first check, at 0
        s.carry(True)
        await clock.advance(9.0)  # the listener carries it: the pool runs none
        assert runs.at["health"] == [0.0]
        assert await s.run_duty("health", "listener", runs.action("health"))
        assert not await s.run_duty("health", "listener", runs.action("health"))  # not due
        s.carry(False)  # lost: the pool takes the check back on schedule
        await clock.advance(5.0)
        s.close()
    assert runs.at["health"] == [0.0, 10.0, 15.0]


async def test_a_failure_on_the_listener_road_is_raised_and_the_pool_checks_at_once() -> None:
    clock = FakeClock()
    calls: list[float] = []

    async def broken() -> None:
        raise psycopg.OperationalError("connection lost")

    async def pooled() -> None:
        calls.append(clock.now())

    c = cadence()
    s = Scheduler(c, clock, {"health": pooled, "scan": pooled}, on_failure=lambda *args: None)
    async with anyio.create_task_group() as tg:
        s.carry(True)
        tg.start_soon(s.run, tg)
        await clock.advance(2.0)
        calls.clear()  # the scan
        with pytest.raises(psycopg.OperationalError):
            await s.run_duty("health", "listener", broken)
        s.carry(False)
        await clock.advance(0.0)
        s.close()
    assert calls == [2.0]
