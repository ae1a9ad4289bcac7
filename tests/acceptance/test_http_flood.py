"""``reactor run`` in a small container's share of file descriptors, held by clients that open
connections and never finish a request: the work goes on, the servers let go of them, and the
log stays small.

The process gets a soft and hard RLIMIT_NOFILE of 256 (so raising the soft limit to the hard
one gains nothing, and the caps and the deadline must do the work) and 300 connections, split
between the probes and the page, that each send half a request line.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from reactor import http
from tests.acceptance.conftest import reactor_env
from tests.acceptance.test_cli import listening
from tests.helpers import finish, new_job, run_row
from tests.polling import wait_for

OPEN_FILES = 256
HALF_OPEN = 300
GRACE = 1.0
# How late a job may be recorded past its grace while the connections are held, with every
# database session of the reactor cut meanwhile: the reconnect, the scan that follows it, and
# a loaded machine's share.
LATE_BOUND = 10.0
LOG_BOUND = 2 * 1024 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            code: int = response.status
            return code
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


# Sets RLIMIT_NOFILE, then becomes `python -m reactor ARGS`: the limits hold from its first
# instruction, as a container's do.
_LIMITED = (
    "import os, resource, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2]))); "
    "os.execv(sys.executable, [sys.executable, '-m', 'reactor', *sys.argv[3:]])"
)


def limited(soft: int, hard: int, *args: str) -> list[str]:
    """The command line of ``reactor ARGS`` with these open-files limits."""
    return [sys.executable, "-c", _LIMITED, str(soft), str(hard), *args]


@contextmanager
def half_open(addresses: list[tuple[str, int]], count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections spread over ``addresses``, each sent half a request line and
    nothing more; closed on exit."""
    socks: list[socket.socket] = []
    try:
        for n in range(count):
            sock = socket.socket()
            socks.append(sock)
            sock.settimeout(10)
            sock.connect(addresses[n % len(addresses)])
            sock.sendall(b"GET /heal")
        yield socks
    finally:
        for sock in socks:
            sock.close()


class Watcher(threading.Thread):
    """Watches ``socks`` until the server has closed every one of them (EOF or a reset),
    noting when each closed, in seconds after the monotonic time ``since``."""

    def __init__(self, socks: list[socket.socket], since: float, timeout: float) -> None:
        super().__init__(daemon=True)
        self.socks = socks
        self.since = since
        self.timeout = timeout
        self.closed: list[float] = []  # appended to by this thread only
        self.problem: str | None = None

    def run(self) -> None:
        with selectors.DefaultSelector() as selector:
            for sock in self.socks:
                sock.setblocking(False)
                selector.register(sock, selectors.EVENT_READ)
            while len(self.closed) < len(self.socks):
                left = self.since + self.timeout - time.monotonic()
                if left <= 0:
                    self.problem = f"{len(self.socks) - len(self.closed)} still open"
                    return
                for key, _ in selector.select(left):
                    ready = key.fileobj
                    assert isinstance(ready, socket.socket)
                    try:
                        data = ready.recv(4096)
                    except ConnectionError:
                        data = b""
                    if not data:
                        selector.unregister(ready)
                        self.closed.append(time.monotonic() - self.since)


def records(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def test_half_open_connections_take_nothing_the_reactor_needs(
    database_url: str, tmp_path: Path
) -> None:
    probes, page = free_port(), free_port()
    env = reactor_env(
        database_url,
        REACTOR_HTTP_ADDR=f"127.0.0.1:{probes}",
        REACTOR_DASHBOARD_ADDR=f"127.0.0.1:{page}",
        REACTOR_GRACE_SECONDS=str(GRACE),
        REACTOR_PROBE_INTERVAL_SECONDS="1",
        REACTOR_PROBE_TIMEOUT_SECONDS="1",
    )
    over_caps = HALF_OPEN - 2 * http.MAX_CONNECTIONS
    log_path = tmp_path / "reactor.log"
    with log_path.open("w", encoding="utf-8") as log:
        command = limited(OPEN_FILES, OPEN_FILES, "run")
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=log, text=True)
    try:
        ready = f"http://127.0.0.1:{probes}/readyz"
        wait_for(lambda: http_status(ready) == 200 or proc.poll() is not None, 60)
        assert proc.poll() is None, log_path.read_text(encoding="utf-8")
        opened = time.monotonic()
        with (
            psycopg.connect(database_url, autocommit=True) as conn,
            half_open([("127.0.0.1", probes), ("127.0.0.1", page)], HALF_OPEN) as socks,
        ):
            watcher = Watcher(socks, since=opened, timeout=30)
            watcher.start()
            # Once those past the caps are closed, the servers have taken all of them.
            wait_for(lambda: len(watcher.closed) >= over_caps or watcher.problem, 10)
            # Every session the reactor holds is cut: what it needs now is new descriptors.
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name LIKE 'reactor%%' AND datname = current_database()"
            )
            job_id, run_id = new_job(conn)
            finish(conn, job_id)
            finished = time.monotonic()
            wait_for(lambda: run_row(conn, run_id), timeout=GRACE + LATE_BOUND)
            recorded = time.monotonic() - finished
            held_then = HALF_OPEN - len(watcher.closed)
            assert run_row(conn, run_id) == (job_id, "worker")
            watcher.join()
            assert watcher.problem is None, watcher.problem
            released = max(watcher.closed)
            # Listening again as soon as they are gone: probes and LISTEN both answer.
            assert http_status(ready) == 200
            wait_for(lambda: listening(conn))
        with urllib.request.urlopen(f"http://127.0.0.1:{probes}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log_path.read_text(encoding="utf-8")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log_bytes = os.path.getsize(log_path)
    logged = records(log_path)
    print(
        f"\nrecorded {recorded:.2f} s after finishing (grace {GRACE:g} s), with {held_then} "
        f"connections still held; all {HALF_OPEN} closed by {released:.2f} s after opening; "
        f"log {log_bytes} bytes"
    )
    assert recorded <= GRACE + LATE_BOUND
    assert released < 30
    assert log_bytes < LOG_BOUND
    assert not [r for r in logged if "accept" in r["message"]], "descriptors ran out"
    # Those past the caps at once, the others at the head deadline.
    for server in ("probes", "page"):
        for reason, count in (
            ("limit", HALF_OPEN // 2 - http.MAX_CONNECTIONS),
            ("head_timeout", http.MAX_CONNECTIONS),
        ):
            sample = (
                f'reactor_http_connections_dropped_total{{reason="{reason}",server="{server}"}} '
                f"{count:.1f}"
            )
            assert sample in metrics, (sample, metrics)


def test_run_raises_its_soft_open_files_limit_to_the_hard_one(database_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = reactor_env(
            database_url,
            REACTOR_HTTP_ADDR=f"127.0.0.1:{taken.getsockname()[1]}",
            REACTOR_LOG_LEVEL="DEBUG",
        )
        # It stops at the taken port (exit 2), after the limit was raised.
        proc = subprocess.run(
            limited(128, OPEN_FILES, "run"),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert proc.returncode == 2, proc.stderr
    (limit,) = [
        json.loads(line)
        for line in proc.stderr.splitlines()
        if line.startswith("{") and json.loads(line)["message"] == "open files limit"
    ]
    assert (limit["soft"], limit["hard"], limit["was"]) == (OPEN_FILES, OPEN_FILES, 128)
