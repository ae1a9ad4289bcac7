"""deadlines: the reactor's deadlines at a million pending jobs.

Memory per entry (tracemalloc) and operations per second for ``reactor.core.deadlines.Deadlines``,
against the obvious alternative: one asyncio ``loop.call_later`` handle per job, kept in a dict
so that a job can be re-armed (last write wins); and against the keyed binary heap it replaced,
kept here as :class:`KeyedHeap`. Deadlines arrive as the reactor makes them: receipt time plus a
constant grace, so nearly in order. No PostgreSQL is involved.

Keys come two ways: job ids as the text the listener hands over today (``Deadlines`` holds
those as 128-bit ints and gives the text back), and as ints made by the caller.
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import math
import random
import statistics
import time
import tracemalloc
import uuid
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import anyio

from bench.result import Context, Result, Table, conditions
from bench.stats import ratio, safe_div
from reactor.testing import Deadlines

TITLE = "Deadlines at 1M pending: memory per entry and operations per second"
GOAL = (
    "with int keys: <= 150 bytes per entry (key and time included) and >= 1M schedule and pop "
    "operations/s"
)

BATCH = 500  # the service pops due keys in batches of REACTOR_BATCH_SIZE


class _Key(Hashable, Protocol):
    def __lt__(self, other: Any, /) -> bool: ...


K = TypeVar("K", bound=_Key)


class KeyedHeap(Generic[K]):
    """The reactor's deadlines before the FIFO: every entry a (when, key) tuple in one heap.

    An entry is live when the key's deadline in ``_when`` is the very float object it holds;
    replaced ones are skipped when they reach the top.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, K]] = []
        self._when: dict[K, float] = {}

    def schedule(self, key: K, when: float) -> bool:
        """Set ``key`` to fire at ``when``; return True if it is now the head."""
        when = float(when)
        self._when[key] = when
        heapq.heappush(self._heap, (when, key))
        if len(self._heap) > 2 * len(self._when) + 64:
            self._heap = [(w, k) for k, w in self._when.items()]
            heapq.heapify(self._heap)
        while self._when.get(self._heap[0][1]) is not self._heap[0][0]:
            heapq.heappop(self._heap)
        return self._heap[0][1] == key and self._heap[0][0] is when

    def pop_due(self, now: float, limit: int | None = None) -> list[K]:
        """Remove and return the keys due at ``now``, earliest first."""
        due: list[K] = []
        while self._heap and (limit is None or len(due) < limit):
            when, key = self._heap[0]
            if self._when.get(key) is not when:
                heapq.heappop(self._heap)
                continue
            if when > now:
                break
            heapq.heappop(self._heap)
            del self._when[key]
            due.append(key)
        return due


class CallLater:
    """The alternative: one loop.call_later handle per job, in a dict for re-arming."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fired: list[Any]) -> None:
        self.loop = loop
        self.fired = fired
        self.handles: dict[Any, asyncio.TimerHandle] = {}

    def schedule(self, key: Any, when: float) -> None:
        """Arm (or re-arm) ``key`` at loop time ``when``."""
        old = self.handles.get(key)
        if old is not None:
            old.cancel()
        self.handles[key] = self.loop.call_at(when, self.fired.append, key)


@dataclass
class Figures:
    """One structure's measurements."""

    label: str
    keys_given: str
    keys_held: str
    bytes_per_entry: float
    schedule_ops: float
    reschedule_ops: float
    pop_ops: float


