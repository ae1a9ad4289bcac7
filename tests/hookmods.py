"""Hooks for the tests, importable as ``tests.hookmods:NAME``.

In-process tests read and reset the module state; subprocess tests get a log file
(``HOOK_LOG``) with one line per event, and a file whose existence releases ``block``
(``HOOK_RELEASE``).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections import Counter

import anyio

from reactor.hooks import HookCall

calls: list[tuple[str, int, float]] = []  # (idempotency key, attempt, monotonic time)
done: Counter[str] = Counter()  # successful calls per idempotency key
fail_times = 2


# For the plain-def hooks, which run in a worker thread: set when one starts, and what lets it
# finish.
started = threading.Event()
release = threading.Event()


def reset(failures: int = 2) -> None:
    """Forget every call; ``flaky`` fails ``failures`` times per key."""
    global fail_times
    calls.clear()
    done.clear()
    fail_times = failures
    started.clear()
    release.clear()


async def count(call: HookCall) -> None:
    """Succeeds, counting."""
    calls.append((call.idempotency_key, call.attempt, time.monotonic()))
    done[call.idempotency_key] += 1


async def flaky(call: HookCall) -> None:
    """Fails the first ``fail_times`` calls for each key, then succeeds."""
    calls.append((call.idempotency_key, call.attempt, time.monotonic()))
    if sum(1 for key, _, _ in calls if key == call.idempotency_key) <= fail_times:
        raise RuntimeError("judge unavailable")
    done[call.idempotency_key] += 1


async def always_fail(call: HookCall) -> None:
    """Never succeeds."""
    calls.append((call.idempotency_key, call.attempt, time.monotonic()))
    raise RuntimeError("judge says no")


async def block(call: HookCall) -> None:
    """Logs its start, waits for the HOOK_RELEASE file, logs its end (subprocess tests)."""
    log = anyio.Path(os.environ["HOOK_LOG"])
    async with await log.open("a") as f:
        await f.write(f"start {call.idempotency_key} {call.attempt} {os.getpid()}\n")
    release = anyio.Path(os.environ["HOOK_RELEASE"])
    while not await release.exists():  # noqa: ASYNC110 -- another process releases it
        await anyio.sleep(0.02)
    async with await log.open("a") as f:
        await f.write(f"done {call.idempotency_key} {call.attempt} {os.getpid()}\n")


def blocking(call: HookCall) -> None:
    """A plain def that blocks its thread until the test sets ``release`` (10 s at most)."""
    calls.append((call.idempotency_key, call.attempt, time.monotonic()))
    started.set()
    if not release.wait(timeout=10):
        raise TimeoutError("the test never released the hook")
    done[call.idempotency_key] += 1


async def hogs_the_loop(call: HookCall) -> None:
    """The bug the reactor guards against: blocking code inside an async def."""
    calls.append((call.idempotency_key, call.attempt, time.monotonic()))
    time.sleep(0.25)  # noqa: ASYNC251 -- the blocking call is the point
    done[call.idempotency_key] += 1


def holds_the_gil(call: HookCall) -> None:
    """A plain def whose C call keeps the GIL for 0.3 s (as some extensions do), so even in a
    thread it starves the event loop. PyDLL calls a C function without releasing the GIL."""
    calls.append((call.idempotency_key, call.attempt, time.monotonic()))
    ctypes.PyDLL(None).usleep(300_000)
    done[call.idempotency_key] += 1


not_a_function = 42
