"""reactor.http without a socket: where a request head ends, and a flood counted."""

from __future__ import annotations

import pytest

from reactor.http import Door, HeadEnd, Tally


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
    door = Door("probes", limit=2, dropped=reasons.append)
    assert door.admit()
    assert door.admit()
    assert not door.admit()
    door.release()
    assert door.admit()
    assert reasons == ["limit"]
    assert door.open == 2


def test_a_tally_reports_the_first_then_once_per_interval() -> None:
    tally = Tally(10)
    assert tally.add(0) == 1
    assert [tally.add(t / 100_000) for t in range(1, 1_000_000)] == [0] * 999_999
    assert tally.take(10) == 999_999  # the end of the quiet spell
    assert tally.add(15) == 0  # a new spell began at 10
    assert tally.take(20) == 1
    assert tally.take(30) == 0  # nothing held: nothing to say
    assert tally.add(31) == 1  # and the next is news again
