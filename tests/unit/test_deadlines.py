"""reactor.core.deadlines: its FIFO and heap, driven by a fake clock (``now`` is always passed
in)."""

from __future__ import annotations

import itertools
import math
import random
import uuid
from collections.abc import Hashable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from reactor.core.deadlines import Deadlines, pack_text, unpack_text

GRACE = 120.0


def held(d: Deadlines[Any]) -> int:
    """Entries the structure holds, tombstones included."""
    return len(d._fifo_keys) + len(d._heap)


def bound(d: Deadlines[Any]) -> int:
    """The most entries it may hold right after any call."""
    return 2 * len(d) + 64 + 1


def job_ids(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n)]


# -- ordering -----------------------------------------------------------------------------------


def test_empty() -> None:
    d: Deadlines[str] = Deadlines()
    assert len(d) == 0
    assert d.next_deadline() is None
    assert d.pop_due(1e18) == []
    assert d.when("a") is None
    assert "a" not in d
    assert not d.cancel("a")


def test_earliest_comes_out_first() -> None:
    d: Deadlines[str] = Deadlines()
    for key, when in [("c", 30.0), ("a", 10.0), ("d", 40.0), ("b", 20.0)]:
        d.schedule(key, when)
    assert len(d) == 4
    assert set(d) == {"a", "b", "c", "d"}
    assert d.next_deadline() == 10.0
    assert d.pop_due(math.inf) == ["a", "b", "c", "d"]
    assert len(d) == 0
    assert d.next_deadline() is None


def test_in_order_and_out_of_order_deadlines_merge() -> None:
    d: Deadlines[int] = Deadlines()
    for key, when in enumerate([1.0, 3.0, 5.0, 7.0]):  # in arrival order: the FIFO
        d.schedule(key, when)
    for key, when in [(10, 2.0), (11, 6.0), (12, 0.5)]:  # earlier than the last: the heap
        d.schedule(key, when)
    assert len(d._heap) == 3
    assert d.next_deadline() == 0.5
    assert d.pop_due(5.0) == [12, 0, 10, 1, 2]
    assert d.pop_due(math.inf) == [11, 3]


def test_pop_due_takes_only_what_is_due_inclusive() -> None:
    d: Deadlines[str] = Deadlines()
    d.schedule("a", 10.0)
    d.schedule("b", 20.0)
    d.schedule("c", 30.0)
    assert d.pop_due(9.999) == []
    assert d.pop_due(10.0) == ["a"]  # a deadline equal to now is due
    assert d.pop_due(25.0) == ["b"]
    assert d.next_deadline() == 30.0
    assert "c" in d
    assert d.pop_due(1000.0) == ["c"]


def test_int_deadlines_are_accepted() -> None:
    d: Deadlines[str] = Deadlines()
    d.schedule("a", 5)
    assert d.when("a") == 5.0
    assert isinstance(d.when("a"), float)
    assert d.pop_due(5) == ["a"]


def test_nan_is_refused_and_changes_nothing() -> None:
    d: Deadlines[str] = Deadlines()
    d.schedule("a", 1.0)
    with pytest.raises(ValueError, match="NaN"):
        d.schedule("a", math.nan)
    assert d.when("a") == 1.0
    assert d.pop_due(1.0) == ["a"]


def test_equal_deadlines_for_different_keys() -> None:
    d: Deadlines[str] = Deadlines()
    for key in ["b", "c", "a"]:
        d.schedule(key, 7.0)
    d.schedule("z", 3.0)
    d.schedule("y", 7.0)  # earlier than the last? no: equal, so it joins the FIFO
    d.schedule("x", 5.0)  # the heap
    assert len(d) == 6
    assert d.next_deadline() == 3.0
    assert d.pop_due(6.0) == ["z", "x"]
    # Equal deadlines come out together, in no promised order.
    assert sorted(d.pop_due(7.0)) == ["a", "b", "c", "y"]
    assert len(d) == 0


# -- last write wins ------------------------------------------------------------------------------


def test_reschedule_later_replaces() -> None:
    d: Deadlines[str] = Deadlines()
    d.schedule("a", 10.0)
    d.schedule("b", 20.0)
    d.schedule("a", 30.0)
    assert len(d) == 2
    assert d.when("a") == 30.0
    assert d.next_deadline() == 20.0  # a's old entry is a tombstone now
    assert d.pop_due(10.0) == []
    assert d.pop_due(25.0) == ["b"]
    assert d.pop_due(30.0) == ["a"]
    assert d.pop_due(math.inf) == []