async def run(ctx: Context) -> Result:
    """Measure the structures at the same size, one after another."""
    n = 20_000 if ctx.quick else 1_000_000
    reps = 3
    rng = random.Random(5)
    str_keys = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n)]
    int_keys = [uuid.UUID(k).int for k in str_keys]
    # Receipt time + grace: increasing, with the jitter of notifications arriving together.
    times = [1000.0 + i * 1e-5 + rng.uniform(0, 1e-6) for i in range(n)]
    times.sort()
    later = [t + 0.5 for t in times]

    def measure_all() -> list[Figures]:
        # In a thread of its own: call_later needs an event loop, and this one is running.
        return [
            _measure("reactor Deadlines", ("int", "int"), int_keys, times, later, reps, Deadlines),
            _measure("reactor Deadlines", ("str", "int"), str_keys, times, later, reps, Deadlines),
            _measure(
                "keyed heap (before)", ("str", "str"), str_keys, times, later, reps, KeyedHeap
            ),
            _measure_call_later(str_keys, times, later, reps),
        ]

    rows = await anyio.to_thread.run_sync(measure_all)
    current, text, before, alternative = rows
    met = current.bytes_per_entry <= 150 and current.schedule_ops >= 1e6 and current.pop_ops >= 1e6
    table = _table(rows, alternative)
    notes = _notes(n, reps, text)
    headline = (
        f"Deadlines with int keys: {current.bytes_per_entry:.0f} B/entry, "
        f"{_rate(current.schedule_ops)} schedule/s, {_rate(current.pop_ops)} pop/s; "
        f"job ids as text: {text.bytes_per_entry:.0f} B, {_rate(text.schedule_ops)} / "
        f"{_rate(text.pop_ops)}; keyed heap before: {before.bytes_per_entry:.0f} B, "
        f"{_rate(before.schedule_ops)} / {_rate(before.pop_ops)}; call_later "
        f"{alternative.bytes_per_entry:.0f} B, {_rate(alternative.schedule_ops)} schedule/s"
    )
    return Result(
        met=met,
        headline=headline,
        table=table,
        figures={"entries": n, "structures": [f.__dict__ for f in rows]},
        settings={"entries": n, "repetitions": reps, "pop_batch": BATCH},
        conditions=await conditions(
            None, quick=ctx.quick, note="pure Python, no PostgreSQL involved"
        ),
        notes=notes,
    )


def _table(rows: list[Figures], alternative: Figures) -> Table:
    """Each structure's memory and rates, against call_later's."""
    table = Table(
        [
            "structure",
            "keys given as",
            "held as",
            "bytes/entry (all held)",
            "schedule ops/s",
            "re-arm ops/s",
            "pop ops/s",
            "memory vs call_later",
            "schedule vs call_later",
        ]
    )
    for f in rows:
        table.add(
            f.label,
            f.keys_given,
            f.keys_held,
            f"{f.bytes_per_entry:.0f}",
            _rate(f.schedule_ops),
            _rate(f.reschedule_ops),
            _rate(f.pop_ops),
            ratio(safe_div(f.bytes_per_entry, alternative.bytes_per_entry)),
            ratio(safe_div(f.schedule_ops, alternative.schedule_ops)),
        )
    return table


def _notes(n: int, reps: int, text: Figures) -> list[str]:
    """How memory and rates are measured, what Deadlines is, and what text keys cost."""
    return [
        f"{n:,} pending entries. Memory: what the structure holds once filled, by tracemalloc, "
        "with each key and each deadline made fresh as the service makes them (the text of a "
        "notification, clock() + grace), so a held key or float counts and one dropped "
        "does not: a job id costs 85 bytes as a str and 44 as an int, a deadline 24.",
        f"ops/s: median of {reps} runs with the garbage collector on, as in the service. "
        f"schedule = arming {n:,} new keys in arrival order on an empty structure; pop = "
        f"pop_due(now, limit={BATCH}) until those are gone; re-arm = arming every key of a "
        "fresh structure again, 0.5 s later (last write wins), which sends most of them to the "
        "heap. For call_later, re-arm is cancel + call_at, and pop is the event loop firing "
        "the callbacks.",
        "Deadlines: a FIFO (two deques, keys and times) for deadlines that arrive in time order "
        "(receipt + a constant grace, which is nearly all of them), popped from the front at "
        "O(1); a heap only for one earlier than the last appended (a retry, a re-arm to an "
        "earlier time); pop_due takes the earlier head. Job ids given as text are held as "
        "ints, so the text is parsed on the way in and rebuilt on the way out.",
        f"The service passes job ids as text today: {text.bytes_per_entry:.0f} bytes/entry, "
        f"{_rate(text.schedule_ops)} schedules/s and {_rate(text.pop_ops)} pops/s: parsing the "
        "text on the way in and rebuilding it on the way out cost more than the structure's "
        "own work. A listener that hands over ints (it validates the UUID already) and a "
        "recorder that turns them back into text take that cost out of the timer path.",
    ]


