"""The processes a benchmark runs and the CPU they spent: a `reactor run` started and stopped,
and the CPU seconds of the reactor's replicas, the load generator and the server's backends, read
from Linux's /proc."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import anyio
import anyio.abc

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody holds, for a replica's HTTP server."""
    # The kernel picks it; the reactor binds it a moment later.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def reactor_env(settings: Mapping[str, str]) -> dict[str, str]:
    """This process's environment without the reactor's settings, then ``settings``: a replica
    reads only what the benchmark gives it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTOR_")}
    env.update(settings)
    return env


async def start_reactor(env: Mapping[str, str]) -> anyio.abc.Process:
    """A `reactor run` process of this checkout under ``env``, its output discarded."""
    return await anyio.open_process(
        [sys.executable, "-m", "reactor", "run"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def stop(process: anyio.abc.Process, *, within_s: float) -> None:
    """SIGTERM ``process`` if it still runs, give it ``within_s`` seconds to exit, then SIGKILL;
    returns once it is gone. Shielded: it runs on the way out of a cancelled scope too."""
    if process.returncode is None:
        process.terminate()
    with anyio.move_on_after(within_s, shield=True):
        await process.wait()
    if process.returncode is None:
        process.kill()
        with anyio.CancelScope(shield=True):
            await process.wait()


def cpu_by_process(pids: Sequence[int], *, children: bool = False) -> dict[int, float]:
    """User plus system CPU seconds of each of ``pids`` (and, with ``children``, of each of
    their child processes), from Linux's /proc; a process that is gone is left out."""
    tick = os.sysconf("SC_CLK_TCK")
    wanted = set(pids)
    found: dict[int, float] = {}
    listed = (int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit())
    for pid in listed if children else wanted:
        try:
            # The fields after the command name, which is in parentheses and may hold spaces:
            # state (3rd field) first, so ppid is [1], utime [11] and stime [12].
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if pid in wanted or (children and int(fields[1]) in wanted):
            found[pid] = (int(fields[11]) + int(fields[12])) / tick
    return found
