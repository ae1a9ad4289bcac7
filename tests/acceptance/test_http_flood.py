"""``reactor run`` in a small container's share of file descriptors, held by clients that open
connections and never finish a request: the work goes on, the servers let go of them, the log
stays small, and the probes answer while one peer holds all it may.

The process gets a soft and hard RLIMIT_NOFILE of 256 (so raising the soft limit to the hard
one gains nothing, and the caps and the deadline must do the work) and 300 connections from 15
peer addresses, split between the probes and the page, that each send half a request line.
Another peer (127.0.0.2) holds 80 half-sent connections, reopening each as it is closed, while
the orchestrator's probe (127.0.0.1) calls /healthz.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from reactor.ops import accept
from reactor.ops.admission import Door
from tests.acceptance.conftest import reactor_env
from tests.acceptance.test_cli import listening
from tests.helpers import finish, new_job, python_child, run_row
from tests.polling import wait_for
from tests.ports import free_port, http_status, metrics_text, serving

OPEN_FILES = 256
HALF_OPEN = 300
# Each peer of the flood sends this many in a row to one server: past its own cap, and enough
# peers to reach what peers holding connections may share.
PER_PEER_IN_A_ROW = 30
GRACE = 1.0
# How late a job may be recorded past its grace while the connections are held, with every
# database session of the reactor cut meanwhile: the reconnect, the scan that follows it, and
# a loaded machine's share.
LATE_BOUND = 10.0
LOG_BOUND = 2 * 1024 * 1024


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


def flood_peer(n: int, servers: int) -> str:
    """The peer address the ``n``-th connection of :func:`half_open` comes from."""
    return f"127.0.0.{10 + n // servers // PER_PEER_IN_A_ROW}"


@contextmanager
def half_open(addresses: list[tuple[str, int]], count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections spread over ``addresses``, from the peers of :func:`flood_peer`,
    each sent half a request line and nothing more; closed on exit."""
    socks: list[socket.socket] = []
    try:
        for n in range(count):
            sock = socket.socket()
            socks.append(sock)
            sock.settimeout(10)
            sock.bind((flood_peer(n, len(addresses)), 0))
            sock.connect(addresses[n % len(addresses)])
            sock.sendall(b"GET /heal")
        yield socks
    finally:
        for sock in socks:
            sock.close()


def expected_drops(count: int, servers: int) -> Counter[str]:
    """What one server refuses of :func:`half_open`'s connections, by reason, and how many it
    admits (``head_timeout``: each is closed at the deadline), by the rules of the door."""
    reasons: Counter[str] = Counter()
    door: Door[int] = Door("probes", dropped=lambda reason: reasons.update([reason]))
    for n in range(0, count, servers):
        door.make_room(flood_peer(n, servers))
        door.admit(flood_peer(n, servers), n)
    reasons["head_timeout"] = door.open
    return reasons


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
    each = expected_drops(HALF_OPEN, 2)
    assert min(each["limit"], each["peer_limit"]) > 0  # both caps are reached
    over_caps = 2 * (each["limit"] + each["peer_limit"])
    log_path = tmp_path / "reactor.log"
    command = limited(OPEN_FILES, OPEN_FILES, "run")
    ready = f"http://127.0.0.1:{probes}/readyz"
    with serving(command, env, log_path, ready):
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
        metrics = metrics_text(probes)
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
        for reason, count in each.items():
            sample = (
                f'reactor_http_connections_dropped_total{{reason="{reason}",server="{server}"}} '
                f"{count:.1f}"
            )
            assert sample in metrics, (sample, metrics)


# The orchestrator's probe: its own peer address, and a kubelet's default timeoutSeconds.
PROBE_PEER = "127.0.0.1"
PROBE_TIMEOUT = 1.0
# The other peer, holding as many half-sent connections as it can get, and more.
GREEDY_PEER = "127.0.0.2"
GREEDY_CONNECTIONS = 80


class Greedy(threading.Thread):
    """Holds ``count`` connections from ``peer`` to ``target``, each sent half a request line,
    and opens another as soon as the server closes one, until :meth:`stop`."""

    def __init__(self, target: tuple[str, int], peer: str, count: int) -> None:
        super().__init__(daemon=True)
        self.target = target
        self.peer = peer
        self.count = count
        self.opened = 0  # connections that got as far as sending (this thread writes)
        self.closed = 0  # ... and that the server closed
        self.problem: str | None = None
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join(10)

    def run(self) -> None:
        try:
            with selectors.DefaultSelector() as selector:
                try:
                    for _ in range(self.count):
                        self._open(selector)
                    while not self._stopping.is_set():
                        for key, _ in selector.select(0.1):
                            self._step(selector, key)
                finally:
                    for key in list(selector.get_map().values()):
                        key.fileobj.close()  # type: ignore[union-attr]
        except OSError as error:
            self.problem = repr(error)

    def _open(self, selector: selectors.BaseSelector) -> None:
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind((self.peer, 0))
        sock.connect_ex(self.target)  # EINPROGRESS; the selector says when it is done
        selector.register(sock, selectors.EVENT_WRITE, "connecting")

    def _reopen(self, selector: selectors.BaseSelector, sock: socket.socket) -> None:
        selector.unregister(sock)
        sock.close()
        self._open(selector)

    def _step(self, selector: selectors.BaseSelector, key: selectors.SelectorKey) -> None:
        sock = key.fileobj
        assert isinstance(sock, socket.socket)
        if key.data == "connecting":
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self._reopen(selector, sock)
                return
            try:
                sock.send(b"GET /heal")
            except OSError:
                self._reopen(selector, sock)
                return
            self.opened += 1
            selector.modify(sock, selectors.EVENT_READ, "held")
            return
        try:
            data = sock.recv(4096)
        except OSError:
            data = b""
        if not data:
            self.closed += 1
            self._reopen(selector, sock)


