"""Running a loop of the reactor's (the dispatcher's, the scheduler's) for one block of a test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

import anyio
import anyio.abc


class Loop(Protocol):
    async def run(self, work: anyio.abc.TaskGroup) -> None: ...

    def close(self) -> None: ...


@asynccontextmanager
async def running(loop: Loop) -> AsyncIterator[None]:
    """``loop`` runs in a task group of its own while the block runs, and is closed at its end;
    the block is left only once the loop has returned."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(loop.run, tg)
        yield
        loop.close()
