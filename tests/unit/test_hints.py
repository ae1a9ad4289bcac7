"""reactor.listen.hints: hints wait in a bounded buffer for one statement per batch; what the tables
do not confirm is counted and logged at most once per interval."""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Iterable
from typing import Any, cast
from unittest.mock import MagicMock

import pytest

from reactor import db
from reactor.claim.sources import Hint, aim
from reactor.core.clock import FakeClock
from reactor.listen.hints import (
    LINGER_S,
    LOG_INTERVAL_S,
    HintBatch,
    ThrottledLog,
    Verifier,
    fleet_linger,
)
from reactor.telemetry.metrics import Metrics


def ids(count: int) -> list[str]:
    return [str(uuid.UUID(int=n)) for n in range(count)]


# -- HintBatch -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("live", "grace", "linger"),
    [
        (1, 120.0, LINGER_S),  # one replica: as always
        (0, 120.0, LINGER_S),  # before the first check has read the heartbeats
        (5, 120.0, 5 * LINGER_S),  # each hears a fifth of the jobs: five times as long
        (5, 0.2, 0.01),  # never past a twentieth of the grace...
        (1, 0.05, 0.0025),
        (1, 0.0, 0.0),  # ...and none at grace 0, where a job is due as it is heard
    ],
)
def test_a_fleet_lingers_as_long_as_one_replica_takes_to_hear_as_many(
    live: int, grace: float, linger: float
) -> None:
    assert fleet_linger(live, grace) == pytest.approx(linger)


def test_nothing_is_due_while_nothing_waits() -> None:
    batch = HintBatch()
    assert batch.due_at() is None
    assert batch.take(100.0) is None


def test_the_first_hint_waits_the_linger_for_others_to_join_it() -> None:
    batch = HintBatch(linger=0.005)
    batch.add_job("a", 10.0)
    batch.add_job("b", 10.004)
    assert batch.due_at() == pytest.approx(10.005)
    assert batch.take(10.004) is None
    taken = batch.take(10.005)
    assert taken is not None
    assert taken.jobs == ["a", "b"]
    assert batch.due_at() is None
    assert len(batch) == 0


def test_a_job_hinted_twice_is_verified_once() -> None:
    batch = HintBatch()
    for _ in range(3):
        batch.add_job("a", 0.0)
    taken = batch.take(1.0)
    assert taken is not None
    assert taken.jobs == ["a"]


def test_a_full_batch_goes_at_once_and_the_rest_follows_without_a_linger() -> None:
    batch = HintBatch(batch=100, linger=0.005, capacity=1_000)
    for job in ids(250):
        batch.add_job(job, 5.0)
    assert batch.due_at() == -math.inf
    first = batch.take(5.0)
    assert first is not None
    assert first.jobs == ids(250)[:100]
    second = batch.take(5.0)
    assert second is not None
    assert second.jobs == ids(250)[100:200]
    # Under a batch left: it goes at once too (it waited its linger already).
    third = batch.take(5.0)
    assert third is not None
    assert third.jobs == ids(250)[200:]
    assert batch.take(5.0) is None


def test_a_flood_is_bounded_and_the_drops_ask_for_one_reread_once_drained() -> None:
    batch = HintBatch(capacity=1_000, batch=500)
    accepted = sum(batch.add_job(job, 0.0) for job in ids(200_000))
    assert accepted == 1_000
    assert batch.dropped == 199_000
    assert len(batch) == 1_000
    # A job already waiting is not a drop.
    assert batch.add_job(ids(1)[0], 0.0)
    # The first drop: read the queue at once, then at most once a second while it stays full.
    assert batch.missed(0.0)
    batch.add_job("one-more", 0.5)
    assert not batch.missed(0.5)
    assert batch.missed(1.0)
    batch.add_job("and-another", 1.1)
    batch.take(1.2)
    assert not batch.missed(1.2)
    batch.take(1.3)
    assert batch.reread_at() == 2.0
    assert not batch.missed(1.3), "drained: once the second since the last re-read is over"
    assert batch.missed(2.0)
    assert batch.reread_at() is None
    assert not batch.missed(9.0), "said once"


def test_batches_that_fail_their_statement_ask_for_a_reread_once_a_second() -> None:
    batch = HintBatch()
    rereads = 0
    for tick in range(300):
        now = tick * 0.01
        batch.unverified()
        rereads += batch.missed(now)
    assert rereads == 3, "at 0, 1 and 2 seconds"
    assert batch.reread_at() == 3.0


def test_the_last_word_of_a_replica_wins_and_the_claims_are_bounded() -> None:
    batch = HintBatch(replica_capacity=2)
    assert batch.add_replica("r1", left=False, now=0.0)
    assert batch.add_replica("r1", left=True, now=0.0)
    assert batch.add_replica("r2", left=False, now=0.0)
    assert not batch.add_replica("fake-3", left=False, now=0.0)
    assert batch.replicas_dropped == 1
    taken = batch.take(1.0)
    assert taken is not None
    assert taken.jobs == []
    assert taken.replicas == {"r1": True, "r2": False}


# -- ThrottledLog --------------------------------------------------------------------------------


def test_a_tally_logs_the_first_at_once_then_once_per_interval_with_the_count() -> None:
    tally = ThrottledLog(interval=10.0)
    assert tally.note(0.0) == 1
    lines = [tally.note(n * 0.0001) for n in range(1, 20_000)]
    assert not any(lines)
    assert tally.due(9.9) == 0
    assert tally.due(10.0) == 19_999
    assert tally.due(30.0) == 0, "nothing unlogged"
    assert tally.note(31.0, 5) == 5
    assert tally.total == 20_005