def test_reschedule_earlier_replaces() -> None:
    d: Deadlines[str] = Deadlines()
    d.schedule("a", 30.0)
    d.schedule("b", 20.0)
    d.schedule("a", 10.0)
    assert d.when("a") == 10.0
    assert d.next_deadline() == 10.0
    assert d.pop_due(10.0) == ["a"]
    assert d.pop_due(math.inf) == ["b"]  # and a does not come out a second time


def test_reschedule_to_an_equal_time_leaves_one_entry_live() -> None:
    d: Deadlines[str] = Deadlines()
    d.schedule("a", float("10"))
    d.schedule("a", float("10"))  # an equal value in a different float object
    d.schedule("a", 10)
    assert len(d) == 1
    assert d.pop_due(10.0) == ["a"]
    assert d.pop_due(math.inf) == []
    assert d.next_deadline() is None


def test_a_tombstone_with_the_new_time_comes_out_once() -> None:
    d: Deadlines[str] = Deadlines()
    first = 10.0
    d.schedule("a", first)
    d.schedule("a", 20.0)
    d.schedule("a", first)  # the same float object as the FIFO's first entry, now in the heap
    assert d.pop_due(10.0) == ["a"]
    assert d.pop_due(math.inf) == []
    assert len(d) == 0


def test_rescheduling_after_pop_starts_afresh() -> None:
    d: Deadlines[str] = Deadlines()
    d.schedule("a", 1.0)
    assert d.pop_due(1.0) == ["a"]
    d.schedule("a", 5.0)
    assert d.pop_due(4.0) == []
    assert d.pop_due(5.0) == ["a"]


# -- cancel --------------------------------------------------------------------------------------


def test_cancel() -> None:
    d: Deadlines[str] = Deadlines()
    d.schedule("a", 10.0)
    d.schedule("b", 20.0)
    assert d.cancel("a") is True
    assert d.cancel("a") is False
    assert "a" not in d
    assert d.when("a") is None
    assert len(d) == 1
    assert d.next_deadline() == 20.0
    assert d.pop_due(math.inf) == ["b"]


def test_cancel_then_schedule_again() -> None:
    d: Deadlines[str] = Deadlines()
    d.schedule("a", 10.0)
    d.cancel("a")
    d.schedule("a", 15.0)
    assert d.pop_due(12.0) == []
    assert d.pop_due(15.0) == ["a"]


def test_next_deadline_skips_tombstones() -> None:
    d: Deadlines[str] = Deadlines()
    for i in range(10):
        d.schedule(f"k{i}", float(i))
    for i in range(0, 9):
        d.cancel(f"k{i}")
    d.schedule("k9", 100.0)  # the last live key moves later: its old entry is a tombstone too
    d.schedule("z", 50.0)
    assert d.next_deadline() == 50.0
    assert d.pop_due(49.0) == []
    assert d.pop_due(100.0) == ["z", "k9"]
    assert d.next_deadline() is None


def test_everything_cancelled_means_nothing_pending() -> None:
    d: Deadlines[int] = Deadlines()
    for i in range(1000):
        d.schedule(i, float(i))
    for i in range(1000):
        assert d.cancel(i)
    assert len(d) == 0
    assert held(d) <= bound(d)
    assert d.next_deadline() is None
    assert d.pop_due(math.inf) == []


# -- pop_due limit -------------------------------------------------------------------------------


def test_pop_due_with_limit() -> None:
    d: Deadlines[int] = Deadlines()
    for i in range(10):
        d.schedule(i, float(i))
    assert d.pop_due(100.0, limit=0) == []
    assert d.pop_due(100.0, limit=-1) == []
    assert d.pop_due(100.0, limit=3) == [0, 1, 2]
    assert d.pop_due(4.0, limit=3) == [3, 4]  # the limit is a maximum, not a quota
    assert d.pop_due(100.0, limit=1) == [5]
    assert len(d) == 4
    assert d.pop_due(100.0, limit=100) == [6, 7, 8, 9]


