"""Which connections an HTTP server of the reactor holds, where each is in its requests, and
floods of one event counted. Pure: no socket and no clock (``now`` is passed in);
:mod:`reactor.ops.accept` does the I/O.

A server holds at most :data:`MAX_CONNECTIONS` at once, and one peer address at most
:data:`MAX_PER_PEER` of them. The last :data:`KEPT_FOR_NEW_PEERS` places go only to a peer that
holds none: an orchestrator's probe opens one connection at a time, so it always finds a place
while other peers hold all they may, be it one peer at its own cap or several sharing the rest.
When every place is taken all the same (many peers, one or two connections each), a peer that
holds none takes the oldest connection of the peer that holds the most, if that one holds more
than one: the probe gets in, and the peer that loses a place is the one with places to spare.

A connection's peer has a deadline at each stage of a request (:class:`Requests` says which
stage it is at): the head, the body, and taking the answer; and it may send at most
:data:`MAX_PIPELINED` requests ahead of their answers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import KW_ONLY, dataclass, field
from typing import Generic, Literal, TypeVar

from reactor.telemetry.metrics import DropReason

# Open connections per server. Probes, a scraper and a few browsers need a handful; a
# connection past this is closed as soon as it is accepted.
MAX_CONNECTIONS = 64
# Open connections per peer address: a kubelet or a scraper needs one or two, but a browser
# with several tabs of the page open, or a proxy in front of the page, speaks for many from one
# address (the page's tabs loading at once took 20). Two such peers at the cap still leave the
# places kept for a peer holding none.
MAX_PER_PEER = 24
# Places a peer holding connections cannot take: a peer holding none (a probe) is admitted
# while at most MAX_CONNECTIONS - KEPT_FOR_NEW_PEERS are held by the others.
KEPT_FOR_NEW_PEERS = 16
# A connection that has not sent a complete request head by then is closed. A probe or a
# browser sends its head at once; only a client that means to hold the connection is slower.
HEAD_SECONDS = 5.0
# A declared body (Content-Length, or chunked) must have arrived this long after its head: the
# page's forms carry a few hundred bytes, so only a client that means to hold the connection
# sends one a byte at a time.
BODY_SECONDS = 10.0
# What the server has written must be taken by the peer within this: a connection whose answers
# wait unread this long (the peer's window shut, writing paused) is cut, answers and all.
WRITE_STALL_SECONDS = 10.0
# Requests a connection may have sent that are still waiting for their answers. Browsers,
# scrapers and probes send one at a time; a peer that sends more at once, and need not read
# the answers to do so, is closed.
MAX_PIPELINED = 4
# The longest head or chunk line followed; past it the connection is not followed any more
# (aiohttp refuses a line past 8 KiB), and the deadline of its head or body closes it.
MAX_FOLLOWED_BYTES = 64 * 1024


# Where a connection's peer is in its requests (:class:`Requests`): owing a head (the first
# byte of one came, or none yet on a new connection), owing a declared body, between requests
# (every one it sent is whole), or lost (sent what this does not follow, which aiohttp refuses
# with a 400 and a close).
Stage = Literal["head", "body", "between", "lost"]


class Requests:
    """Follows the requests a connection sends, as aiohttp's request parser (llhttp, strict for
    requests) reads them: where each head ends, how long its body is (Content-Length, or
    chunked), and where that ends. It decides nothing: it says the :data:`Stage` the peer is at,
    and how many request heads it has sent whole (:attr:`heads`: aiohttp takes a request up
    as soon as its head is in).

    Lines end with CRLF only; empty lines before a request line are skipped, so that they can
    neither end a head nor start one. A head that is too long to follow, or frames its body in a
    way the parser refuses (a Content-Length that is not a number or is said twice otherwise,
    both a Content-Length and chunked, a transfer coding other than chunked last), leaves the
    connection lost: it is followed no further.
    """

    def __init__(self) -> None:
        self.stage: Stage = "head"
        self.heads = 0
        self._line = bytearray()  # the head, or the chunk line, so far
        self._left = 0  # bytes of the body, or of the chunk and its CRLF, still to come
        self._chunk: Literal["size", "data", "trailer"] | None = None

    def feed(self, data: bytes) -> None:
        """The next bytes the peer sent."""
        # By offset into ``data``, never by slices of it: a read may hold thousands of small
        # requests, and slicing off each would copy the rest of the read every time.
        at, end = 0, len(data)
        while at < end and self.stage != "lost":
            if self.stage == "between" or (self.stage == "head" and not self._line):
                while at < end and data[at] in b"\r\n":
                    at += 1
                if at == end:
                    return
                self.stage = "head"
            if self.stage == "head":
                at = self._head(data, at)
            elif self._chunk in (None, "data"):
                at = self._counted(data, at)
            else:
                at = self._chunk_line(data, at)

    def _line_end(self, data: bytes, at: int, ending: bytes) -> tuple[bytes, int] | None:
        """The line (or head) that ``ending`` ends, begun in earlier reads or at ``at``, and the
        offset in ``data`` past its end; None: it goes on past ``data`` (kept for the next)."""
        if self._line:
            # An ending split between the last read and this one.
            tail = bytes(self._line[-(len(ending) - 1) :])
            found = (tail + data[at : at + len(ending) - 1]).find(ending)
            if found >= 0:
                past = at + found + len(ending) - len(tail)
                line = (bytes(self._line) + data[at:past])[: -len(ending)]
                self._line.clear()
                return line, past
        found = data.find(ending, at)
        if found < 0:
            self._line += data[at:]
            if len(self._line) > MAX_FOLLOWED_BYTES:
                self._lose()
            return None
        line = bytes(self._line) + data[at:found]
        self._line.clear()
        return line, found + len(ending)

    def _head(self, data: bytes, at: int) -> int:
        ended = self._line_end(data, at, b"\r\n\r\n")
        if ended is None:
            return len(data)
        head, at = ended
        body = declared_body(head)
        if body is None:
            self._lose()
            return len(data)
        self.heads += 1
        if body == "chunked":
            self.stage, self._chunk = "body", "size"
        elif body:
            self.stage, self._left = "body", body
        else:
            self._ended()
        return at

    def _counted(self, data: bytes, at: int) -> int:
        taken = min(self._left, len(data) - at)
        self._left -= taken
        if not self._left:
            if self._chunk is None:
                self._ended()
            else:
                self._chunk = "size"
        return at + taken

    def _chunk_line(self, data: bytes, at: int) -> int:
        ended = self._line_end(data, at, b"\r\n")
        if ended is None:
            return len(data)
        line, at = ended
        if self._chunk == "trailer":
            if not line:
                self._ended()
            return at
        size = chunk_size(line)
        if size is None:
            self._lose()
        elif size:
            self._chunk, self._left = "data", size + 2  # the data, then its CRLF
        else:
            self._chunk = "trailer"
        return at

    def _ended(self) -> None:
        self.stage, self._chunk = "between", None

    def _lose(self) -> None:
        self.stage = "lost"
        self._line.clear()


def declared_body(head: bytes) -> int | Literal["chunked"] | None:
    """The body a request head declares: its length, or ``chunked``; None when the request
    parser would refuse how it says so."""
    length: int | None = None
    chunked = False
    for line in head.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            return None
        name, value = name.strip().lower(), value.strip()
        if name == b"content-length":
            if not value.isdigit() or (length is not None and int(value) != length):
                return None
            length = int(value)
        elif name == b"transfer-encoding":
            if value.lower().rsplit(b",", 1)[-1].strip() != b"chunked":
                return None
            chunked = True
    if chunked:
        return None if length is not None else "chunked"
    return length or 0


def chunk_size(line: bytes) -> int | None:
    """The size a chunk line gives (hex digits, then maybe ``;`` and extensions); None when it
    gives none."""
    digits = line.split(b";", 1)[0].strip()
    if not digits or digits.strip(b"0123456789abcdefABCDEF"):
        return None
    return int(digits, 16)


Conn = TypeVar("Conn", bound=Hashable)


@dataclass(eq=False, repr=False)
class Door(Generic[Conn]):
    """The connections one server holds, by peer address: at most ``limit`` at once, at most
    ``per_peer`` from one peer, and the last ``kept_for_new`` places only for a peer holding
    none. Each connection has ``head_seconds`` to send each request head. ``dropped`` hears of
    each connection closed for a reason of :data:`DropReason`, with the reason.

    A connection is any hashable the caller names it by; the door remembers the order they came
    in, for :meth:`make_room`."""

    server: str
    _: KW_ONLY
    limit: int = MAX_CONNECTIONS
    per_peer: int = MAX_PER_PEER
    kept_for_new: int = KEPT_FOR_NEW_PEERS
    head_seconds: float = HEAD_SECONDS
    dropped: Callable[[DropReason], None] = lambda reason: None
    open: int = field(default=0, init=False)
    # By peer address, oldest first; a peer holding none is absent.
    _by_peer: dict[str, dict[Conn, None]] = field(default_factory=dict, init=False)
    _peer_of: dict[Conn, str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if not 0 <= self.kept_for_new < self.limit or self.per_peer < 1:
            raise ValueError("a door needs 0 <= kept_for_new < limit and per_peer >= 1")

    @property
    def held(self) -> dict[str, int]:
        """How many connections each peer holds; a peer holding none is absent."""
        return {peer: len(conns) for peer, conns in self._by_peer.items()}

    def refusal(self, peer: str) -> DropReason | None:
        """Why a connection from ``peer`` would be refused now; None: it would be admitted."""
        holding = len(self._by_peer.get(peer, ()))
        if holding >= self.per_peer:
            return "peer_limit"
        room = self.limit if holding == 0 else self.limit - self.kept_for_new
        return "limit" if self.open >= room else None

    def make_room(self, peer: str) -> Conn | None:
        """When every place is taken and ``peer`` holds none: the oldest connection of the peer
        that holds the most, if it holds more than one, which this forgets (its place is
        ``peer``'s now) and the caller closes. None: nothing to close (``peer`` gets in as it
        is, or is refused)."""
        if peer in self._by_peer or self.refusal(peer) != "limit":
            return None
        most = max(self._by_peer.values(), key=len, default={})
        if len(most) < 2:
            return None
        oldest = next(iter(most))
        self.release(oldest)
        self.dropped("made_room")
        return oldest

    def admit(self, peer: str, conn: Conn) -> bool:
        """Take ``conn``, a connection from ``peer``, or say no (and count why)."""
        reason = self.refusal(peer)
        if reason is not None:
            self.dropped(reason)
            return False
        self.open += 1
        self._by_peer.setdefault(peer, {})[conn] = None
        self._peer_of[conn] = peer
        return True

    def release(self, conn: Conn) -> None:
        """``conn`` has closed, or was given up by :meth:`make_room`; nothing if it holds no
        place (any more)."""
        peer = self._peer_of.pop(conn, None)
        if peer is None:
            return
        self.open -= 1
        conns = self._by_peer[peer]
        del conns[conn]
        if not conns:
            del self._by_peer[peer]


class Tally:
    """Occurrences of one event, reported at most once per ``interval``. The first is
    reported at once, those within the next ``interval`` are held back and reported together at
    its end."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.held = 0
        self.quiet_until = -math.inf

    def add(self, now: float) -> int:
        """Count one; returns how many to report now (0: held back until :meth:`take`)."""
        self.held += 1
        if now < self.quiet_until:
            return 0
        return self.take(now)

    def take(self, now: float) -> int:
        """Those held back, to be reported at the end of the quiet spell; starts another."""
        count, self.held = self.held, 0
        if count:
            self.quiet_until = now + self.interval
        return count
