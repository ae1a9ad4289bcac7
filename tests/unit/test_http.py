"""reactor.core.admission and reactor.accept without a socket: where a request head ends, which
connections are admitted, and a flood counted."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from reactor.core.admission import (
    KEPT_FOR_NEW_PEERS,
    MAX_CONNECTIONS,
    MAX_PER_PEER,
    Door,
    HeadEnd,
    Tally,
)
from reactor.ops.accept import peer_address


@pytest.mark.parametrize(
    ("chunks", "ends_at"),
    [
        ([b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"], 0),
        ([b"GET / HTTP/1.1\r\nHost: x\r\n", b"\r\n"], 1),
        ([b"GET / HTTP/1.1\r\nHost: x\r", b"\n\r", b"\n"], 2),
        ([b"GET / HTTP/1.1\r\n\r\nbody"], 0),
        # Empty lines before the request line do not end it.
        ([b"\r\n\r\n", b"\r\n", b"GET / HTTP/1.1\r\n", b"Host: x\r\n\r\n"], 3),
        ([b"GET /heal"], None),
        ([b"GET / HTTP/1.1\n\n"], None),  # not a line end the request parser takes
    ],
)
def test_the_end_of_a_request_head(chunks: list[bytes], ends_at: int | None) -> None:
    head = HeadEnd()
    ended = [head.feed(chunk) for chunk in chunks]
    assert ended.index(True) == ends_at if ends_at is not None else not any(ended)


def test_the_door_admits_up_to_its_limit_and_counts_the_rest() -> None:
    reasons: list[str] = []
    door = Door("probes", limit=2, per_peer=2, kept_for_new=0, dropped=reasons.append)
    assert door.admit("a")
    assert door.admit("b")
    assert not door.admit("c")
    door.release("b")
    assert door.admit("c")
    assert reasons == ["limit"]
    assert door.open == 2
    assert door.held == {"a": 1, "c": 1}


def test_one_peer_gets_its_own_cap_and_no_more() -> None:
    reasons: list[str] = []
    door = Door("probes", limit=10, per_peer=3, kept_for_new=2, dropped=reasons.append)
    assert [door.admit("10.0.0.9") for _ in range(5)] == [True, True, True, False, False]
    assert reasons == ["peer_limit", "peer_limit"]
    assert door.admit("10.0.0.1")  # another peer is not held back by it
    door.release("10.0.0.9")
    assert door.admit("10.0.0.9")  # a place it freed is its own again
    door.release("10.0.0.1")
    assert door.held == {"10.0.0.9": 3}


def test_places_are_kept_for_a_peer_that_holds_none() -> None:
    reasons: list[str] = []
    door = Door("probes", limit=6, per_peer=3, kept_for_new=2, dropped=reasons.append)
    # Two peers holding connections share the first 4 places, and no more.
    for _ in range(2):
        assert door.admit("a")
        assert door.admit("b")
    assert not door.admit("a")
    assert not door.admit("b")
    assert reasons == ["limit", "limit"]
    # A peer holding none takes a kept place; its second connection is one of the shared ones.
    assert door.admit("probe")
    assert not door.admit("probe")
    assert door.admit("other")
    # Every place is taken now: a new peer too is refused.
    assert not door.admit("third")
    assert reasons[-1] == "limit"
    assert door.open == 6


@pytest.mark.parametrize(("limit", "per_peer", "kept_for_new"), [(2, 1, 2), (2, 0, 0), (2, 1, -1)])
def test_a_door_that_could_never_admit_a_new_peer_is_refused(
    limit: int, per_peer: int, kept_for_new: int
) -> None:
    with pytest.raises(ValueError, match="kept_for_new"):
        Door("probes", limit=limit, per_peer=per_peer, kept_for_new=kept_for_new)


def test_a_probe_always_gets_in_whatever_the_others_hold() -> None:
    """The defaults, under random traffic from 40 peers: one peer never holds more than its
    cap, connections beyond each peer's first never take the kept places, and a peer holding
    none is refused only when every place is taken."""
    rng = random.Random(39)
    door = Door("probes")
    holding: list[str] = []
    peers = [f"10.0.0.{n}" for n in range(40)]
    for _ in range(100_000):
        if holding and rng.random() < 0.3:
            peer = holding.pop(rng.randrange(len(holding)))
            door.release(peer)
        else:
            peer = rng.choice(peers)
            if door.admit(peer):
                holding.append(peer)
        assert door.open == len(holding) <= MAX_CONNECTIONS
        assert max(door.held.values(), default=0) <= MAX_PER_PEER
        assert sum(door.held.values()) == door.open
        # The shared places never spill into the kept ones.
        held_beyond_first = sum(count - 1 for count in door.held.values())
        assert held_beyond_first <= MAX_CONNECTIONS - KEPT_FOR_NEW_PEERS
        full = door.open == MAX_CONNECTIONS
        assert door.refusal("10.9.9.9") == ("limit" if full else None)


def test_one_peer_at_its_cap_leaves_the_probes_their_place() -> None:
    door = Door("probes")
    admitted = sum(door.admit("127.0.0.2") for _ in range(80))
    assert admitted == MAX_PER_PEER
    assert door.refusal("127.0.0.1") is None
    assert door.refusal("127.0.0.2") == "peer_limit"


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
