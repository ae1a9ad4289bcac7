"""reactor.core.ownership: one owner per job, agreed without talking, moving little on a change."""

from __future__ import annotations

import uuid
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from reactor.core.ownership import SHARES, Membership, Roster, owner, share_channels, share_of

JOBS = [str(uuid.UUID(int=i * 7919 + 1)) for i in range(20_000)]
REPLICAS = [f"reactor-{i}" for i in range(5)]


def owner_of(job: str, replicas: list[str]) -> str | None:
    return owner(share_of(job), replicas)


def test_every_replica_agrees_and_exactly_one_owns() -> None:
    views = [Membership(me, frozenset(REPLICAS)) for me in REPLICAS]
    for job in JOBS[:2000]:
        assert sum(view.owns(job) for view in views) == 1
    assert sorted(share for view in views for share in view.shares) == list(range(SHARES))


def test_jobs_fall_evenly_into_the_shares() -> None:
    counts = Counter(share_of(job) for job in JOBS)
    assert set(counts) == set(range(SHARES))
    expected = len(JOBS) / SHARES
    assert all(abs(n - expected) < 0.4 * expected for n in counts.values())


def test_every_replica_owns_a_fair_part_of_the_shares() -> None:
    # SHARES shares over five replicas: no replica owns nothing, or twice its part.
    shares = Counter(owner(share, REPLICAS) for share in range(SHARES))
    assert set(shares) == set(REPLICAS)
    expected = SHARES / len(REPLICAS)
    assert all(0.5 * expected < n < 1.6 * expected for n in shares.values())


def test_a_leaving_replica_moves_only_its_own_jobs() -> None:
    before = {job: owner_of(job, REPLICAS) for job in JOBS}
    after = {job: owner_of(job, REPLICAS[1:]) for job in JOBS}
    moved = {job for job in JOBS if before[job] != after[job]}
    assert moved == {job for job in JOBS if before[job] == REPLICAS[0]}


def test_a_joining_replica_takes_its_shares_from_everyone_and_nothing_else_moves() -> None:
    before = {job: owner_of(job, REPLICAS[:4]) for job in JOBS}
    after = {job: owner_of(job, REPLICAS) for job in JOBS}
    moved = [job for job in JOBS if before[job] != after[job]]
    assert moved
    assert all(after[job] == REPLICAS[4] for job in moved)
    assert len({before[job] for job in moved}) > 1


def test_a_replica_that_does_not_see_itself_claims_everything() -> None:
    view = Membership("reactor-new", frozenset(REPLICAS))
    assert view.shares == frozenset(range(SHARES))
    assert all(view.owns(job) for job in JOBS[:100])
    assert Membership("alone").owns(JOBS[0])


def test_lost_names_the_replicas_that_left() -> None:
    old = Membership("a", frozenset({"a", "b", "c"}))
    assert old.lost(Membership("a", frozenset({"a", "c", "d"}))) == {"b"}


@given(st.sets(st.text(min_size=1, max_size=8), min_size=1, max_size=6), st.uuids())
def test_the_owner_is_always_one_of_the_live(replicas: set[str], job: uuid.UUID) -> None:
    assert owner_of(str(job), list(replicas)) in replicas


def test_a_share_channel_fits_a_postgresql_name_or_there_is_none() -> None:
    channels = share_channels("analysis_jobs_terminal")
    assert channels is not None
    assert channels[0] == "analysis_jobs_terminal.0"
    assert channels[-1] == f"analysis_jobs_terminal.{SHARES - 1}"
    assert share_channels("c" * (63 - len(f".{SHARES - 1}"))) is not None
    assert share_channels("c" * (64 - len(f".{SHARES - 1}"))) is None


# -- the roster: heartbeats, and what replicas say between them -----------------------------------


def test_the_roster_loses_a_replica_that_left_at_once_and_for_good() -> None:
    roster = Roster("me")
    assert roster.heartbeats(frozenset({"me", "a", "b"})) == frozenset()
    assert roster.left("a") == {"a"}
    assert roster.membership.live == {"me", "b"}
    # A heartbeat of its, read before it left, does not bring it back.
    assert roster.heartbeats(frozenset({"me", "a", "b"})) == frozenset()
    assert roster.membership.live == {"me", "b"}
    assert roster.left("me") == frozenset()  # our own word comes back to us


def test_the_roster_takes_a_joining_replica_in_at_once() -> None:
    roster = Roster("me")
    assert not roster.joined("new")  # before its own first heartbeat it claims everything
    roster.heartbeats(frozenset({"me"}))
    assert roster.joined("new")
    assert roster.membership.live == {"me", "new"}
    assert not roster.joined("new")
    roster.left("gone")
    assert not roster.joined("gone")
