"""``reactor run`` while 18 peer addresses hold every place the probes' server allows them, with
connections that keep asking for answers and never read one (stalled reads) or send a declared
body a byte every two seconds (trickled bodies), each reopened as soon as the server closes it:
the orchestrator's probe is answered all the same, and the server lets go of every one of them
at a deadline.

Two peers hold 24 connections each (their cap) and 16 more one each (the places kept for a peer
that holds none), 64 in all: every place there is. The holders run in a process of their own,
as a client on another pod does.
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from reactor.ops import accept
from reactor.ops.admission import KEPT_FOR_NEW_PEERS, MAX_CONNECTIONS, MAX_PER_PEER
from tests.acceptance.test_http_flood import (
    PROBE_CADENCES,
    PROBE_PEER,
    PROBE_TIMEOUT,
    probe_steadily,
    serving_probes,
)
from tests.helpers import python_child
from tests.ports import metrics_text

Kind = Literal["stalled", "trickled"]

# Two peers at their cap take the places peers holding connections share; one more connection
# each from 16 others takes the places kept for a peer holding none.
SHARING = (MAX_CONNECTIONS - KEPT_FOR_NEW_PEERS) // MAX_PER_PEER
HOLDERS = [f"127.0.0.{n}" for n in range(2, 2 + SHARING + KEPT_FOR_NEW_PEERS)]
PLACES = [peer for peer in HOLDERS[:SHARING] for _ in range(MAX_PER_PEER)] + HOLDERS[SHARING:]
# A stalled reader asks for as many answers as it may send ahead of them, and again every
# TRICKLE_SECONDS, and takes none: a receive buffer this small shuts its window after the
# first few hundred bytes.
STALLED_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
RECEIVE_BUFFER = 1024
# A trickler declares a body and sends a byte of it every TRICKLE_SECONDS.
TRICKLED_HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n"
TRICKLE_SECONDS = 2.0
# How late past its deadline the server may let go of a held connection, on a loaded machine.
RELEASE_MARGIN = 5.0
RELEASE_BOUND = max(accept.WRITE_STALL_SECONDS, accept.BODY_SECONDS) + RELEASE_MARGIN
# A slot whose connection the server closed opens the next this soon: at once, but not in a
# loop as tight as the machine allows while the server refuses it.
REOPEN_SECONDS = 0.05

_GONE = select.POLLHUP | select.POLLERR | select.POLLRDHUP


@dataclass
class Slot:
    """One place a holder keeps taking: its peer, how it holds, its connection now."""

    peer: str
    kind: Kind
    sock: socket.socket | None = None
    opened_at: float = 0.0
    first: bool = True  # the connection opened first, before the probes began
    closed_after: list[float] = field(default_factory=list)  # of the first, when closed


class Holders:
    """Holds every place of :data:`PLACES` on ``target``, half stalled readers and half
    tricklers, and reopens each connection the server closes."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.slots = [
            Slot(peer, "stalled" if n % 2 else "trickled") for n, peer in enumerate(PLACES)
        ]
        self.poller = select.poll()
        self.by_fd: dict[int, Slot] = {}
        self.reopened = 0  # connections opened after the first of each slot
        self.due: list[tuple[float, Slot]] = []  # slots to reopen, and when

    def open(self, slot: Slot) -> None:
        """Connect ``slot`` and send what its kind sends; a refused attempt is closed by the
        server and noticed like any other close."""
        sock = socket.socket()
        if slot.kind == "stalled":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        sock.bind((slot.peer, 0))
        sock.settimeout(5)
        try:
            sock.connect(self.target)
            if slot.kind == "stalled":
                sock.sendall(STALLED_REQUEST * accept.MAX_PIPELINED)
            else:
                sock.sendall(TRICKLED_HEAD)
        except OSError:
            pass  # noticed as closed below
        sock.setblocking(False)
        slot.sock, slot.opened_at = sock, time.monotonic()
        self.by_fd[sock.fileno()] = slot
        self.poller.register(sock, _GONE if slot.kind == "stalled" else _GONE | select.POLLIN)

    def closed(self, slot: Slot) -> None:
        """The server closed ``slot``'s connection: note when, and open the next."""
        assert slot.sock is not None
        self.poller.unregister(slot.sock)
        del self.by_fd[slot.sock.fileno()]
        slot.sock.close()
        slot.sock = None
        if slot.first:
            slot.first = False
            slot.closed_after.append(time.monotonic() - slot.opened_at)
        self.due.append((time.monotonic() + REOPEN_SECONDS, slot))

    def step(self, timeout: float) -> None:
        """Wait ``timeout`` seconds at most for a close, and reopen what closed."""
        now = time.monotonic()
        while self.due and self.due[0][0] <= now:
            _, again = self.due.pop(0)
            self.reopened += 1
            self.open(again)
        for fd, events in self.poller.poll(timeout * 1000):
            slot = self.by_fd.get(fd)
            if slot is None or slot.sock is None:
                continue
            if events & select.POLLIN and not events & _GONE:
                try:
                    if slot.sock.recv(4096):
                        continue  # a trickler's answer, read and dropped
                except BlockingIOError:
                    continue
                except OSError:
                    pass
            self.closed(slot)

    def trickle(self) -> None:
        """One more byte of each trickler's body, more requests of each stalled reader."""
        for slot in self.slots:
            if slot.sock is None:
                continue
            try:
                if slot.kind == "trickled":
                    slot.sock.send(b"x")
                else:
                    slot.sock.send(STALLED_REQUEST * accept.MAX_PIPELINED)
            except BlockingIOError:
                pass  # the server reads no more of it: its own stall
            except OSError:
                self.closed(slot)

    def close(self) -> None:
        for slot in self.slots:
            if slot.sock is not None:
                slot.sock.close()


