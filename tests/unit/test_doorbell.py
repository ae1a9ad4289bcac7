"""When a replica rings the doorbell, renews it, and polls for it (reactor.insurance.doorbell)."""

from __future__ import annotations

import math

from reactor.core.payload import Rang, read
from reactor.insurance.doorbell import LEASE_POLLS, MIN_GRACE_POLLS, WINDOW_S, Doorbell

RATE = 20
INTERVAL = 0.25
GRACE = 120.0


def _heard(bell: Doorbell, count: int, *, start: float, every: float) -> list[bool]:
    return [bell.heard(start + i * every) for i in range(count)]


def test_a_stream_at_the_rate_rings_the_bell_once() -> None:
    bell = Doorbell(RATE, INTERVAL, GRACE)
    rang = _heard(bell, RATE, start=0.0, every=WINDOW_S / RATE / 2)
    assert rang == [False] * (RATE - 1) + [True]
    assert bell.ring()
    assert bell.covers(1.0)  # the poll runs at once to ring it


def test_a_stream_below_the_rate_never_rings_it() -> None:
    bell = Doorbell(RATE, INTERVAL, GRACE)
    # One short of the rate in every window of a second, for a minute.
    assert not any(_heard(bell, 60 * (RATE - 1), start=0.0, every=WINDOW_S / (RATE - 1) * 1.001))
    assert not bell.ring()
    assert not bell.covers(60.0)


def test_a_rate_of_zero_never_rings_it() -> None:
    bell = Doorbell(0, INTERVAL, GRACE)
    assert not any(_heard(bell, 1000, start=0.0, every=0.001))
    bell.polled(1.0, None, arrivals=1000)
    assert not bell.ring()


def test_a_ring_polls_while_awake_and_a_grace_after() -> None:
    bell = Doorbell(RATE, INTERVAL, GRACE)
    _heard(bell, RATE, start=0.0, every=0.001)
    # The poll rang it: awake for the lease.
    bell.polled(1.0, bell.lease, arrivals=RATE)
    assert bell.lease == LEASE_POLLS * INTERVAL
    assert bell.awake(1.0 + bell.lease - 0.01)
    assert not bell.awake(1.0 + bell.lease)
    # Polled for a grace past its end: what was queued without a notification comes due.
    assert bell.covers(1.0 + bell.lease + GRACE - 0.01)
    assert not bell.covers(1.0 + bell.lease + GRACE)


def test_the_poll_renews_it_while_the_jobs_keep_coming() -> None:
    bell = Doorbell(RATE, INTERVAL, GRACE)
    _heard(bell, RATE, start=0.0, every=0.001)
    enough = math.ceil(RATE * INTERVAL / 2)
    bell.polled(1.0, bell.lease, arrivals=enough)
    assert bell.ring()
    bell.polled(1.25, bell.lease, arrivals=enough - 1)
    assert not bell.ring()


def test_a_replica_polling_less_often_holds_and_judges_it_over_its_own_interval() -> None:
    bell = Doorbell(RATE, INTERVAL, GRACE)
    bell.pace(4 * INTERVAL)
    assert bell.lease == LEASE_POLLS * 4 * INTERVAL
    # Half the rate over the longer interval renews it; what renewed it at the short one does not.
    bell.polled(1.0, bell.lease, arrivals=math.ceil(RATE * INTERVAL / 2))
    assert not bell.ring()
    bell.polled(2.0, bell.lease, arrivals=math.ceil(RATE * 4 * INTERVAL / 2))
    assert bell.ring()


def test_a_grace_shorter_than_two_polls_never_rings_it() -> None:
    short = Doorbell(RATE, INTERVAL, MIN_GRACE_POLLS * INTERVAL - 0.01)
    assert not any(_heard(short, 2 * RATE, start=0.0, every=0.001))
    assert not short.ring()
    enough = Doorbell(RATE, INTERVAL, MIN_GRACE_POLLS * INTERVAL)
    assert any(_heard(enough, 2 * RATE, start=0.0, every=0.001))


def test_a_bell_another_replica_rang_is_polled_for() -> None:
    bell = Doorbell(RATE, INTERVAL, GRACE)
    assert not bell.covers(10.0)
    bell.saw(10.0, 0.5)
    assert bell.awake(10.4)
    assert bell.covers(10.5 + GRACE - 0.01)
    # Read silent later, it is polled for until the grace after the end already seen.
    bell.saw(11.0, None)
    bell.saw(11.0, -3.0)
    assert bell.covers(10.5 + GRACE - 0.01)
    assert not bell.ring()


def test_notifications_heard_while_it_is_awake_do_not_ring_it_again() -> None:
    bell = Doorbell(RATE, INTERVAL, GRACE)
    bell.saw(0.0, 1.0)
    assert not any(_heard(bell, 10 * RATE, start=0.0, every=0.0001))


def test_a_replica_told_of_a_ring_polls_until_it_has_read_the_bell() -> None:
    bell = Doorbell(RATE, INTERVAL, GRACE)
    bell.told()
    assert bell.covers(0.0)
    assert not bell.ring()  # told, not asked: it reads the bell, it does not ring it
    bell.polled(0.1, None, arrivals=0)  # a stranger's word: the bell is silent
    assert not bell.covers(0.1)
    bell.told()
    bell.polled(0.2, 1.0, arrivals=0)
    assert bell.covers(1.2 + GRACE - 0.01)


def test_the_membership_channel_says_which_bell_rang() -> None:
    assert read("rang:analysis_jobs_terminal", "uuid") == Rang("analysis_jobs_terminal")
    # Only where membership is heard; a job channel's 'rang:' names nothing.
    assert read("rang:analysis_jobs_terminal", "uuid", membership=False) is None
