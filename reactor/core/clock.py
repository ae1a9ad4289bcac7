"""The one clock the reactor's loops read and sleep on, so that a test can own the time.

Every loop compares against :meth:`Clock.now` and waits with :meth:`Clock.sleep_until`, which
returns at that time or as soon as its ``wake`` event is set, whichever comes first. The
service runs on :class:`SystemClock`, the monotonic clock the event loop uses too. Tests run the
loops on :class:`FakeClock`: time stands still until the test moves it, and moving it wakes
exactly the sleepers whose time has come, in time order, each before the next moment is
reached (trio's ``MockClock`` with autojump off).

Bounds on I/O (``anyio.fail_after`` around a statement) stay on real time: they bound how long
the server may take, which a fake clock cannot speed up.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from typing import Protocol

import anyio
import anyio.lowlevel


class Clock(Protocol):
    """Monotonic seconds, and a sleep that can be woken early."""

    def now(self) -> float:
        """The current time."""
        ...

    async def sleep_until(self, when: float, wake: anyio.Event | None = None) -> None:
        """Return at ``when`` (at once if it has passed), or when ``wake`` is set."""
        ...


class SystemClock:
    """The monotonic clock (the one asyncio's loop reads, so anyio's timeouts agree)."""

    def now(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()

    async def sleep_until(self, when: float, wake: anyio.Event | None = None) -> None:
        """Sleep until ``when`` or until ``wake`` is set."""
        delay = when - time.monotonic()
        if delay <= 0 or (wake is not None and wake.is_set()):
            await anyio.lowlevel.checkpoint()
            return
        with anyio.move_on_after(delay if math.isfinite(delay) else math.inf):
            if wake is None:
                await anyio.sleep_forever()
            else:
                await wake.wait()


class FakeClock:
    """A clock that moves only when :meth:`advance` moves it; for tests of the loops."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, anyio.Event]] = []
        self._order = itertools.count()

    def now(self) -> float:
        """The time the test set."""
        return self._now

    @property
    def sleepers(self) -> int:
        """How many tasks sleep on this clock now."""
        return sum(not event.is_set() for _, _, event in self._sleepers)

    async def sleep_until(self, when: float, wake: anyio.Event | None = None) -> None:
        """Sleep until the test moves the time to ``when``, or until ``wake`` is set."""
        if when <= self._now or (wake is not None and wake.is_set()):
            await anyio.lowlevel.checkpoint()
            return
        due = anyio.Event()
        heapq.heappush(self._sleepers, (when, next(self._order), due))
        if wake is None:
            await due.wait()
            return
        async with anyio.create_task_group() as tg:

            async def wait(event: anyio.Event) -> None:
                await event.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(wait, due)
            tg.start_soon(wait, wake)
        due.set()  # woken early: no longer a sleeper

    async def advance(self, seconds: float) -> None:
        """Move the time ``seconds`` on, waking each sleeper at its own time and letting every
        task run until it blocks before the time moves further."""
        target = self._now + seconds
        await anyio.wait_all_tasks_blocked()
        while self._sleepers and self._sleepers[0][0] <= target:
            when, _, due = heapq.heappop(self._sleepers)
            if due.is_set():
                continue
            self._now = max(self._now, when)
            due.set()
            await anyio.wait_all_tasks_blocked()
        self._now = target
        await anyio.wait_all_tasks_blocked()
