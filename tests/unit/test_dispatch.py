"""The work queue and its dispatcher on a fake clock: arrival, offers during a claim, adoption
across retries, takeover, drain. The claim is a function of the test's; no database."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
import pytest

from reactor.claim.dispatch import Answer, Dispatcher, WorkQueue
from reactor.claim.sources import (
    BOUNDARY_S,
    LISTEN,
    POLL,
    REARM,
    RECONCILE,
    RETRY,
    STUCK,
    Hint,
    Source,
)
from reactor.core.clock import FakeClock
from reactor.core.ownership import Membership, owner, share_of
from reactor.telemetry.metrics import Metrics
from tests.loops import running

pytestmark = pytest.mark.anyio

ME, OTHER = "reactor-me", "reactor-other"


def jobs_owned_by(replica: str, count: int, among: tuple[str, ...] = (ME, OTHER)) -> list[str]:
    found: list[str] = []
    n = 0
    while len(found) < count:
        job = f"job-{n}"
        n += 1
        if owner(share_of(job), among) == replica:
            found.append(job)
    return found


# -- the pure queue -------------------------------------------------------------------------------


def test_a_job_is_taken_once_its_deadline_passes() -> None:
    queue = WorkQueue(ME, capacity=10)
    assert queue.admit(Hint("a", 5.0), 0.0)
    assert queue.take(4.9, 10) == []
    assert queue.take(5.0, 10) == ["a"]
    assert queue.in_flight == {"a"}
    assert "a" in queue
    assert len(queue) == 1


def test_a_stuck_job_is_the_queues_until_a_claim_settles_it() -> None:
    queue = WorkQueue(ME, capacity=10)
    queue.admit(Hint("a", 0.0), 0.0)
    queue.admit(Hint("b", 0.0), 0.0)
    assert queue.take(0.0, 10) == ["a", "b"]
    # The claim found "a" behind another transaction's row lock: due again, and stuck.
    queue.done(["a", "b"], {"a": 1.0}, stuck={"a"})
    assert (set(queue.stuck), set(queue.claimed)) == ({"a"}, {"a"})
    assert queue.take(1.0, 10) == ["a"]
    assert queue.claimed == {"a"}  # in flight and stuck: the scan leaves it out either way
    queue.done(["a"], {"a": 2.0})  # the lock is still held: still stuck
    assert queue.stuck == {"a"}
    assert queue.take(2.0, 10) == ["a"]
    queue.done(["a"], {})  # written once the lock went
    assert not queue.stuck
    assert not queue.claimed
    assert "a" not in queue


def test_a_job_the_scan_found_stuck_is_offered_as_stuck_and_forgotten_when_settled() -> None:
    queue = WorkQueue(ME, capacity=10)
    queue.admit(Hint("a", 0.0, stuck=True), 0.0)
    assert queue.is_stuck("a")
    queue.forget(["a"])  # the scan settled it after all
    assert not queue.is_stuck("a")
    assert "a" not in queue


def test_the_last_offer_wins_for_a_waiting_job() -> None:
    queue = WorkQueue(ME, capacity=10)
    queue.admit(Hint("a", 5.0), 0.0)
    queue.admit(Hint("a", 9.0), 0.0)  # touched: its deadline moved later
    assert queue.take(8.0, 10) == []
    assert queue.when("a") == 9.0


def test_an_offer_during_the_claim_sends_no_second_claim() -> None:
    queue = WorkQueue(ME, capacity=10)
    queue.admit(Hint("a", 0.0), 0.0)
    assert queue.take(0.0, 10) == ["a"]
    # A poll or a scan reads the row while the claim runs: noted, not queued.
    assert not queue.admit(Hint("a", 0.0), 0.0)
    assert queue.take(1.0, 10) == []
    # The claim settled it: the poll's read was older than the claim's answer.
    queue.done(["a"], {})
    assert "a" not in queue
    assert queue.take(2.0, 10) == []


def test_a_notification_during_the_claim_is_offered_again_after_it() -> None:
    # An edge newer than the claim (the run deleted right after it was written) is not lost.
    queue = WorkQueue(ME, capacity=10)
    queue.admit(Hint("a", 0.0), 0.0)
    queue.take(0.0, 10)
    queue.admit(Hint("a", 3.0, heard=True), 0.0)
    assert queue.done(["a"], {})
    assert queue.when("a") == 3.0


def test_a_retry_wins_over_an_offer_made_during_the_claim() -> None:
    queue = WorkQueue(ME, capacity=10)
    queue.admit(Hint("a", 0.0), 0.0)
    queue.take(0.0, 10)
    queue.admit(Hint("a", 0.5, heard=True), 0.0)
    queue.done(["a"], {"a": 7.0})  # the row said: due at 7 (updated_at moved)
    assert queue.when("a") == 7.0


def test_jobs_another_replica_owns_are_left_to_it_at_intake() -> None:
    queue = WorkQueue(ME, capacity=10)
    queue.see(Membership(ME, frozenset({ME, OTHER})))
    mine, theirs = jobs_owned_by(ME, 2), jobs_owned_by(OTHER, 2)
    for job in [*mine, *theirs]:
        queue.admit(Hint(job, 1.0), 0.0)
    assert queue.left_to_owner == 2
    assert len(queue) == 2  # only its own share is held: no timer, no heap entry for theirs
    assert sorted(queue.take(1.0, 10)) == sorted(mine)


def test_a_job_the_scan_found_stuck_is_held_whoever_owns_it() -> None:
    queue = WorkQueue(ME, capacity=10)
    queue.see(Membership(ME, frozenset({ME, OTHER})))
    (theirs,) = jobs_owned_by(OTHER, 1)
    queue.admit(Hint(theirs, 0.0, stuck=True), 0.0)
    assert queue.take(0.0, 10) == [theirs]


def test_a_replica_before_its_first_heartbeat_claims_everything() -> None:
    queue = WorkQueue(ME, capacity=10)
    queue.see(Membership(ME, frozenset({OTHER})))  # it does not see itself yet
    theirs = jobs_owned_by(OTHER, 3)
    for job in theirs:
        queue.admit(Hint(job, 0.0), 0.0)
    assert sorted(queue.take(0.0, 10)) == sorted(theirs)


def test_adoption_travels_with_the_entry_across_retries() -> None:
    queue = WorkQueue(ME, capacity=10)
    queue.see(Membership(ME, frozenset({ME, OTHER})))
    (theirs,) = jobs_owned_by(OTHER, 1)
    queue.admit(Hint(theirs, 0.0, adopted=True), 0.0)  # the reconcile found it here
    assert queue.take(0.0, 10) == [theirs]
    queue.done([theirs], {theirs: 1.0})  # a row lock: try again in a second
    assert queue.adopted(theirs)
    assert queue.take(1.0, 10) == [theirs]  # still claimed here, whoever owns it
    queue.done([theirs], {})
    assert not queue.adopted(theirs)


def test_adoption_offered_during_the_claim_is_kept_for_the_retry() -> None:
    queue = WorkQueue(ME, capacity=10)
    queue.see(Membership(ME, frozenset({ME, OTHER})))
    (theirs,) = jobs_owned_by(OTHER, 1)
    queue.see(Membership(ME, frozenset({ME})))
    queue.admit(Hint(theirs, 0.0), 0.0)
    queue.take(0.0, 10)
    queue.admit(Hint(theirs, 0.0, adopted=True), 0.0)
    queue.see(Membership(ME, frozenset({ME, OTHER})))
    queue.done([theirs], {theirs: 1.0})
    assert queue.take(1.0, 10) == [theirs]


def test_a_joiner_takes_its_share_and_the_others_drop_it() -> None:
    queue = WorkQueue(ME, capacity=10)
    queue.see(Membership(ME, frozenset({ME})))
    mine_later, theirs_later = jobs_owned_by(ME, 3), jobs_owned_by(OTHER, 3)
    for job in [*mine_later, *theirs_later]:
        queue.admit(Hint(job, 5.0), 0.0)
    assert len(queue) == 6  # alone, it owns every job
    queue.see(Membership(ME, frozenset({ME, OTHER})))  # OTHER joined, holding its share
    assert queue.left_to_owner == 3
    assert sorted(queue.take(5.0, 10)) == sorted(mine_later)


def test_a_replica_that_left_leaves_its_share_to_be_read_again() -> None:
    # Its jobs were never held here: the service re-reads them from the queue table. Offered
    # again once it is gone, they are this replica's.
    queue = WorkQueue(ME, capacity=10)
    queue.see(Membership(ME, frozenset({ME, OTHER})))
    theirs = jobs_owned_by(OTHER, 3)
    for job in theirs:
        queue.admit(Hint(job, 5.0), 0.0)
    assert len(queue) == 0
    queue.see(Membership(ME, frozenset({ME})))
    for job in theirs:
        queue.admit(Hint(job, 5.0), 0.0)
    assert sorted(queue.take(5.0, 10)) == sorted(theirs)


def test_a_retry_stays_with_the_replica_that_claimed_it() -> None:
    # Claimed here, due and in flight: the new owner's re-arm reads only the jobs inside their
    # grace, so the retry stays here whatever the live set says now.
    queue = WorkQueue(ME, capacity=10)
    queue.see(Membership(ME, frozenset({ME})))
    (theirs,) = jobs_owned_by(OTHER, 1)
    queue.admit(Hint(theirs, 0.0), 0.0)
    assert queue.take(0.0, 10) == [theirs]
    queue.see(Membership(ME, frozenset({ME, OTHER})))
    queue.done([theirs], {theirs: 1.0})
    assert queue.take(1.0, 10) == [theirs]


def test_a_full_queue_refuses_new_jobs_but_moves_known_ones() -> None:
    queue = WorkQueue(ME, capacity=2)
    queue.admit(Hint("a", 1.0), 0.0)
    queue.admit(Hint("b", 2.0), 0.0)
    assert not queue.admit(Hint("c", 0.5), 0.0)
    assert queue.refused == 1
    assert "c" not in queue
    queue.admit(Hint("a", 3.0), 0.0)
    assert queue.when("a") == 3.0


def test_forget_drops_a_waiting_job_but_not_one_in_flight() -> None:
    queue = WorkQueue(ME, capacity=10)
    queue.admit(Hint("a", 5.0), 0.0)
    queue.admit(Hint("b", 0.0), 0.0)
    queue.take(0.0, 10)
    queue.forget(["a", "b"])  # the scan settled both
    assert "a" not in queue
    assert "b" in queue  # its claim answers for it


def test_take_fills_the_batch_with_its_own_jobs() -> None:
    queue = WorkQueue(ME, capacity=100)
    queue.see(Membership(ME, frozenset({ME})))
    theirs, mine = jobs_owned_by(OTHER, 5), jobs_owned_by(ME, 5)
    for at, job in enumerate([*theirs, *mine]):
        queue.admit(Hint(job, float(at)), 0.0)
    queue.see(Membership(ME, frozenset({ME, OTHER})))
    assert queue.take(100.0, 3) == mine[:3]


# -- the dispatcher on a fake clock --------------------------------------------------------------


class Claims:
    """The test's claim: records each batch, answers with what the test set, and can be held."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.answer: Callable[[list[str]], list[tuple[str, float]]] = lambda jobs: []
        self.hold: anyio.Event | None = None
        self.running = 0
        # Which batches went alone (a stuck job's), and the jobs the test says are held.
        self.alone: list[bool] = []
        self.stuck: set[str] = set()

    async def record(self, jobs: Sequence[str], alone: bool = False) -> Answer:
        self.batches.append(list(jobs))
        self.alone.append(alone)
        self.running += 1
        try:
            if self.hold is not None:
                await self.hold.wait()
            return Answer(self.answer(list(jobs)), frozenset(self.stuck) & set(jobs))
        finally:
            self.running -= 1


