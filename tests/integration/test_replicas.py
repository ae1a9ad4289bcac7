"""Several replicas side by side (a rolling deploy): every job is recorded, and exactly once."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from reactor import db
from reactor.core.ownership import ALL_SHARES
from reactor.install.mapping import REFERENCE
from reactor.listen.hints import fleet_linger
from reactor.runtime.service import Reactor
from tests.helpers import Conn, client_save, early_writes, finish, new_job, worker_writes
from tests.integration.conftest import StartReactor
from tests.integration.support import (
    app_and_a_tab,
    audit,
    claims_skipped,
    recorded,
    scalar,
    start_scans_over,
    watch_recorder,
    worker_delay,
)
from tests.polling import eventually

pytestmark = pytest.mark.anyio

GRACE = 0.4
JOBS = 200


def _total_recorded(reactors: tuple[Reactor, ...]) -> float:
    return sum(recorded(r, source) for r in reactors for source in ("timer", "scan"))


@pytest.mark.parametrize("finishing", ["one transaction", "one by one"])
async def test_two_replicas_record_each_job_exactly_once(
    database_url: str, start_reactor: StartReactor, finishing: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(grace=GRACE) as r1, start_reactor(grace=GRACE) as r2:
            replicas = (r1, r2)
            jobs = [new_job(conn) for _ in range(JOBS)]
            # A tab is open for every third job and saves it right away, well inside grace.
            saved = {job_id for i, (job_id, _) in enumerate(jobs) if i % 3 == 0}
            if finishing == "one transaction":
                # 200 notifications at one commit: both replicas arm 200 timers at once.
                # The tabs' saves commit with it, so none can land after the grace.
                with conn.transaction():
                    for job_id, _ in jobs:
                        finish(conn, job_id)
                    for job_id in saved:
                        client_save(conn, job_id)
            else:
                for job_id, _ in jobs:
                    finish(conn, job_id)
                    if job_id in saved:
                        client_save(conn, job_id)

            await eventually(
                lambda: scalar(conn, "SELECT count(*) FROM analysis_runs") == JOBS, timeout=20
            )
            # Both replicas let every timer run out, including retries of jobs the other held.
            await eventually(lambda: len(r1.queue) == 0 and len(r2.queue) == 0, timeout=20)
            for r in replicas:
                assert await r.scan(rearm=True) == 0
            # What the replicas say they recorded is what the database holds.
            await eventually(lambda: _total_recorded(replicas) >= JOBS - len(saved))
            total = _total_recorded(replicas)

        expected = {job_id for job_id, _ in jobs} - saved
        _assert_exactly_once(conn, expected, saved)
        assert total == len(expected), f"recorded {total}, expected {len(expected)}"


async def test_rows_another_writer_holds_are_retried_not_lost(
    database_url: str, start_reactor: StartReactor
) -> None:
    with app_and_a_tab(database_url) as (conn, locker):
        async with start_reactor(grace=GRACE) as r1, start_reactor(grace=GRACE) as r2:
            replicas = (r1, r2)
            # Each holds its share first: the held rows below are both replicas' to meet.
            await eventually(
                lambda: all(r.holding and len(r.membership.live) == 2 for r in replicas)
            )
            jobs = [new_job(conn) for _ in range(40)]
            with conn.transaction():
                for job_id, _ in jobs:
                    finish(conn, job_id)
            # Another writer (a replica mid-statement, or the app) holds a quarter of the rows
            # the way the claim does, past their grace: five of each replica's.
            held = [
                job_id
                for r in replicas
                for job_id in [j for j, _ in jobs if r.membership.owns(str(j))][:5]
            ]
            locked = locker.execute(
                "SELECT id FROM analysis_jobs WHERE id = ANY(%s) FOR NO KEY UPDATE", (held,)
            ).fetchall()
            assert len(locked) == len(held)
            # Both replicas find them taken: counted as skipped, left for a retry.
            await eventually(lambda: all(claims_skipped(r) >= 1 for r in replicas))
            await eventually(
                lambda: scalar(conn, "SELECT count(*) FROM analysis_runs") == len(jobs) - len(held)
            )
            held_runs = scalar(
                conn, "SELECT count(*) FROM run_audit WHERE job_id = ANY(%s)", (held,)
            )
            assert held_runs == 0
            locker.commit()  # the holder goes away without writing
            await eventually(
                lambda: scalar(conn, "SELECT count(*) FROM analysis_runs") == len(jobs)
            )
            await eventually(lambda: len(r1.queue) == 0 and len(r2.queue) == 0)
            await eventually(lambda: _total_recorded(replicas) >= len(jobs))
            total = _total_recorded(replicas)
        _assert_exactly_once(conn, {job_id for job_id, _ in jobs}, set())
        assert total == len(jobs)


def _assert_exactly_once(conn: Conn, expected: set[uuid.UUID], saved: set[uuid.UUID]) -> None:
    writes = worker_writes(conn)
    pairs = [(run_id, job_id) for run_id, job_id, _ in writes]
    assert len(pairs) == len(set(pairs)), "dup: a (run, job) was written twice by the worker"
    assert {job_id for _, job_id in pairs} == expected, "lost or wrong worker writes"
    assert len(writes) == len(expected)
    assert all(op == "INSERT" for _, _, op in writes)
    # clobbered = 0: every run a tab saved is still the tab's, with no worker write after it.
    clients = scalar(
        conn,
        "SELECT count(*) FROM analysis_runs WHERE saved_by = 'client' AND job_id = ANY(%s)",
        (list(saved),),
    )
    assert clients == len(saved)
    assert not any(
        saved_by == "worker" and job_id in saved for _, _, job_id, saved_by in audit(conn)
    )
    assert early_writes(conn, GRACE) == 0


async def test_replicas_split_the_claims_one_statement_per_job(
    database_url: str, start_reactor: StartReactor
) -> None:
    # A probe interval a loaded machine cannot outlast: a heartbeat that ages out mid-test would
    # hand a live replica's share to the others and claim its jobs twice. Joins are told at once.
    settings = {"grace": GRACE, "probe_interval": 1.0, "probe_timeout": 1.0}
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with (
            start_reactor(**settings) as r1,
            start_reactor(**settings) as r2,
            start_reactor(**settings) as r3,
        ):
            replicas = (r1, r2, r3)
            # Every replica sees all three through PostgreSQL before the jobs come.
            await eventually(lambda: all(len(r.membership.live) == 3 for r in replicas))
            for r in replicas:
                await start_scans_over(r)
            logs = [watch_recorder(r) for r in replicas]
            jobs = [new_job(conn)[0] for _ in range(60)]
            for job_id in jobs:
                finish(conn, job_id)
            await eventually(
                lambda: scalar(conn, "SELECT count(*) FROM analysis_runs") == len(jobs)
            )
            await eventually(lambda: all(len(r.queue) == 0 for r in replicas))
        claimed = [job for log in logs for batch in log.batches for job in batch]
        # Each job was claimed once, by its owner; every replica owned a share.
        assert sorted(claimed) == sorted(str(j) for j in jobs)
        assert all(log.batches for log in logs)
        left = [
            r.metrics.registry.get_sample_value("reactor_deadlines_left_to_owner_total") or 0
            for r in replicas
        ]
        # Each heard every job and left the two thirds it does not own to their owners; a
        # re-arm after a heartbeat that aged out on a loaded machine offers them again.
        assert sum(left) >= 2 * len(jobs)
        assert len(worker_writes(conn)) == len(jobs)


async def test_a_stopping_replica_hands_its_jobs_over_at_once(
    database_url: str, start_reactor: StartReactor
) -> None:
    settings = {"grace": GRACE, "probe_interval": 0.2, "probe_timeout": 0.5}
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(**settings) as staying:
            async with start_reactor(**settings) as leaving:
                await eventually(lambda: len(staying.membership.live) == 2)
                # Each hears half the jobs: its hints gather twice as long per statement.
                await eventually(lambda: staying.verifier.pending.linger == fleet_linger(2, GRACE))
                assert fleet_linger(2, GRACE) > fleet_linger(1, GRACE)
                gone = leaving.replica_id
            # It said goodbye: no heartbeat row is left to wait out.
            assert scalar(conn, "SELECT count(*) FROM reactor.replicas WHERE id = %s", (gone,)) == 0
            await eventually(lambda: staying.membership.live == {staying.replica_id})
            await eventually(lambda: staying.verifier.pending.linger == fleet_linger(1, GRACE))
            jobs = [new_job(conn)[0] for _ in range(20)]
            for job_id in jobs:
                finish(conn, job_id)
            await eventually(lambda: len(worker_writes(conn)) == len(jobs))


@pytest.mark.parametrize("spread", [False, True], ids=["one channel", "spread"])
async def test_the_others_hear_a_replica_leave_between_their_checks(
    database_url: str, start_reactor: StartReactor, spread: bool
) -> None:
    # Health checks a minute apart: only the replica's own word can move its share so soon.
    # Spread, its jobs were notified on its shares' channels alone: the other must LISTEN on
    # them, then read from the queue what was notified before.
    if spread:
        async with await db.connect(database_url, "test") as c:
            await db.migrate(c, REFERENCE.in_public(), spread=True)
    settings = {"grace": 1.0, "probe_interval": 60.0, "probe_timeout": 5.0}
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(**settings) as leaving:
            await eventually(lambda: leaving.membership.live == {leaving.replica_id})
            async with start_reactor(**settings) as staying:
                # The second replica's first check saw both; the first sees only itself until
                # its next check, a minute away.
                both = {leaving.replica_id, staying.replica_id}
                await eventually(lambda: staying.membership.live == both)
                await eventually(lambda: staying.listener is not None and staying.listener.proven)
                jobs = [new_job(conn)[0] for _ in range(20)]
                theirs = [j for j in jobs if not staying.membership.owns(str(j))]
                assert theirs, "rendezvous hashing gave the leaving replica no job of 20"
                for job_id in jobs:
                    finish(conn, job_id)
                leaving.stop()
                await eventually(
                    lambda: staying.membership.live == {staying.replica_id}, timeout=2.0
                )
                if spread:
                    listener = staying.listener
                    assert listener is not None
                    await eventually(lambda: listener.hears == ALL_SHARES, timeout=2.0)
                # Its share comes due a second later and is recorded on time by the other.
                await eventually(lambda: len(worker_writes(conn)) == len(jobs), timeout=5.0)
                late = worker_delay(conn, theirs)
        assert late < 1.0 + 1.0  # the grace, and well under a check


async def test_the_others_hear_a_replica_join_between_their_checks(
    database_url: str, start_reactor: StartReactor
) -> None:
    # Health checks a minute apart: only the new replica's first heartbeat, told on the channel,
    # can bring it into the first one's view so soon.
    settings = {"grace": 1.0, "probe_interval": 60.0, "probe_timeout": 5.0}
    async with start_reactor(**settings) as first:
        await eventually(lambda: first.membership.live == {first.replica_id})
        await eventually(lambda: first.listener is not None and first.listener.proven)
        # Its checks: at start, once it holds its share (its first heartbeat) and once its
        # listener is proven (the heartbeat names that session); then none for a minute.
        health = first.cadence.duties["health"]
        listener = first.listener
        assert listener is not None
        named = "SELECT (SELECT session_pid FROM reactor.replicas WHERE id = %s)"
        with psycopg.connect(database_url, autocommit=True) as conn:
            await eventually(
                lambda: (
                    first.holding
                    and listener.session_pid is not None
                    and scalar(conn, named, (first.replica_id,)) == listener.session_pid
                    and not health.running
                    and health.next_at > first.clock.now()
                )
            )
        checks = health.runs
        async with start_reactor(**settings) as second:
            both = {first.replica_id, second.replica_id}
            await eventually(lambda: second.membership.live == both)
            await eventually(lambda: first.membership.live == both, timeout=5.0)
            assert health.runs == checks  # no check of its own told it