def test_pop_due_limit_does_not_count_tombstones() -> None:
    d: Deadlines[int] = Deadlines()
    for i in range(10):
        d.schedule(i, float(i))
    for i in range(0, 10, 2):
        d.cancel(i)
    assert d.pop_due(100.0, limit=2) == [1, 3]
    assert d.pop_due(100.0, limit=2) == [5, 7]
    assert d.pop_due(100.0, limit=2) == [9]


# -- schedule's return value ---------------------------------------------------------------------


def test_schedule_returns_true_when_nothing_pending_is_earlier() -> None:
    d: Deadlines[str] = Deadlines()
    assert d.schedule("b", 20.0) is True  # first key: the head
    assert d.schedule("c", 30.0) is False
    assert d.schedule("a", 10.0) is True  # earlier than b
    assert d.schedule("d", 10.0) is True  # ties with a: the loop's wake-up time is right anyway
    assert d.schedule("e", 11.0) is False
    assert d.schedule("c", 5.0) is True  # rescheduled to the front
    assert d.pop_due(10.0) == ["c", "a", "d"]


def test_schedule_returns_true_after_the_head_was_popped() -> None:
    d: Deadlines[str] = Deadlines()
    d.schedule("a", 1.0)
    d.schedule("b", 9.0)
    assert d.pop_due(1.0) == ["a"]
    assert d.schedule("c", 5.0) is True


def test_schedule_returns_true_when_the_head_is_a_cancelled_tombstone() -> None:
    d: Deadlines[str] = Deadlines()
    d.schedule("a", 1.0)
    d.cancel("a")
    assert d.schedule("b", 5.0) is True  # b is the only pending key, so it is the head
    d.schedule("c", 0.5)
    d.cancel("c")
    assert d.schedule("d", 6.0) is False  # the heap's head is a tombstone; b is earlier


def test_schedule_returns_true_when_the_head_moves_later_but_stays_first() -> None:
    d: Deadlines[str] = Deadlines()
    d.schedule("a", 1.0)
    d.schedule("b", 50.0)
    assert d.schedule("a", 10.0) is True  # still earlier than b


def test_schedule_true_means_nothing_earlier_and_false_means_something_is() -> None:
    rng = random.Random(7)
    d: Deadlines[int] = Deadlines()
    for _ in range(5000):
        key = rng.randrange(50)
        if rng.random() < 0.2:
            d.cancel(key)
            continue
        when = float(rng.randrange(100))
        others = [w for k in d if k != key and (w := d.when(k)) is not None]
        assert d.schedule(key, when) is all(w >= when for w in others)
        if rng.random() < 0.1:
            d.pop_due(float(rng.randrange(100)), limit=rng.randrange(5))


# -- job ids are held as ints --------------------------------------------------------------------


def test_job_ids_are_held_as_ints_and_given_back_as_text() -> None:
    ids = job_ids(3)
    d: Deadlines[str] = Deadlines()
    for i, job in enumerate(ids):
        d.schedule(job, float(i))
    assert all(isinstance(k, int) for k in d._when)
    assert ids[1] in d
    assert d.when(ids[2]) == 2.0
    assert set(d) == set(ids)
    assert d.pop_due(0.0) == [ids[0]]
    assert d.cancel(ids[1])
    assert d.pop_due(math.inf) == [ids[2]]


