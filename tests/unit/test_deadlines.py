"""reactor.deadlines: the keyed min-heap, driven by a fake clock (``now`` is always passed in)."""

from __future__ import annotations

import itertools
import math
import random
import time

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from reactor.deadlines import Deadlines


def bound(d: Deadlines[int] | Deadlines[str]) -> int:
    """The most entries the heap may hold right after a schedule() call."""
    return 2 * len(d) + 64 + 1


def drain(d: Deadlines[str]) -> list[str]:
    return d.pop_due(math.inf)


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


def test_equal_deadlines_for_different_keys() -> None:
    d: Deadlines[str] = Deadlines()
    for key in ["b", "c", "a"]:
        d.schedule(key, 7.0)
    assert len(d) == 3
    assert d.next_deadline() == 7.0
    assert d.pop_due(6.0) == []
    # Ties are broken by key order, so the result is deterministic.
    assert d.pop_due(7.0) == ["a", "b", "c"]
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
    assert d.next_deadline() is None
    assert d.pop_due(math.inf) == []


# -- pop_due limit -------------------------------------------------------------------------------


def test_pop_due_with_limit() -> None:
    d: Deadlines[int] = Deadlines()
    for i in range(10):
        d.schedule(i, float(i))
    assert d.pop_due(100.0, limit=0) == []
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


def test_schedule_returns_true_when_the_key_becomes_the_head() -> None:
    d: Deadlines[str] = Deadlines()
    assert d.schedule("b", 20.0) is True  # first key: the head
    assert d.schedule("c", 30.0) is False
    assert d.schedule("a", 10.0) is True  # earlier than b
    assert d.schedule("d", 10.0) is False  # ties with a, but a sorts first
    assert d.schedule("c", 5.0) is True  # rescheduled to the front
    assert d.schedule("e", 5.0) is False
    assert d.pop_due(math.inf) == ["c", "e", "a", "d", "b"]


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


def test_schedule_returns_true_when_rescheduled_to_an_equal_time() -> None:
    d: Deadlines[str] = Deadlines()
    d.schedule("a", float("1"))
    assert d.schedule("a", float("1")) is True


def test_schedule_returns_true_when_the_head_moves_later_but_stays_first() -> None:
    d: Deadlines[str] = Deadlines()
    d.schedule("a", 1.0)
    d.schedule("b", 50.0)
    assert d.schedule("a", 10.0) is True  # still earlier than b


def test_schedule_true_is_never_wrong() -> None:
    """Whenever schedule() says True, the key really is the head (no false positives)."""
    rng = random.Random(7)
    d: Deadlines[int] = Deadlines()
    for _ in range(5000):
        key = rng.randrange(50)
        if rng.random() < 0.2:
            d.cancel(key)
            continue
        when = float(rng.randrange(100))
        if d.schedule(key, when):
            head = min((w, k) for k in d if (w := d.when(k)) is not None)
            assert head == (when, key)
        if rng.random() < 0.1:
            d.pop_due(float(rng.randrange(100)), limit=rng.randrange(5))


# -- compaction ----------------------------------------------------------------------------------


def test_rescheduling_one_key_keeps_the_heap_bounded() -> None:
    d: Deadlines[str] = Deadlines()
    d.schedule("other", 1e9)
    last = math.nan
    for i in range(10_000):
        # Alternately earlier and later than the previous deadline.
        last = float(10_000 - i) if i % 2 else float(i)
        d.schedule("a", last)
        assert len(d._heap) <= bound(d)
    assert len(d) == 2
    assert d.when("a") == last
    assert d.next_deadline() == last
    assert d.pop_due(math.inf) == ["a", "other"]


def test_compaction_keeps_behaviour_with_many_keys() -> None:
    rng = random.Random(3)
    d: Deadlines[int] = Deadlines()
    model: dict[int, float] = {}
    for _ in range(20_000):
        key = rng.randrange(300)
        when = rng.uniform(0, 1000)
        d.schedule(key, when)
        model[key] = when
        assert len(d._heap) <= bound(d)
    for key in rng.sample(sorted(model), 100):
        assert d.cancel(key)
        del model[key]
    assert len(d) == len(model)
    assert d.next_deadline() == min(model.values())
    expected = [k for k, _ in sorted(model.items(), key=lambda kv: (kv[1], kv[0]))]
    assert d.pop_due(math.inf) == expected