def dispatcher(
    claims: Claims, clock: FakeClock, *, concurrency: int = 2, batch_size: int = 10
) -> Dispatcher:
    return Dispatcher(
        WorkQueue(ME, capacity=1000),
        claims,
        clock,
        Metrics(),
        concurrency=concurrency,
        batch_size=batch_size,
    )


async def test_a_job_due_on_arrival_is_claimed_without_the_clock_moving() -> None:
    clock, claims = FakeClock(), Claims()
    d = dispatcher(claims, clock)
    async with running(d):
        await anyio.wait_all_tasks_blocked()
        d.intake([Hint("a", -1.0)])
        await anyio.wait_all_tasks_blocked()
        assert claims.batches == [["a"]]


async def test_a_stuck_job_is_claimed_alone_beside_the_batch() -> None:
    clock, claims = FakeClock(), Claims()
    claims.stuck = {"held"}
    claims.answer = lambda jobs: [(job, 1.0) for job in jobs if job == "held"]
    d = dispatcher(claims, clock)
    async with running(d):
        for job in ("a", "held", "b"):
            d.intake([Hint(job, 0.0)])
        await anyio.wait_all_tasks_blocked()
        assert (claims.batches, claims.alone) == ([["a", "held", "b"]], [False])
        d.intake([Hint("c", 1.0)])
        await clock.advance(1.0)
        # The held job goes on its own, waiting for its lock; the others of the batch do not.
        assert claims.batches[1:] == [["c"], ["held"]]
        assert claims.alone[1:] == [False, True]