@pytest.mark.parametrize(
    "text",
    [
        "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",  # uppercase
        "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
        "a0eebc999c0b4ef8bb6d6bb9bd380a11",
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1g",
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd38_a11",
        "+0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        " 0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1-",
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd38\u0661a11",  # an Arabic-Indic digit: int() takes it
        "job-7",
        "",
    ],
)
def test_other_text_is_kept_as_it_is(text: str) -> None:
    assert pack_text(text) == text
    d: Deadlines[str] = Deadlines()
    d.schedule(text, 1.0)
    d.schedule("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", 1.0)
    assert text in d
    assert sorted(d.pop_due(1.0)) == sorted([text, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"])


def test_pack_and_unpack_round_trip() -> None:
    for job in [*job_ids(200, seed=4), str(uuid.UUID(int=0)), str(uuid.UUID(int=2**128 - 1))]:
        packed = pack_text(job)
        assert packed == uuid.UUID(job).int
        assert unpack_text(packed) == job


def test_one_instance_takes_one_kind_of_key() -> None:
    job = str(uuid.UUID(int=5))
    text: Deadlines[Hashable] = Deadlines()
    text.schedule(job, 1.0)
    with pytest.raises(TypeError, match="str keys"):
        text.schedule(5, 1.0)
    # A look-alike of the other kind is never found, not even the packed form of the job.
    assert 5 not in text
    assert text.when(5) is None
    assert not text.cancel(5)
    ints: Deadlines[Hashable] = Deadlines()
    ints.schedule(5, 1.0)
    with pytest.raises(TypeError, match="non-str keys"):
        ints.schedule(job, 1.0)
    assert job not in ints
    assert ints.pop_due(1.0) == [5]


# -- memory stays proportional to the live keys --------------------------------------------------


def test_rescheduling_one_key_keeps_the_structure_bounded() -> None:
    d: Deadlines[str] = Deadlines()
    d.schedule("other", 1e9)
    last = math.nan
    for i in range(10_000):
        # Alternately earlier and later than the previous deadline.
        last = float(10_000 - i) if i % 2 else float(i)
        d.schedule("a", last)
        assert held(d) <= bound(d)
    assert len(d) == 2
    assert d.when("a") == last
    assert d.next_deadline() == last
    assert d.pop_due(math.inf) == ["a", "other"]


def test_schedule_and_cancel_forever_keeps_the_structure_bounded() -> None:
    d: Deadlines[int] = Deadlines()
    for i in range(10_000):
        d.schedule(i, float(i))
        d.cancel(i)
        assert held(d) <= bound(d)
    assert len(d) == 0


def test_compaction_keeps_behaviour_with_many_keys() -> None:
    rng = random.Random(3)
    d: Deadlines[int] = Deadlines()
    model: dict[int, float] = {}
    for _ in range(20_000):
        key = rng.randrange(300)
        when = rng.uniform(0, 1000)
        d.schedule(key, when)
        model[key] = when
        assert held(d) <= bound(d)
    for key in rng.sample(sorted(model), 100):
        assert d.cancel(key)
        del model[key]
    assert len(d) == len(model)
    assert d.next_deadline() == min(model.values())
    expected = [k for k, _ in sorted(model.items(), key=lambda kv: kv[1])]
    assert d.pop_due(math.inf) == expected


def test_after_a_far_deadline_goes_the_fifo_takes_in_order_ones_again() -> None:
    d: Deadlines[int] = Deadlines()
    d.schedule(0, 1e9)
    assert d.cancel(0)
    assert d.pop_due(0.0) == []
    for key in range(1, 100):
        d.schedule(key, float(key))
    assert d._heap == []
    assert d.pop_due(math.inf) == list(range(1, 100))


# -- scale ---------------------------------------------------------------------------------------


def test_200k_entries_in_random_order() -> None:
    # Order and count at scale; the speed at a million is bench/deadlines.py's figure.
    n = 200_000
    rng = random.Random(1)
    d: Deadlines[int] = Deadlines()
    times = [rng.random() * 1e6 for _ in range(n)]
    for key, when in enumerate(times):
        d.schedule(key, when)
    assert len(d) == n
    assert d.next_deadline() == min(times)
    assert d.pop_due(-1.0) == []
    # Half of them by a mid-point clock, then the rest: order and count must hold across the two.
    first = d.pop_due(5e5)
    rest = d.pop_due(math.inf)
    out = first + rest
    assert len(out) == n
    assert len(set(out)) == n
    assert all(times[k] <= 5e5 for k in first)
    assert all(times[k] > 5e5 for k in rest)
    assert all(times[a] <= times[b] for a, b in itertools.pairwise(out))
    assert len(d) == 0
    assert d.next_deadline() is None


def test_200k_jobs_as_the_service_arms_them() -> None:
    """Receipt + grace on a fake clock, a few re-arms to earlier retries, pops in batches."""
    n = 200_000
    rng = random.Random(2)
    d: Deadlines[int] = Deadlines()
    expected: dict[int, float] = {}
    now = 0.0
    out: list[tuple[float, int]] = []
    for key in range(n):
        now += 1e-4
        when = now + GRACE
        if key % 97 == 0 and key:  # a retry after a busy row: earlier than the last arming
            earlier = rng.randrange(max(0, key - 1000), key)
            if earlier in d:
                expected[earlier] = now + 1.0
                d.schedule(earlier, now + 1.0)
        d.schedule(key, when)
        expected[key] = when
        if key % 500 == 0:
            out += [(now, k) for k in d.pop_due(now, limit=500)]
    assert len(d._heap) < n // 50  # nearly every entry took the FIFO
    while popped := d.pop_due(math.inf, limit=500):
        out += [(math.inf, k) for k in popped]
    keys = [k for _, k in out]
    assert len(keys) == n
    assert set(keys) == set(range(n))
    assert all(expected[k] <= clock for clock, k in out)
    assert all(expected[a] <= expected[b] for a, b in itertools.pairwise(keys))
    assert len(d) == 0


# -- against a model -----------------------------------------------------------------------------

INT_KEYS = st.integers(min_value=0, max_value=12)
TEXT_KEYS = st.sampled_from([*job_ids(10, seed=8), "job-7", job_ids(1, seed=9)[0].upper()])
# Few distinct offsets, so ties between keys are common; some arbitrary times too.
OFFSETS = st.one_of(
    st.just(GRACE),
    st.integers(min_value=-5, max_value=20).map(float),
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False),
)


class DeadlinesModel(RuleBasedStateMachine):
    """Deadlines against a plain dict of key -> deadline, on a clock that only moves forward.

    Most deadlines are "now + grace", as the service makes them, so the FIFO and the heap both
    fill and their heads meet. Equal deadlines may come out in any order, so a pop is checked
    as "the earliest ones, in time order", not as one exact list.
    """

    keys: st.SearchStrategy[Hashable] = INT_KEYS

    def __init__(self) -> None:
        super().__init__()
        self.d: Deadlines[Hashable] = Deadlines()
        self.model: dict[Hashable, float] = {}
        self.now = 0.0

    def check_pop(self, out: list[Hashable], now: float, limit: int | None) -> None:
        due = {k: w for k, w in self.model.items() if w <= now}
        assert len(set(out)) == len(out)
        assert set(out) <= set(due)
        assert len(out) == (len(due) if limit is None else min(max(limit, 0), len(due)))
        times = [due[k] for k in out]
        assert times == sorted(times)
        if out:
            assert all(w >= times[-1] for k, w in due.items() if k not in set(out))
        for k in out:
            del self.model[k]

    @rule(step=st.sampled_from([0.0, 0.5, 1.0, 7.0, GRACE]))
    def advance(self, step: float) -> None:
        self.now += step

    @rule(data=st.data(), offset=OFFSETS)
    def schedule(self, data: st.DataObject, offset: float) -> None:
        key = data.draw(self.keys)
        when = self.now + offset
        earliest = all(w >= when for k, w in self.model.items() if k != key)
        assert self.d.schedule(key, when) is earliest
        self.model[key] = when
        assert held(self.d) <= bound(self.d)

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        key = data.draw(self.keys)
        assert self.d.cancel(key) == (key in self.model)
        self.model.pop(key, None)
        assert held(self.d) <= bound(self.d)

    @rule(limit=st.one_of(st.none(), st.integers(min_value=-1, max_value=5)))
    def pop_due(self, limit: int | None) -> None:
        self.check_pop(self.d.pop_due(self.now, limit), self.now, limit)

    @precondition(lambda self: len(self.model) > 0)
    @rule()
    def pop_everything(self) -> None:
        self.check_pop(self.d.pop_due(math.inf), math.inf, None)
        assert not self.model

    @rule(data=st.data())
    def lookup(self, data: st.DataObject) -> None:
        key = data.draw(self.keys)
        assert self.d.when(key) == self.model.get(key)
        assert (key in self.d) == (key in self.model)

    @invariant()
    def same_pending(self) -> None:
        assert len(self.d) == len(self.model)
        assert set(self.d) == set(self.model)
        expected = min(self.model.values()) if self.model else None
        assert self.d.next_deadline() == expected


class TextDeadlinesModel(DeadlinesModel):
    """The same, with job ids (held as ints) and other text (held as it is) as keys."""

    keys = TEXT_KEYS


SETTINGS = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestDeadlinesModel = DeadlinesModel.TestCase
TestDeadlinesModel.settings = SETTINGS
TestTextDeadlinesModel = TextDeadlinesModel.TestCase
TestTextDeadlinesModel.settings = SETTINGS
