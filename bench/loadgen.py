"""The app's load (worker and tabs) in a process of its own, as in production.

``python -m bench.loadgen`` reads a JSON spec on stdin, runs :func:`bench.workload.play` and
writes what happened as JSON on stdout. Timestamps are ``time.monotonic()``, which on Linux is
one clock for every process, so the caller can compare them with its own.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Any

import anyio

from bench.workload import Play, play


async def play_elsewhere(dsn: str, job_ids: list[str], **options: Any) -> Play:
    """Run :func:`play` in a child process; returns its statistics."""
    spec = json.dumps({"dsn": dsn, "job_ids": job_ids, "options": options})
    done = await anyio.run_process(
        [sys.executable, "-m", "bench.loadgen"], input=spec.encode(), check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed: {done.stderr.decode()[-2000:]}")
    return Play(**json.loads(done.stdout))


async def _main() -> None:
    spec = json.loads(sys.stdin.read())
    options = spec["options"]
    if "tab_delay" in options:
        options["tab_delay"] = tuple(options["tab_delay"])
    stats = await play(spec["dsn"], spec["job_ids"], **options)
    sys.stdout.write(json.dumps(asdict(stats)))


if __name__ == "__main__":
    anyio.run(_main, backend="asyncio")
