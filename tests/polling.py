"""Waiting for state another party owns: a database row, another process, a server's socket.

Where an event can be awaited, tests await it. These are for the rest: :func:`eventually` from
async code, :func:`wait_for` from sync code; both return what ``check`` returned once truthy.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

import anyio


async def eventually(
    check: Callable[[], Any],
    *,
    timeout: float = 10.0,  # noqa: ASYNC109 -- a polling helper: the bound is its whole point
    interval: float = 0.02,
) -> Any:
    """Poll ``check`` until it returns something truthy, at most ``timeout`` seconds. A
    ``check`` that returns an awaitable is awaited: one that must not block the event loop (the
    replicas it watches run in it) can do its work in a thread."""
    with anyio.fail_after(timeout):
        while True:
            result = check()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return result
            await anyio.sleep(interval)


def wait_for(
    check: Callable[[], Any],
    timeout: float = 20.0,
    what: str = "the condition",
    interval: float = 0.05,
) -> Any:
    """Poll ``check`` until truthy, at most ``timeout`` seconds; AssertionError naming
    ``what`` past it."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(interval)
