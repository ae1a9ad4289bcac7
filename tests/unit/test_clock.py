"""The fake clock the loops' tests run on: time moves only when the test moves it."""

from __future__ import annotations

import anyio
import pytest

from reactor.core.clock import FakeClock, SystemClock

pytestmark = pytest.mark.anyio


async def test_sleepers_wake_in_time_order_each_at_its_own_time() -> None:
    clock = FakeClock(100.0)
    woke: list[tuple[str, float]] = []

    async def sleep(name: str, until: float) -> None:
        await clock.sleep_until(until)
        woke.append((name, clock.now()))

    async with anyio.create_task_group() as tg:
        tg.start_soon(sleep, "late", 103.0)
        tg.start_soon(sleep, "early", 101.0)
        await clock.advance(2.0)
        assert woke == [("early", 101.0)]
        assert clock.now() == 102.0
        await clock.advance(5.0)
    assert woke == [("early", 101.0), ("late", 103.0)]


async def test_a_wake_event_ends_the_sleep_early_and_leaves_no_sleeper() -> None:
    clock = FakeClock()
    wake = anyio.Event()
    done = anyio.Event()

    async def sleep() -> None:
        await clock.sleep_until(1_000.0, wake)
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(sleep)
        await anyio.wait_all_tasks_blocked()
        assert clock.sleepers == 1
        wake.set()
        await done.wait()
    assert clock.now() == 0.0
    assert clock.sleepers == 0


async def test_a_past_time_returns_at_once() -> None:
    clock = FakeClock(5.0)
    with anyio.fail_after(1):
        await clock.sleep_until(4.0)
        await SystemClock().sleep_until(SystemClock().now() - 1)
