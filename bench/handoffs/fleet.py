"""The replicas of a handoffs scenario: real ``reactor run`` processes, spawned, waited for,
stopped and read (their JSON log lines) as an orchestrator and an operator would."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.abc

from bench.handoffs.scale import EXIT_TIMEOUT_S, GRACE_S, READY_TIMEOUT_S, ROOT


@dataclass
class Replica:
    """One ``reactor run`` process: its HTTP port, its log file and what became of it."""

    name: str
    process: anyio.abc.Process
    port: int
    log: Path
    started_at: float  # unix time
    ready_s: float | None = None  # from the spawn to /readyz answering 200
    stop_s: float | None = None  # from SIGTERM to the exit
    signalled: str | None = None

    @property
    def running(self) -> bool:
        """True while the process has not exited."""
        return self.process.returncode is None


@dataclass
class Fleet:
    """The replicas of one scenario, spawned with one environment, oldest first."""

    dsn: str
    logs: Path
    label: str
    level: str
    probe: float
    replicas: list[Replica] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    closed: bool = False

    def _env(self, port: int) -> dict[str, str]:
        # Nothing of the caller's REACTOR_* leaks in: every replica runs with exactly these.
        env = {k: v for k, v in os.environ.items() if not k.startswith("REACTOR_")}
        env.update(
            {
                "DATABASE_URL": self.dsn,
                "REACTOR_GRACE_SECONDS": str(GRACE_S),
                "REACTOR_HTTP_ADDR": f"127.0.0.1:{port}",
                "REACTOR_DASHBOARD_ADDR": "",
                "REACTOR_LOG_FORMAT": "json",
                "REACTOR_LOG_LEVEL": self.level,
                "REACTOR_PROBE_INTERVAL_SECONDS": str(self.probe),
                "REACTOR_PROBE_TIMEOUT_SECONDS": str(self.probe),
            }
        )
        return env

    async def spawn(self) -> Replica:
        """Start one more replica (not waiting for it to be ready)."""
        name = f"{self.label}-r{len(self.replicas) + 1}"
        port = _free_port()
        log = self.logs / f"{name}.log"
        with log.open("wb") as err:
            process = await anyio.open_process(
                [sys.executable, "-m", "reactor", "run"],
                env=self._env(port),
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        replica = Replica(name, process, port, log, time.time())
        self.replicas.append(replica)
        return replica

    async def ready(self, replica: Replica, session: aiohttp.ClientSession) -> bool:
        """Wait until ``replica``'s /readyz answers 200; False (and a problem) if it never does."""
        url = f"http://127.0.0.1:{replica.port}/readyz"
        with anyio.move_on_after(READY_TIMEOUT_S):
            while replica.running:
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with session.get(url) as response:
                        if response.status == 200:
                            replica.ready_s = time.time() - replica.started_at
                            return True
                await anyio.sleep(0.05)
        state = "exited" if not replica.running else f"not ready after {READY_TIMEOUT_S:g} s"
        self.problems.append(f"{replica.name} {state} (log {replica.log.name})")
        return False

    async def start(self, count: int, session: aiohttp.ClientSession) -> None:
        """Spawn ``count`` replicas side by side and wait until each is ready and sees them all.

        Seeing them all (its reactor_replicas_live gauge) means ownership has settled, so the
        load does not start while two replicas still think they own the same jobs.
        """
        started = [await self.spawn() for _ in range(count)]
        async with anyio.create_task_group() as tg:
            for replica in started:
                tg.start_soon(self.ready, replica, session)
        with anyio.move_on_after(READY_TIMEOUT_S) as scope:
            # The gauge is only scraped, never announced: polling keeps the reactor untouched.
            while [await _live(session, r) for r in started] != [count] * count:  # noqa: ASYNC110
                await anyio.sleep(0.1)
        if scope.cancelled_caught:
            self.problems.append(f"{count} replicas did not all see {count} live")

    async def terminate(self, replica: Replica) -> None:
        """SIGTERM ``replica`` and wait for its drain and exit."""
        sent = time.time()
        replica.signalled = "SIGTERM"
        replica.process.send_signal(signal.SIGTERM)
        with anyio.move_on_after(EXIT_TIMEOUT_S):
            await replica.process.wait()
        if replica.running:
            self.problems.append(f"{replica.name} still running {EXIT_TIMEOUT_S:g} s after SIGTERM")
            return
        replica.stop_s = time.time() - sent
        if replica.process.returncode != 0:
            self.problems.append(
                f"{replica.name} exited {replica.process.returncode} after SIGTERM"
            )

    def kill(self, replica: Replica) -> None:
        """SIGKILL ``replica``: no drain, no goodbye."""
        replica.signalled = "SIGKILL"
        replica.process.send_signal(signal.SIGKILL)

    async def close(self) -> None:
        """Stop whatever still runs: SIGTERM, shielded, then SIGKILL for a replica that hangs.

        Idempotent: the measurement closes the fleet before its checks, the cleanup again.
        """
        if self.closed:
            return
        self.closed = True
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for replica in self.replicas:
                    if replica.running:
                        tg.start_soon(self.terminate, replica)
            for replica in self.replicas:
                if replica.running:
                    replica.process.kill()
                    await replica.process.wait()
                await replica.process.aclose()

    def log_problems(self) -> list[str]:
        """Error lines and unfinished drains in the logs, one problem per replica."""
        found = []
        for replica in self.replicas:
            lines = list(log_lines(replica.log))
            errors = [e for e in lines if e.get("level") in ("error", "critical")]
            cut = [e for e in lines if "drain deadline passed" in str(e.get("message"))]
            if errors:
                found.append(
                    f"{replica.name} logged {len(errors)} error(s), first: "
                    f"{errors[0].get('message')!r}"
                )
            if cut:
                found.append(f"{replica.name}'s drain deadline passed")
        return found


def _free_port() -> int:
    # The kernel picks a port nobody holds; the reactor binds it a moment later.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _live(session: aiohttp.ClientSession, replica: Replica) -> float:
    """The replica's reactor_replicas_live gauge, NaN when it cannot be read."""
    with contextlib.suppress(aiohttp.ClientError, OSError):
        async with session.get(f"http://127.0.0.1:{replica.port}/metrics") as response:
            for line in (await response.text()).splitlines():
                if line.startswith("reactor_replicas_live "):
                    return float(line.split()[1])
    return math.nan


def log_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON lines of a replica's log; anything else (a traceback) as a message."""
    if not path.exists():
        return
    for line in path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            entry = {"level": "error" if "Traceback" in line else "text", "message": line}
        if isinstance(entry, dict):
            yield entry
