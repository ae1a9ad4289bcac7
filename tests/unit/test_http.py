"""reactor.ops.admission and reactor.ops.accept without a socket: where a connection's requests
begin and end, which connections are admitted, whose place a new peer takes, and a flood
counted."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from reactor.ops.accept import peer_address
from reactor.ops.admission import (
    KEPT_FOR_NEW_PEERS,
    MAX_CONNECTIONS,
    MAX_FOLLOWED_BYTES,
    MAX_PER_PEER,
    Door,
    Requests,
    Tally,
)


@pytest.mark.parametrize(
    ("chunks", "ends_at"),
    [
        ([b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"], 0),
        ([b"GET / HTTP/1.1\r\nHost: x\r\n", b"\r\n"], 1),
        ([b"GET / HTTP/1.1\r\nHost: x\r", b"\n\r", b"\n"], 2),
        # Empty lines before the request line do not end it.
        ([b"\r\n\r\n", b"\r\n", b"GET / HTTP/1.1\r\n", b"Host: x\r\n\r\n"], 3),
        ([b"GET /heal"], None),
        ([b"GET / HTTP/1.1\n\n"], None),  # not a line end the request parser takes
    ],
)
def test_the_end_of_a_request_head(chunks: list[bytes], ends_at: int | None) -> None:
    requests = Requests()
    ended = []
    for chunk in chunks:
        requests.feed(chunk)
        ended.append(requests.heads == 1)
    assert ended.index(True) == ends_at if ends_at is not None else not any(ended)
    assert requests.stage == ("between" if ends_at is not None else "head")


def stages(chunks: list[bytes]) -> list[tuple[str, int]]:
    """The stage and the heads counted after each chunk."""
    requests = Requests()
    seen: list[tuple[str, int]] = []
    for chunk in chunks:
        requests.feed(chunk)
        seen.append((requests.stage, requests.heads))
    return seen


def test_a_declared_body_is_followed_to_its_end() -> None:
    head = b"POST /login HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n"
    assert stages([head, b"token", b"=abcd", b"\r\n", b"GET / HTTP/1.1\r\n\r\n"]) == [
        ("body", 1),
        ("body", 1),
        ("between", 1),
        ("between", 1),  # the CRLF some clients send after a body starts nothing
        ("between", 2),
    ]
    # A body that holds what looks like a head ends a head no more than any other bytes.
    body = b"GET / HTTP/1.1\r\n\r\n"
    framed = head.replace(b"10", str(len(body)).encode())
    assert stages([framed + body]) == [("between", 1)]


def test_a_chunked_body_is_followed_to_its_end() -> None:
    head = b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = [
        b"5;ext=1\r\nhel",
        b"lo\r\n",
        b"A\r\n0123456789\r",
        b"\n0\r\n",
        b"Trailer: t\r\n",
        b"\r\n",
    ]
    assert stages([head, *body]) == [("body", 1)] * 6 + [("between", 1)]


def test_pipelined_requests_are_counted_as_they_come() -> None:
    one = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    assert stages([one * 5 + one[:10]]) == [("head", 5)]
    posted = b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\nab"
    assert stages([(posted + one) * 3]) == [("between", 6)]


def test_requests_are_followed_however_the_reads_split_them() -> None:
    """A stream of every kind of request, fed whole, a byte at a time, and in random pieces:
    the same heads, at the same offsets."""
    stream = [
        b"\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /login HTTP/1.1\r\nContent-Length: 12\r\n\r\ntoken=\r\n\r\nab",
        b"\r\n",
        b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n\r\n\r\r\n0\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\n\r\n",
    ]
    data = b"".join(stream)
    # Where each request ends, as offsets into the stream.
    ends = {sum(map(len, stream[: n + 1])) for n in range(len(stream)) if n != 2}

    def heads_at_ends(pieces: list[bytes]) -> list[tuple[int, str, int]]:
        requests, offset = Requests(), 0
        seen: list[tuple[int, str, int]] = []
        for piece in pieces:
            requests.feed(piece)
            offset += len(piece)
            if offset in ends:
                seen.append((offset, requests.stage, requests.heads))
        return seen

    expected = [(end, "between", n + 1) for n, end in enumerate(sorted(ends))]
    assert heads_at_ends([data]) == expected[-1:]
    assert heads_at_ends([data[i : i + 1] for i in range(len(data))]) == expected
    rng = random.Random(7)
    inner_ends = sorted(ends - {len(data)})
    for _ in range(500):
        cuts = sorted({*rng.sample(range(1, len(data)), 12), *rng.sample(inner_ends, 2)})
        pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        assert heads_at_ends(pieces) == [e for e in expected if e[0] in {*cuts, len(data)}]


@pytest.mark.parametrize(
    "head",
    [
        b"POST / HTTP/1.1\r\nContent-Length: ten\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"GET / HTTP/1.1\r\nno colon\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: " + b"x" * (MAX_FOLLOWED_BYTES + 1),
    ],
)
def test_a_request_the_parser_refuses_is_followed_no_further(head: bytes) -> None:
    requests = Requests()
    requests.feed(head)
    requests.feed(b"GET / HTTP/1.1\r\n\r\n")
    assert (requests.stage, requests.heads) == ("lost", 0)


def test_a_bad_chunk_line_loses_the_connection() -> None:
    requests = Requests()
    requests.feed(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
    assert requests.stage == "lost"


class Conns:
    """Connections for a :class:`Door` to hold: ``conns.open(door, peer)`` admits a new one and
    returns it, or None when refused."""

    def __init__(self) -> None:
        self.made = 0

    def open(self, door: Door[int], peer: str) -> int | None:
        self.made += 1
        return self.made if door.admit(peer, self.made) else None


def test_the_door_admits_up_to_its_limit_and_counts_the_rest() -> None:
    reasons: list[str] = []
    door: Door[int] = Door("probes", limit=2, per_peer=2, kept_for_new=0, dropped=reasons.append)
    conns = Conns()
    a, b = conns.open(door, "a"), conns.open(door, "b")
    assert a is not None
    assert b is not None
    assert conns.open(door, "c") is None
    door.release(b)
    door.release(b)  # twice is once
    assert conns.open(door, "c") is not None
    assert reasons == ["limit"]
    assert door.open == 2
    assert door.held == {"a": 1, "c": 1}


def test_one_peer_gets_its_own_cap_and_no_more() -> None:
    reasons: list[str] = []
    door: Door[int] = Door("probes", limit=10, per_peer=3, kept_for_new=2, dropped=reasons.append)
    conns = Conns()
    held = [conns.open(door, "10.0.0.9") for _ in range(5)]
    assert [conn is not None for conn in held] == [True, True, True, False, False]
    assert reasons == ["peer_limit", "peer_limit"]
    other = conns.open(door, "10.0.0.1")  # another peer is not held back by it
    assert other is not None
    assert held[0] is not None
    door.release(held[0])
    assert conns.open(door, "10.0.0.9") is not None  # a place it freed is its own again
    door.release(other)
    assert door.held == {"10.0.0.9": 3}


def test_places_are_kept_for_a_peer_that_holds_none() -> None:
    reasons: list[str] = []
    door: Door[int] = Door("probes", limit=6, per_peer=3, kept_for_new=2, dropped=reasons.append)
    conns = Conns()
    # Two peers holding connections share the first 4 places, and no more.
    for _ in range(2):
        assert conns.open(door, "a") is not None
        assert conns.open(door, "b") is not None
    assert conns.open(door, "a") is None
    assert conns.open(door, "b") is None
    assert reasons == ["limit", "limit"]
    # A peer holding none takes a kept place; its second connection is one of the shared ones.
    assert door.make_room("probe") is None  # there is room
    assert conns.open(door, "probe") is not None
    assert conns.open(door, "probe") is None
    assert conns.open(door, "other") is not None
    # Every place is taken now: a new peer too is refused, unless it makes room.
    assert conns.open(door, "third") is None
    assert reasons[-1] == "limit"
    assert door.open == 6


def test_a_new_peer_takes_the_oldest_place_of_the_peer_that_holds_the_most() -> None:
    reasons: list[str] = []
    door: Door[int] = Door("probes", limit=6, per_peer=3, kept_for_new=2, dropped=reasons.append)
    conns = Conns()
    a = [conns.open(door, "a") for _ in range(2)]
    b = [conns.open(door, "b") for _ in range(2)]
    singles = [conns.open(door, peer) for peer in ("c", "d")]
    assert door.open == 6
    # Ties go to the peer that came first; its oldest connection is given up.
    assert door.make_room("probe") == a[0]
    assert reasons == ["made_room"]
    assert conns.open(door, "probe") is not None
    assert door.held == {"a": 1, "b": 2, "c": 1, "d": 1, "probe": 1}
    assert door.make_room("other") == b[0]
    assert conns.open(door, "other") is not None
    # A connection given up is released when it closes, and that changes nothing.
    door.release(a[0])  # type: ignore[arg-type]
    assert door.open == 6
    # Every peer holds one now: none has a place to spare, so the next is refused.
    assert door.make_room("late") is None
    assert conns.open(door, "late") is None
    # A peer that holds one does not make room, whatever others hold.
    assert singles[0] is not None
    assert door.make_room("c") is None
    assert reasons == ["made_room", "made_room", "limit"]


@pytest.mark.parametrize(("limit", "per_peer", "kept_for_new"), [(2, 1, 2), (2, 0, 0), (2, 1, -1)])
def test_a_door_that_could_never_admit_a_new_peer_is_refused(
    limit: int, per_peer: int, kept_for_new: int
) -> None:
    with pytest.raises(ValueError, match="kept_for_new"):
        Door("probes", limit=limit, per_peer=per_peer, kept_for_new=kept_for_new)


def test_a_probe_always_gets_in_whatever_the_others_hold() -> None:
    """The defaults, under random traffic from 40 peers: one peer never holds more than its
    cap, connections beyond each peer's first never take the kept places, and a peer holding
    none is refused only when every peer holds one place."""
    rng = random.Random(39)
    door: Door[int] = Door("probes")
    conns = Conns()
    holding: list[int] = []
    peers = [f"10.0.0.{n}" for n in range(80)]
    for _ in range(100_000):
        if holding and rng.random() < 0.3:
            door.release(holding.pop(rng.randrange(len(holding))))
        else:
            peer = rng.choice(peers)
            given_up = door.make_room(peer)
            if given_up is not None:
                holding.remove(given_up)
            conn = conns.open(door, peer)
            if conn is not None:
                holding.append(conn)
            elif peer not in door.held:
                assert door.held == dict.fromkeys(door.held, 1)
                assert door.open == MAX_CONNECTIONS
        assert door.open == len(holding) <= MAX_CONNECTIONS
        assert max(door.held.values(), default=0) <= MAX_PER_PEER
        assert sum(door.held.values()) == door.open
        # The shared places never spill into the kept ones.
        held_beyond_first = sum(count - 1 for count in door.held.values())
        assert held_beyond_first <= MAX_CONNECTIONS - KEPT_FOR_NEW_PEERS


def test_one_peer_at_its_cap_leaves_the_probes_their_place() -> None:
    door: Door[int] = Door("probes")
    conns = Conns()
    admitted = sum(conns.open(door, "127.0.0.2") is not None for _ in range(80))
    assert admitted == MAX_PER_PEER
    assert door.refusal("127.0.0.1") is None
    assert door.refusal("127.0.0.2") == "peer_limit"


def test_eighteen_peers_holding_every_place_leave_the_probe_one() -> None:
    """The shape of tests/acceptance/test_http_hold.py: two peers at their cap and sixteen with
    one each hold all 64; the probe takes a place of one of the two."""
    door: Door[int] = Door("probes")
    conns = Conns()
    for peer in ("127.0.0.2", "127.0.0.3"):
        for _ in range(MAX_PER_PEER):
            assert conns.open(door, peer) is not None
    for n in range(4, 4 + KEPT_FOR_NEW_PEERS):
        assert conns.open(door, f"127.0.0.{n}") is not None
    assert door.open == MAX_CONNECTIONS
    assert door.make_room("127.0.0.1") is not None
    assert conns.open(door, "127.0.0.1") is not None
    # The peer that lost a place cannot take it back while the probe holds it, nor after.
    assert door.refusal("127.0.0.2") == "limit"


class _Transport(asyncio.BaseTransport):
    def __init__(self, peer: Any) -> None:
        super().__init__()
        self._peer = peer

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._peer if name == "peername" else default


@pytest.mark.parametrize(
    ("peername", "address"),
    [
        (("127.0.0.2", 40000), "127.0.0.2"),
        (("::ffff:10.1.2.3", 40000, 0, 0), "10.1.2.3"),
        (("2001:db8::1", 40000, 0, 0), "2001:db8::1"),
        (None, ""),
    ],
)
def test_a_peer_is_its_address_without_the_port(peername: Any, address: str) -> None:
    assert peer_address(_Transport(peername)) == address


def test_a_tally_reports_the_first_then_once_per_interval() -> None:
    tally = Tally(10)
    assert tally.add(0) == 1
    assert [tally.add(t / 100_000) for t in range(1, 1_000_000)] == [0] * 999_999
    assert tally.take(10) == 999_999  # the end of the quiet spell
    assert tally.add(15) == 0  # a new spell began at 10
    assert tally.take(20) == 1
    assert tally.take(30) == 0  # nothing held: nothing to say
    assert tally.add(31) == 1  # and the next is news again