async def test_a_deadline_fires_at_its_time_and_not_before() -> None:
    clock, claims = FakeClock(), Claims()
    d = dispatcher(claims, clock)
    async with running(d):
        d.intake([Hint("a", 120.0)])
        await clock.advance(119.999)
        assert claims.batches == []
        await clock.advance(0.001)
        assert claims.batches == [["a"]]


async def test_an_earlier_offer_wakes_the_sleeping_loop() -> None:
    clock, claims = FakeClock(), Claims()
    d = dispatcher(claims, clock)
    async with running(d):
        d.intake([Hint("late", 100.0)])
        await clock.advance(1.0)
        d.intake([Hint("early", 1.0)])
        await clock.advance(1.0)
        assert claims.batches == [["early"]]


async def test_a_scan_offering_a_job_in_flight_costs_no_second_statement() -> None:
    clock, claims = FakeClock(), Claims()
    claims.hold = anyio.Event()
    d = dispatcher(claims, clock)
    async with running(d):
        d.intake([Hint("a", 0.0)])
        await anyio.wait_all_tasks_blocked()
        d.intake([Hint("a", 0.0)])  # a poll reads it while its claim runs
        await clock.advance(5.0)
        claims.hold.set()
        await clock.advance(5.0)
        assert claims.batches == [["a"]]


