"""The pairs benchmark's load generator, run as ``python -m bench.pairs`` in a child process
(its own event loop, as the app's): it reads a JSON spec on stdin and writes what it did."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import anyio

from bench.conn import connect


async def _generate(spec: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Finish every pair's jobs at the spec's rate, each pair on a connection of its own, on
    an absolute schedule (a slow commit does not slow the offered rate); the pairs' schedules
    are staggered evenly within each interval."""
    rate = float(spec["rate"])
    pairs: dict[str, dict[str, Any]] = spec["pairs"]
    played: dict[str, dict[str, float]] = {}
    start = time.monotonic() + 0.5

    async def finish(k: int, pair: str, work: dict[str, Any]) -> None:
        behind = 0.0
        async with await connect(spec["dsn"], f"load-{pair}") as conn:
            for i, job in enumerate(work["ids"]):
                wait = start + (i + k / len(pairs)) / rate - time.monotonic()
                if wait > 0:
                    await anyio.sleep(wait)
                else:
                    behind = max(behind, -wait)
                await conn.execute(work["query"], {**work["params"], "jobs": [job]})
        played[pair] = {
            "finished": len(work["ids"]),
            "seconds": time.monotonic() - start,
            "behind_s": behind,
        }

    async with anyio.create_task_group() as tg:
        for k, (pair, work) in enumerate(pairs.items()):
            tg.start_soon(finish, k, pair, work)
    return played


async def generator_main() -> None:
    spec = json.loads(sys.stdin.read())
    played = await _generate(spec)
    sys.stdout.write(json.dumps({"pairs": played, "cpu_s": time.process_time()}))
