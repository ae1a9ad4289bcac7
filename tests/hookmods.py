"""Hooks for the tests, importable as ``tests.hookmods:NAME``.

In-process tests read and reset the module state; subprocess tests get a log file
(``HOOK_LOG``) with one line per event, and a file whose existence releases ``block``
(``HOOK_RELEASE``).
"""

from __future__ import annotations

import os
import time
from collections import Counter

import anyio

from reactor.hooks import HookCall

calls: list[tuple[str, int, float]] = []  # (idempotency key, attempt, monotonic time)
done: Counter[str] = Counter()  # successful calls per idempotency key
fail_times = 2


def reset(failures: int = 2) -> None:
    """Forget every call; ``flaky`` fails ``failures`` times per key."""
    global fail_times
    calls.clear()
    done.clear()
    fail_times = failures


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


def not_async(call: HookCall) -> None:
    """A plain function: configuring it must be rejected."""