def hold(port: int, release_bound: float) -> None:
    """A process of its own: holds every place of 127.0.0.1:``port``, says ``holding`` once
    every first connection has sent its requests, then ``released`` with the seconds it took
    the server to close every first connection (null: some were still open after
    ``release_bound`` seconds), and at the end of its stdin prints what it counted."""
    holders = Holders(("127.0.0.1", port))
    for slot in holders.slots:
        holders.open(slot)
    started = time.monotonic()
    print("holding", flush=True)
    released: float | None = None
    next_trickle = started + TRICKLE_SECONDS
    stdin = select.poll()
    stdin.register(sys.stdin, select.POLLIN | select.POLLHUP)
    reported = False
    try:
        while not stdin.poll(0):
            holders.step(min(REOPEN_SECONDS, max(0.0, next_trickle - time.monotonic())))
            if time.monotonic() >= next_trickle:
                holders.trickle()
                next_trickle += TRICKLE_SECONDS
            if not reported:
                if all(not slot.first for slot in holders.slots):
                    released = max(max(slot.closed_after) for slot in holders.slots)
                    reported = True
                elif time.monotonic() - started > release_bound:
                    reported = True
                if reported:
                    print(f"released {json.dumps(released)}", flush=True)
    finally:
        holders.close()
    still_first = {
        kind: sum(slot.first for slot in holders.slots if slot.kind == kind)
        for kind in ("stalled", "trickled")
    }
    print(json.dumps({"reopened": holders.reopened, "still_open": still_first}), flush=True)


@contextmanager
def holding(port: int) -> Iterator[subprocess.Popen[str]]:
    """:func:`hold` in another process while the block runs, once it holds every place."""
    code = (
        "from tests.acceptance.test_http_hold import hold; "
        f"hold({port}, {RELEASE_BOUND + accept.HEAD_SECONDS})"
    )
    with python_child(code, "holding") as proc:
        yield proc


def counted(metrics: str, reason: str) -> float:
    """What the probes' server counted as dropped for ``reason``."""
    sample = f'reactor_http_connections_dropped_total{{reason="{reason}",server="probes"}} '
    (value,) = [
        float(line[len(sample) :]) for line in metrics.splitlines() if line.startswith(sample)
    ]
    return value


# The long run's 25 calls over 25 s are across the deadlines.
@PROBE_CADENCES
def test_probes_are_answered_while_18_peers_hold_every_place(
    database_url: str, tmp_path: Path, calls: int, every: float
) -> None:
    with serving_probes(database_url, tmp_path / "reactor.log") as port, holding(port) as holders:
        assert holders.stdin is not None
        assert holders.stdout is not None
        answers, spent = probe_steadily(f"http://127.0.0.1:{port}/healthz", calls, every)
        released_line = holders.stdout.readline()
        holders.stdin.close()
        tally: dict[str, Any] = json.loads(holders.stdout.readline())
        assert holders.wait(timeout=15) == 0
        metrics = metrics_text(port)
    answered = answers.count(200)
    assert released_line.startswith("released ")
    released = json.loads(released_line.removeprefix("released "))
    print(
        f"\n/healthz from {PROBE_PEER}: {answered} of {calls} answered within "
        f"{PROBE_TIMEOUT:g} s over {spent:.1f} s, while {len(HOLDERS)} peers held all "
        f"{len(PLACES)} places (stalled reads and trickled bodies, {tally['reopened']} reopened "
        f"after the server closed them); every first connection closed by "
        f"{released} s (still open: {tally['still_open']})"
    )
    assert answered >= calls - 2, answers
    # Every connection held was let go at its stage's deadline, the stalled ones too.
    assert released is not None, tally
    assert released <= RELEASE_BOUND
    # Each first connection was closed for one of these (a stalled reader that asks for more
    # while its answers wait unread is closed for that, before its stall's deadline); and the
    # probe got in by taking a place of a peer that held more than one.
    stalled = counted(metrics, "write_stall") + counted(metrics, "pipelined")
    trickled = counted(metrics, "body_timeout")
    made_room = counted(metrics, "made_room")
    assert min(stalled, trickled, made_room) > 0, metrics
    assert stalled + trickled + made_room >= len(PLACES), metrics