def test_a_steady_stream_gives_one_line_per_interval() -> None:
    tally = ThrottledLog(interval=10.0)
    # 45 s of forged messages, one every 10 ms.
    lines = [count for n in range(4_500) if (count := tally.note(n * 0.01))]
    assert len(lines) == 5
    assert sum(lines) + tally.due(math.inf) == 4_500


# -- Verifier.apply ------------------------------------------------------------------------------


class Heard:
    """The verifier's work queue, members and scan: what reached each."""

    def __init__(self) -> None:
        self.armed: list[tuple[str, float | None]] = []
        self.gone: list[str] = []
        self.new: list[str] = []
        self.rereads = 0
        self.metrics = Metrics()

    def intake(self, hints: Iterable[Hint]) -> None:
        self.armed.extend((hint.job_id, hint.due_in) for hint in hints)

    # Whether the jobs are held here or this replica's (not another live replica's).
    mine = True

    def wants(self, job: str) -> bool:
        return self.mine

    @property
    def live(self) -> int:
        return 1

    def request(self, *, rearm: bool) -> None:
        self.rereads += 1

    def left(self, replica: str) -> None:
        self.gone.append(replica)

    def joined(self, replica: str) -> None:
        self.new.append(replica)

    @property
    def unverified(self) -> float:
        value: float = cast(Any, self.metrics.notified["unverified"])._value.get()
        return value

    def verifier(self, clock: FakeClock, *, grace: float = 120.0) -> Verifier:
        return Verifier(
            cast(Any, MagicMock(spec=db.Database, grace=grace)),
            clock,
            liveness=15.0,
            timeout=1.0,
            intake=self,
            members=self,
            rescan=self,
            metrics=self.metrics,
        )


def test_a_heard_job_of_this_replica_waits_for_its_batch_to_be_verified() -> None:
    heard, clock = Heard(), FakeClock()
    verifier = heard.verifier(clock)
    [job] = ids(1)
    verifier.heard(job)
    assert heard.armed == []
    assert len(verifier.pending) == 1


def test_at_grace_0_a_heard_job_goes_to_the_work_queue_at_once() -> None:
    # Due as soon as queued: its claim is the check, handed on from the notification itself,
    # with no batch, no statement and no turn of the event loop between.
    heard, clock = Heard(), FakeClock()
    verifier = heard.verifier(clock, grace=0.0)
    [job] = ids(1)
    verifier.heard(job)
    assert heard.armed == [(job, 0.0)]
    assert len(verifier.pending) == 0
    assert verifier.statements == 0


def test_a_heard_job_another_replica_owns_is_left_to_the_queue_unverified() -> None:
    heard, clock = Heard(), FakeClock()
    heard.mine = False
    verifier = heard.verifier(clock)
    [job] = ids(1)
    verifier.heard(job)
    # No deadline: the work queue leaves it to its owner.
    assert heard.armed == [(job, None)]
    assert len(verifier.pending) == 0


def test_only_queued_jobs_are_armed_at_the_due_time_the_tables_give() -> None:
    heard, clock = Heard(), FakeClock()
    verifier = heard.verifier(clock)
    real, made_up = ids(2)
    verifier.job(real)
    verifier.job(made_up)
    batch = verifier.pending.take(1.0)
    assert batch is not None
    verifier.apply(batch, db.Verified([(real, 119.5)], frozenset()))
    assert heard.armed == [(real, aim(119.5))]
    assert heard.unverified == 1


def test_membership_claims_count_only_when_the_heartbeats_agree() -> None:
    heard, clock = Heard(), FakeClock()
    verifier = heard.verifier(clock)
    verifier.replica("alive", left=True)  # forged: its heartbeat is fresh
    verifier.replica("fake-1", left=False)  # forged: no heartbeat
    verifier.replica("gone", left=True)  # true: its row was deleted
    verifier.replica("new", left=False)  # true: its first heartbeat is in
    batch = verifier.pending.take(1.0)
    assert batch is not None
    verifier.apply(batch, db.Verified([], frozenset({"alive", "new"})))
    assert heard.gone == ["gone"]
    assert heard.new == ["new"]
    assert heard.unverified == 2


@pytest.mark.anyio
async def test_forged_claims_are_logged_at_most_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    heard, clock = Heard(), FakeClock()
    verifier = heard.verifier(clock)
    caplog.set_level(logging.WARNING, logger="reactor.listen.hints")
    for n in range(4_500):  # 45 s, one every 10 ms
        verifier.replica(f"fake-{n}", left=False)
        batch = verifier.pending.take(clock.now() + 1)
        assert batch is not None
        verifier.apply(batch, db.Verified([], frozenset()))
        if n % 100 == 0:
            verifier.report()
        await clock.advance(0.01)
    verifier.report()
    assert sum(cast(Any, r).count for r in caplog.records) < 4_500, "the rest waits its turn"
    await clock.advance(LOG_INTERVAL_S)
    verifier.report()
    lines = [r for r in caplog.records if r.name == "reactor.listen.hints"]
    assert 1 <= len(lines) <= 45 / LOG_INTERVAL_S + 2
    assert sum(cast(Any, r).count for r in lines) == 4_500
    assert heard.new == []


def test_a_batch_of_made_up_hints_asks_for_a_reread_too() -> None:
    batch = HintBatch()
    batch.flooded(10)
    assert not batch.missed(0.0), "a few stale hints are not a flood"
    batch.flooded(1_000)
    assert batch.missed(0.0)