async def test_a_retry_comes_back_after_its_delay() -> None:
    clock, claims = FakeClock(), Claims()
    claims.answer = lambda jobs: [(j, 1.0) for j in jobs] if len(claims.batches) == 1 else []
    d = dispatcher(claims, clock)
    async with running(d):
        d.intake([Hint("a", 0.0)])
        await clock.advance(0.999)
        assert claims.batches == [["a"]]
        await clock.advance(0.001)
        assert claims.batches == [["a"], ["a"]]
        assert "a" not in d.queue


async def test_claims_never_exceed_the_slots() -> None:
    clock, claims = FakeClock(), Claims()
    claims.hold = anyio.Event()
    d = Dispatcher(
        WorkQueue(ME, capacity=1000), claims, clock, Metrics(), concurrency=2, batch_size=1
    )
    async with running(d):
        for job in "abcde":
            d.intake([Hint(job, 0.0)])
        await clock.advance(1.0)
        assert claims.running == 2
        claims.hold.set()
        await clock.advance(1.0)
        assert sorted(j for b in claims.batches for j in b) == list("abcde")


async def test_close_takes_nothing_more_and_lets_the_claim_in_flight_finish() -> None:
    clock, claims = FakeClock(), Claims()
    claims.hold = anyio.Event()
    d = dispatcher(claims, clock)
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.run, tg)
        d.intake([Hint("a", 0.0)])
        d.intake([Hint("b", 10.0)])
        await clock.advance(1.0)
        d.close()  # SIGTERM: drain
        claims.hold.set()
        await clock.advance(20.0)
    # The task group ended: the loop returned, and the claim in flight finished.
    assert claims.batches == [["a"]]
    assert "a" not in d.queue
    assert "b" in d.queue


async def test_a_claim_that_raises_leaves_its_jobs_to_retry() -> None:
    clock, claims = FakeClock(), Claims()

    def fail(jobs: list[str]) -> list[tuple[str, float]]:
        raise RuntimeError("boom")

    claims.answer = fail
    d = dispatcher(claims, clock)

    async def run_until_it_raises() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(d.run, tg)
            d.intake([Hint("a", 0.0)])
            await clock.advance(0.5)

    with pytest.raises(BaseExceptionGroup):
        await run_until_it_raises()
    assert d.queue.when("a") == pytest.approx(1.0)


# -- the intake: every source's hints through one door ------------------------------------------


def test_each_source_says_what_it_knows_as_data() -> None:
    # Each road is a Source (mypy checks the protocol), and each has a name of its own.
    roads: list[Source[Any]] = [LISTEN, POLL, REARM, STUCK, RECONCILE, RETRY]
    assert len({road.name for road in roads}) == len(roads)
    assert list(LISTEN.hints([("a", 2.0), ("b", None)])) == [
        Hint("a", 2.0 + BOUNDARY_S, heard=True),  # the row's deadline, past its boundary
        Hint("b", None, heard=True),  # left unverified: no deadline known
    ]
    assert (
        list(POLL.hints([("a", 2.0)]))
        == list(REARM.hints([("a", 2.0)]))
        == [Hint("a", 2.0 + BOUNDARY_S)]
    )
    # Due already by the database's clock: claimed at once, with no boundary to wait out.
    assert list(LISTEN.hints([("a", 0.0)])) == [Hint("a", 0.0, heard=True)]
    assert list(POLL.hints([("a", -1.5)])) == [Hint("a", -1.5)]
    assert list(STUCK.hints(["a"])) == [Hint("a", 0.0, stuck=True)]
    assert list(RECONCILE.hints([("a", 0.5)])) == [Hint("a", 0.5, adopted=True)]
    answer = Answer([("a", 1.0), ("b", 0.0)], stuck=frozenset({"b"}))
    assert list(RETRY.hints(answer)) == [
        Hint("a", 1.0, adopted=True),
        Hint("b", 0.0, adopted=True, stuck=True),
    ]
    with pytest.raises(AttributeError):
        Hint("a").due_in = 1.0  # type: ignore[misc]