def _rate(ops: float) -> str:
    return f"{ops / 1e6:.2f}M"


def _fresh(key: Any) -> Any:
    """A new object equal to ``key``, as a notification's payload is."""
    return key.lower() if isinstance(key, str) else key ^ 0


class _Schedules(Protocol):
    def schedule(self, key: Any, when: float, /) -> Any: ...

    def pop_due(self, now: float, limit: int | None = None, /) -> list[Any]: ...


def _measure(
    label: str,
    kinds: tuple[str, str],
    keys: list[Any],
    times: list[float],
    later: list[float],
    reps: int,
    make: Callable[[], _Schedules],
) -> Figures:
    def fill() -> _Schedules:
        d = make()
        for key, when in zip(keys, times, strict=True):
            d.schedule(key, when)
        return d

    def fill_fresh() -> _Schedules:
        d = make()
        for key, when in zip(keys, times, strict=True):
            d.schedule(_fresh(key), when + 0.0)
        return d

    memory = _traced(fill_fresh)
    schedule, rearm, pop = [], [], []
    for _ in range(reps):
        # Arm N keys on a fresh structure, then pop them all: the reactor's normal life.
        gc.collect()
        started = time.perf_counter()
        d = fill()
        schedule.append(time.perf_counter() - started)
        started = time.perf_counter()
        while d.pop_due(math.inf, BATCH):
            pass
        pop.append(time.perf_counter() - started)
        # Re-arm every key of another fresh structure to a later time (last write wins).
        d = fill()
        gc.collect()
        started = time.perf_counter()
        for key, when in zip(keys, later, strict=True):
            d.schedule(key, when)
        rearm.append(time.perf_counter() - started)
        del d
    n = len(keys)
    return Figures(
        label=label,
        keys_given=kinds[0],
        keys_held=kinds[1],
        bytes_per_entry=memory / n,
        schedule_ops=n / statistics.median(schedule),
        reschedule_ops=n / statistics.median(rearm),
        pop_ops=n / statistics.median(pop),
    )


def _measure_call_later(
    keys: list[str], times: list[float], later: list[float], reps: int
) -> Figures:
    def fill(loop: asyncio.AbstractEventLoop, base: float, fresh: bool = False) -> CallLater:
        c = CallLater(loop, [])
        for key, when in zip(keys, times, strict=True):
            c.schedule(_fresh(key) if fresh else key, base + when - times[0])
        return c

    def measure_memory() -> float:
        loop = asyncio.new_event_loop()
        try:
            return _traced(lambda: fill(loop, loop.time() + 3600.0, fresh=True))
        finally:
            _close(loop)

    memory = measure_memory()
    schedule, rearm, fire = [], [], []
    for _ in range(reps):
        loop = asyncio.new_event_loop()
        try:
            gc.collect()
            started = time.perf_counter()
            c = fill(loop, loop.time() + 3600.0)  # far in the future: nothing fires
            schedule.append(time.perf_counter() - started)
            gc.collect()
            started = time.perf_counter()
            for key, when in zip(keys, later, strict=True):
                c.schedule(key, loop.time() + 3600.0 + when)
            rearm.append(time.perf_counter() - started)
        finally:
            _close(loop)
        loop = asyncio.new_event_loop()
        try:
            c = fill(loop, loop.time() - 60.0)  # all in the past: the loop fires them all
            gc.collect()
            started = time.perf_counter()
            while len(c.fired) < len(keys):
                loop.run_until_complete(asyncio.sleep(0))
            fire.append(time.perf_counter() - started)
        finally:
            _close(loop)
    n = len(keys)
    return Figures(
        label="asyncio loop.call_later",
        keys_given="str",
        keys_held="str",
        bytes_per_entry=memory / n,
        schedule_ops=n / statistics.median(schedule),
        reschedule_ops=n / statistics.median(rearm),
        pop_ops=n / statistics.median(fire),
    )


def _close(loop: asyncio.AbstractEventLoop) -> None:
    for handle in loop._scheduled:  # type: ignore[attr-defined]  # what is left, unfired
        handle.cancel()
    loop.close()


def _traced(build: Callable[[], object]) -> float:
    """Bytes allocated (and still held) by ``build()``'s result."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        built = build()
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del built
    gc.collect()
    return float(used)
