"""Which connections an HTTP server of the reactor holds, and floods of one event counted. Pure:
no socket and no clock (``now`` is passed in); :mod:`reactor.ops.accept` does the I/O.

A server holds at most :data:`MAX_CONNECTIONS` at once, and one peer address at most
:data:`MAX_PER_PEER` of them. The last :data:`KEPT_FOR_NEW_PEERS` places go only to a peer that
holds none: an orchestrator's probe opens one connection at a time, so it always finds a place
while other peers hold all they may, be it one peer at its own cap or several sharing the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Literal

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

# Why a connection was closed before a request: the places open to its peer were taken (limit),
# its peer held MAX_PER_PEER already (peer_limit), or no request head came in time.
# (reactor.metrics.HTTP_DROP_REASONS: the label values of the counter they are counted in.)
DropReason = Literal["limit", "peer_limit", "head_timeout"]


class HeadEnd:
    """Finds the end of a connection's first request head in the bytes as they arrive: the
    blank line after it.

    aiohttp's request parser (llhttp, strict for requests) ends lines with CRLF only, so the
    head ends at the first CRLF CRLF after the request line; empty lines before the request
    line are skipped, so that they cannot end it early.
    """

    def __init__(self) -> None:
        self._started = False
        self._tail = b""  # the last bytes seen, for a CRLF CRLF split across two reads

    def feed(self, data: bytes) -> bool:
        """True once the head is complete."""
        if not self._started:
            data = data.lstrip(b"\r\n")
            if not data:
                return False
            self._started = True
        window = self._tail + data
        if b"\r\n\r\n" in window:
            return True
        self._tail = window[-3:]
        return False


@dataclass(eq=False, repr=False)
class Door:
    """The connections one server holds, by peer address: at most ``limit`` at once, at most
    ``per_peer`` from one peer, and the last ``kept_for_new`` places only for a peer holding
    none. Each connection has ``head_seconds`` to send its first request head. ``dropped``
    hears of each connection closed before a request, with the reason."""

    server: str
    _: KW_ONLY
    limit: int = MAX_CONNECTIONS
    per_peer: int = MAX_PER_PEER
    kept_for_new: int = KEPT_FOR_NEW_PEERS
    head_seconds: float = HEAD_SECONDS
    dropped: Callable[[DropReason], None] = lambda reason: None
    open: int = field(default=0, init=False)
    # By peer address; a peer holding none is absent.
    held: dict[str, int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if not 0 <= self.kept_for_new < self.limit or self.per_peer < 1:
            raise ValueError("a door needs 0 <= kept_for_new < limit and per_peer >= 1")

    def refusal(self, peer: str) -> DropReason | None:
        """Why a connection from ``peer`` would be refused now; None: it would be admitted."""
        holding = self.held.get(peer, 0)
        if holding >= self.per_peer:
            return "peer_limit"
        room = self.limit if holding == 0 else self.limit - self.kept_for_new
        return "limit" if self.open >= room else None

    def admit(self, peer: str) -> bool:
        """Take one more connection from ``peer``, or say no (and count why)."""
        reason = self.refusal(peer)
        if reason is not None:
            self.dropped(reason)
            return False
        self.open += 1
        self.held[peer] = self.held.get(peer, 0) + 1
        return True

    def release(self, peer: str) -> None:
        """A connection :meth:`admit` took from ``peer`` has closed."""
        self.open -= 1
        left = self.held[peer] - 1
        if left:
            self.held[peer] = left
        else:
            del self.held[peer]


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
