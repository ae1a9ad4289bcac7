"""The event loop's watch over a hook's code: a hook must not stall the reactor.

Every timer and notification of the reactor waits while a hook's code holds the event loop.
:class:`LoopGuard` times each step of an ``async def`` hook and reports one that held the loop
too long; :func:`in_thread` runs a plain ``def`` in a daemon thread of its own and watches the
loop's punctuality meanwhile, since a thread that keeps the GIL starves the loop just the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import anyio

from reactor.hooks.call import HookCall

log = logging.getLogger("reactor.hooks")

# A hook step that keeps the event loop longer than this is logged with the hook's name: it
# delays every timer and notification of the reactor by as much.
BLOCK_LIMIT_S = 0.1
# How often a threaded hook's watchdog looks at the loop's punctuality.
_WATCH_TICK_S = 0.05
ASYNC_HINT = "blocking code in an async def: make it async all the way, or a plain def"
_GIL_HINT = "a plain def in a thread that keeps the GIL (a C extension?)"


class LoopGuard:
    """Awaits a coroutine and times each of its steps on the event loop.

    A step is the code between two of the coroutine's suspensions: while it runs, nothing else
    on the loop does. One that takes longer than BLOCK_LIMIT_S is reported with ``on_block``.
    """

    def __init__(self, coroutine: Awaitable[None], on_block: Callable[[float], None]) -> None:
        self.coroutine = coroutine
        self.on_block = on_block

    def __await__(self) -> Generator[Any, Any, None]:
        steps = self.coroutine.__await__()
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            started = time.perf_counter()
            try:
                yielded = steps.throw(thrown) if thrown is not None else steps.send(sent)
            except StopIteration:
                self._check(started)
                return
            self._check(started)
            try:
                sent, thrown = (yield yielded), None
            except GeneratorExit:
                steps.close()
                raise
            except BaseException as error:  # cancellation included: hand it to the hook
                sent, thrown = None, error

    def _check(self, started: float) -> None:
        took = time.perf_counter() - started
        if took > BLOCK_LIMIT_S:
            self.on_block(took)


async def in_thread(
    name: str, function: Callable[[HookCall], object], call: HookCall, slots: anyio.Semaphore
) -> None:
    """Run a plain function in a daemon thread and wait for it, watching the event loop.

    Daemon, not an anyio worker thread: a thread cannot be interrupted, and at a timeout or
    the end of a drain the reactor must move on (and be able to exit) while it still runs. Its
    slot is freed only when it returns, so stuck threads cannot pile up past ``slots``.
    """
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[BaseException | None] = loop.create_future()
    await slots.acquire()

    def settle(outcome: BaseException | None) -> None:
        slots.release()
        if not finished.done():  # the waiter may have given up (timeout, drain)
            finished.set_result(outcome)

    def target() -> None:
        outcome: BaseException | None = None
        try:
            function(call)
        except BaseException as error:  # the hook's failure, reported on the loop
            outcome = error
        # A closed loop means the process is exiting: nobody waits any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, outcome)

    since = anyio.current_time()  # the watch covers the thread's start, too
    threading.Thread(target=target, name=f"hook-{name}", daemon=True).start()
    async with anyio.create_task_group() as watching:
        watching.start_soon(_watch_loop, name, since)
        try:
            outcome = await finished
        finally:
            watching.cancel_scope.cancel()
    if isinstance(outcome, Exception):
        raise outcome
    if outcome is not None:  # SystemExit and the like end the hook's thread, not the reactor
        raise RuntimeError(f"the hook raised {type(outcome).__name__}")


async def _watch_loop(name: str, since: float) -> None:
    # A threaded hook cannot hold the loop itself, but one that keeps the GIL (a C extension
    # that does not release it) starves it just the same: the loop then wakes this task late.
    due = since + _WATCH_TICK_S
    while True:
        await anyio.sleep(max(0.0, due - anyio.current_time()))
        now = anyio.current_time()
        if now - due > BLOCK_LIMIT_S:
            log.warning(
                "a hook blocked the event loop",
                extra={"hook": name, "blocked_ms": round((now - due) * 1000), "hint": _GIL_HINT},
            )
        due = now + _WATCH_TICK_S