def test_a_hint_without_a_deadline_is_due_at_once_and_never_before_now() -> None:
    assert Hint("a").at(10.0) == 10.0
    assert Hint("a", -3.0).at(10.0) == 10.0  # overdue: due now, not in the past
    assert Hint("a", 2.5).at(10.0) == 12.5


def test_an_adopted_job_stays_here_when_a_level_read_of_its_owner_comes() -> None:
    queue = WorkQueue(ME, capacity=10)
    queue.see(Membership(ME, frozenset({ME, OTHER})))
    (theirs,) = jobs_owned_by(OTHER, 1)
    queue.admit(next(RECONCILE.hints([(theirs, 1.0)])), 0.0)
    # The poll reads it too: by ownership it is the other's, but the reconcile found it here.
    queue.admit(next(POLL.hints([(theirs, 1.0)])), 0.0)
    assert queue.left_to_owner == 0
    assert queue.adopted(theirs)
    assert queue.take(1.001, 10) == [theirs]


def test_a_notification_another_replica_owns_is_left_to_it() -> None:
    queue = WorkQueue(ME, capacity=10)
    queue.see(Membership(ME, frozenset({ME, OTHER})))
    (theirs,) = jobs_owned_by(OTHER, 1)
    assert not queue.admit(next(LISTEN.hints([(theirs, None)])), 0.0)
    assert (queue.left_to_owner, len(queue)) == (1, 0)


async def test_an_intake_claims_the_earliest_deadline_first_each_at_its_time() -> None:
    clock, claims = FakeClock(), Claims()
    d = dispatcher(claims, clock, concurrency=1, batch_size=1)
    async with running(d):
        await anyio.wait_all_tasks_blocked()
        d.intake(REARM.hints([("late", 3.0), ("early", 1.0), ("middle", 2.0)]))
        await clock.advance(1.0)
        assert claims.batches == []  # 1.001: the boundary is not passed yet
        await clock.advance(0.001)
        assert claims.batches == [["early"]]
        await clock.advance(1.0)
        assert claims.batches == [["early"], ["middle"]]
        await clock.advance(1.0)
        assert claims.batches == [["early"], ["middle"], ["late"]]


async def test_an_intake_of_more_due_jobs_than_a_batch_claims_them_all_at_once() -> None:
    clock, claims = FakeClock(), Claims()
    d = dispatcher(claims, clock, concurrency=2, batch_size=2)
    async with running(d):
        await anyio.wait_all_tasks_blocked()
        d.intake(Hint(job, 0.0) for job in "abcde")
        await anyio.wait_all_tasks_blocked()
        # Without the clock moving: the intake claims the first batch, the loop the rest.
        assert sorted(job for batch in claims.batches for job in batch) == list("abcde")
        assert all(len(batch) <= 2 for batch in claims.batches)


async def test_a_job_the_scan_found_stuck_is_claimed_alone_until_a_claim_settles_it() -> None:
    clock, claims = FakeClock(), Claims()
    claims.stuck = {"held"}
    claims.answer = lambda jobs: [("held", 1.0)] if "held" in claims.stuck else []
    d = dispatcher(claims, clock)
    async with running(d):
        await anyio.wait_all_tasks_blocked()
        d.intake([*POLL.hints([("a", -1.0), ("b", -1.0)]), *STUCK.hints(["held"])])
        await anyio.wait_all_tasks_blocked()
        assert sorted(zip(map(tuple, claims.batches), claims.alone, strict=True)) == [
            (("a", "b"), False),
            (("held",), True),
        ]
        assert d.queue.claimed == {"held"}  # the scan leaves it out while it is held
        claims.stuck = set()  # the lock goes
        await clock.advance(1.0)
        assert (claims.batches[-1], claims.alone[-1]) == (["held"], True)
        assert not d.queue.claimed
