"""reactor.core.dbclock: database times land on the local clock no earlier than they happen."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reactor.core.dbclock import DatabaseClock


def test_without_samples_there_is_no_estimate() -> None:
    assert DatabaseClock().local(1_000.0) is None


def test_the_shortest_round_trip_wins() -> None:
    clock = DatabaseClock()
    # The database clock is local + 500 s; readings happen at a random point of each trip.
    clock.observe(database_time=510.0 + 0.4, sent=10.0, received=10.5)
    clock.observe(database_time=520.0 + 0.001, sent=20.0, received=20.002)
    local = clock.local(600.0)
    assert local is not None
    assert 100.0 <= local <= 100.002


def test_samples_age_out() -> None:
    clock = DatabaseClock(keep=2)
    clock.observe(database_time=500.0, sent=0.0, received=0.0)  # offset 500, a perfect sample
    clock.observe(database_time=510.0 + 0.05, sent=10.0, received=10.1)
    clock.observe(database_time=520.0 + 0.05, sent=20.0, received=20.1)
    local = clock.local(600.0)
    assert local is not None
    assert local > 100.0  # the perfect sample is gone; the rest carry their uncertainty


def test_a_reversed_reading_is_ignored() -> None:
    clock = DatabaseClock()
    clock.observe(database_time=5.0, sent=2.0, received=1.0)
    assert clock.local(5.0) is None


@given(
    st.floats(-1e6, 1e6),
    st.lists(st.tuples(st.floats(0, 1e4), st.floats(0, 0.5), st.floats(0, 1)), min_size=1),
    st.floats(0, 1e4),
)
def test_never_before_the_true_time(
    true_offset: float, readings: list[tuple[float, float, float]], target: float
) -> None:
    clock = DatabaseClock()
    for sent, trip, where in readings:
        received = sent + trip
        clock.observe(true_offset + sent + where * trip, sent, received)
    local = clock.local(true_offset + target)
    assert local is not None
    assert local >= target - 1e-6