def hold_greedily(port: int) -> None:
    """A process of its own (its own interpreter, as a client on another pod has): floods
    127.0.0.1:``port`` from GREEDY_PEER, says ``flooding`` once the server has closed as many
    as it holds, and stops at the end of its stdin, printing what it counted."""
    greedy = Greedy(("127.0.0.1", port), GREEDY_PEER, GREEDY_CONNECTIONS)
    greedy.start()
    wait_for(lambda: greedy.closed >= GREEDY_CONNECTIONS or greedy.problem, 10)
    print("flooding", flush=True)
    sys.stdin.read()
    greedy.stop()
    print(json.dumps({"closed": greedy.closed, "problem": greedy.problem}), flush=True)


@contextmanager
def greedy_peer(port: int) -> Iterator[dict[str, Any]]:
    """:func:`hold_greedily` in another process while the block runs; the dict it yields gets
    what that process counted, on exit."""
    counted: dict[str, Any] = {}
    code = f"from tests.acceptance.test_http_flood import hold_greedily; hold_greedily({port})"
    with python_child(code, "flooding") as proc:
        yield counted
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.close()
        counted.update(json.loads(proc.stdout.readline()))
        assert proc.wait(timeout=15) == 0


def probe(url: str) -> int | None:
    """One call of ``url`` from PROBE_PEER, as the orchestrator makes it: the status, or None
    when no answer came within PROBE_TIMEOUT."""
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    try:
        with socket.create_connection(
            (host, int(port)), timeout=PROBE_TIMEOUT, source_address=(PROBE_PEER, 0)
        ) as sock:
            path = "/" + url.removeprefix("http://").split("/", 1)[1]
            sock.sendall(
                f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
            )
            head = b""
            while b"\r\n" not in head:
                chunk = sock.recv(4096)
                if not chunk:
                    return None
                head += chunk
            return int(head.split()[1])
    except OSError:
        return None


# The calls a probing test makes, and the seconds between them: 25 over 5 s in every run, and
# under --long 25 over 25 s, the figure in docs/security.md.
PROBE_CADENCES = pytest.mark.parametrize(
    ("calls", "every"),
    [pytest.param(25, 0.2, id="5s"), pytest.param(25, 1.0, id="25s", marks=pytest.mark.slow)],
)


def probe_steadily(url: str, calls: int, every: float) -> tuple[list[int | None], float]:
    """``calls`` calls of :func:`probe` on ``url``, one every ``every`` seconds from now: what
    each got, and the seconds they took in all."""
    answers = []
    started = time.monotonic()
    for n in range(calls):
        time.sleep(max(0.0, started + n * every - time.monotonic()))
        answers.append(probe(url))
    return answers, time.monotonic() - started


@contextmanager
def serving_probes(database_url: str, log_path: Path) -> Iterator[int]:
    """``reactor run`` serving its probes on a free port, which it yields, while the block runs,
    from when /readyz answers 200; its output in ``log_path``."""
    port = free_port()
    env = reactor_env(database_url, REACTOR_HTTP_ADDR=f"127.0.0.1:{port}")
    command = [sys.executable, "-m", "reactor", "run"]
    with serving(command, env, log_path, f"http://127.0.0.1:{port}/readyz"):
        yield port


@PROBE_CADENCES
def test_probes_are_answered_while_one_peer_holds_all_it_may(
    database_url: str, tmp_path: Path, calls: int, every: float
) -> None:
    with serving_probes(database_url, tmp_path / "reactor.log") as probes:
        # Once it says so, the flood is on: the server has closed as many as it holds.
        with greedy_peer(probes) as greedy:
            answers, spent = probe_steadily(f"http://127.0.0.1:{probes}/healthz", calls, every)
        assert greedy["problem"] is None, greedy["problem"]
        metrics = metrics_text(probes)
    answered = answers.count(200)
    print(
        f"\n/healthz from {PROBE_PEER}: {answered} of {calls} answered within "
        f"{PROBE_TIMEOUT:g} s over {spent:.1f} s, while {GREEDY_PEER} held "
        f"{GREEDY_CONNECTIONS} half-sent connections ({greedy['closed']} closed by the server and "
        "reopened)"
    )
    assert answered >= calls - 2, answers
    # The greedy peer got its own cap, and the rest of its connections were refused for it.
    (refused,) = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(
            'reactor_http_connections_dropped_total{reason="peer_limit",server="probes"}'
        )
    ]
    assert refused >= GREEDY_CONNECTIONS - accept.MAX_PER_PEER, metrics


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