def test_schedule_after_mass_cancel_compacts() -> None:
    d: Deadlines[int] = Deadlines()
    for i in range(10_000):
        d.schedule(i, float(i))
    for i in range(10_000):
        d.cancel(i)
    d.schedule(-1, 5.0)
    assert len(d._heap) <= bound(d)
    assert d.pop_due(math.inf) == [-1]


# -- scale ---------------------------------------------------------------------------------------


def test_a_million_entries() -> None:
    n = 1_000_000
    rng = random.Random(1)
    d: Deadlines[int] = Deadlines()
    times = [rng.random() * 1e6 for _ in range(n)]
    started = time.perf_counter()
    for key, when in enumerate(times):
        d.schedule(key, when)
    assert len(d) == n
    assert d.next_deadline() == min(times)
    assert d.pop_due(-1.0) == []
    # Half of them by a mid-point clock, then the rest: order and count must hold across the two.
    first = d.pop_due(5e5)
    rest = d.pop_due(math.inf)
    elapsed = time.perf_counter() - started
    out = first + rest
    assert len(out) == n
    assert len(set(out)) == n
    assert all(times[k] <= 5e5 for k in first)
    assert all(times[k] > 5e5 for k in rest)
    assert all(times[a] <= times[b] for a, b in itertools.pairwise(out))
    assert len(d) == 0
    assert d.next_deadline() is None
    # CPython's own heapq.heappop costs ~5 s per million on a small VM, so this only catches a
    # complexity regression (quadratic would never finish), not a slow machine.
    assert elapsed < 120, f"1M schedule+pop took {elapsed:.1f}s"


# -- against a model -----------------------------------------------------------------------------

KEYS = st.integers(min_value=0, max_value=12)
# Few distinct times, so ties between keys are common; some fractional ones too.
TIMES = st.one_of(
    st.integers(min_value=0, max_value=20).map(float),
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False),
)


class DeadlinesModel(RuleBasedStateMachine):
    """Deadlines against a plain dict of key -> deadline, where the earliest (when, key) wins."""

    def __init__(self) -> None:
        super().__init__()
        self.d: Deadlines[int] = Deadlines()
        self.model: dict[int, float] = {}

    def _ordered(self) -> list[int]:
        return [k for k, _ in sorted(self.model.items(), key=lambda kv: (kv[1], kv[0]))]

    @rule(key=KEYS, when=TIMES)
    def schedule(self, key: int, when: float) -> None:
        head = self.d.schedule(key, when)
        self.model[key] = when
        if head:
            assert self._ordered()[0] == key
        assert len(self.d._heap) <= 2 * len(self.model) + 64 + 1

    @rule(key=KEYS)
    def cancel(self, key: int) -> None:
        assert self.d.cancel(key) == (key in self.model)
        self.model.pop(key, None)

    @rule(now=TIMES, limit=st.one_of(st.none(), st.integers(min_value=0, max_value=5)))
    def pop_due(self, now: float, limit: int | None) -> None:
        due = [k for k in self._ordered() if self.model[k] <= now]
        if limit is not None:
            due = due[:limit]
        assert self.d.pop_due(now, limit) == due
        for k in due:
            del self.model[k]

    @precondition(lambda self: len(self.model) > 0)
    @rule()
    def pop_everything(self) -> None:
        assert self.d.pop_due(math.inf) == self._ordered()
        self.model.clear()

    @rule(key=KEYS)
    def lookup(self, key: int) -> None:
        assert self.d.when(key) == self.model.get(key)
        assert (key in self.d) == (key in self.model)

    @invariant()
    def same_pending(self) -> None:
        assert len(self.d) == len(self.model)
        assert set(self.d) == set(self.model)
        expected = min(self.model.values()) if self.model else None
        assert self.d.next_deadline() == expected


TestDeadlinesModel = DeadlinesModel.TestCase
TestDeadlinesModel.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
