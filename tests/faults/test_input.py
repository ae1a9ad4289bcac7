"""Hostile and odd input: garbage on the channel, a flood of duplicates, jobs that flip back to
running, results that are not objects, a 50 MB document, runs shared by many jobs, and jobs
hard-deleted (or soft-deleted, where the app does) while their deadline is pending. The reactor
stays up and records nothing wrong.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable

import anyio
import pytest

from reactor.runtime.service import Reactor
from tests.faults.conftest import Report, StartReactor
from tests.faults.scenario import GRACE, settled
from tests.faults.support import (
    Conn,
    Replicas,
    Workload,
    connect,
    listeners,
    replica_env,
    scalar,
    settle,
)
from tests.faults.tables import JobId, RunKey, Tables
from tests.polling import eventually, wait_for

pytestmark = pytest.mark.anyio


def sample(reactor: Reactor, name: str, labels: dict[str, str] | None = None) -> float:
    return reactor.metrics.registry.get_sample_value(name, labels or {}) or 0.0


def worker_jobs(tables: Tables, conn: Conn) -> list[JobId]:
    rows = conn.execute(
        tables.render("SELECT job_id FROM run_audit WHERE saved_by = @worker@ ORDER BY seq")
    )
    return [r[0] for r in rows.fetchall()]


def run_count(tables: Tables, conn: Conn, run: RunKey | None = None) -> int:
    """How many run rows there are (of ``run``, when given)."""
    if run is None:
        return int(scalar(conn, tables.render("SELECT count(*) FROM @runs@")))
    return int(scalar(conn, tables.render("SELECT count(*) FROM @runs@ WHERE @key@ = %s"), (run,)))


async def recorded_fresh_job(tables: Tables, conn: Conn) -> None:
    """The reactor is alive and its timer path works: a new job is recorded after its grace."""
    job_id, run = tables.add_job(conn)
    tables.finish(conn, job_id)
    await eventually(lambda: run_count(tables, conn, run), timeout=GRACE + 5)


async def test_garbage_and_a_flood_on_the_channel(
    database_url: str, tables: Tables, reactor_at: StartReactor, report: Report
) -> None:
    # A number names a job where job ids are bigints: there it is an unknown job, not garbage.
    numeric = tables.mapping.jobs.id_type == "bigint"
    garbage = [
        "not json at all",
        '{"job_id": "6d3b5a3e-2b1e-4f3c-9a57-0d6c1f1e2a10"}',
        "[1, 2, 3]",
        *([] if numeric else ["42"]),
        "true",
        "null",
        "",
        "   ",
        "x" * 7999,  # the largest payload pg_notify accepts
        "\u2603" * 2000,
        "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz",
        "6d3b5a3e-2b1e-4f3c-9a57",
        "'; DROP TABLE analysis_jobs; --",
    ]
    channel = tables.mapping.default_channel
    async with reactor_at(database_url, grace=GRACE) as reactor:
        with connect(database_url) as conn:
            # Valid ids that must come to nothing: unknown, running, soft- (where the app
            # soft-deletes) and hard-deleted.
            running, _ = tables.add_job(conn)
            hidden: list[JobId] = []
            if tables.soft_deletes:
                soft, _ = tables.add_job(conn)
                tables.finish(conn, soft)
                tables.soft_delete(conn, soft)
                hidden.append(soft)
            hard, _ = tables.add_job(conn)
            tables.delete(conn, hard)
            unknown = [str(10**12 + n) if numeric else str(uuid.uuid4()) for n in range(5)]
            bogus = [*unknown, *(["42"] if numeric else []), str(running), str(hard)]
            rejected = sample(reactor, "reactor_notifications_total", {"result": "rejected"})
            accepted = sample(reactor, "reactor_notifications_total", {"result": "accepted"})
            # Pipelined, with a sync after each, so each is its own transaction: PostgreSQL
            # folds identical payloads within one transaction.
            with conn.pipeline() as pipeline:
                for payload in garbage + bogus:
                    conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))
                    pipeline.sync()
                # A flood: 10,000 duplicates.
                for _ in range(10_000):
                    conn.execute("SELECT pg_notify(%s, %s)", (channel, str(running)))
                    pipeline.sync()
            await eventually(
                lambda: (
                    sample(reactor, "reactor_notifications_total", {"result": "accepted"})
                    >= accepted + 10_000 + len(bogus)
                ),
                timeout=30,
            )
            got_rejected = (
                sample(reactor, "reactor_notifications_total", {"result": "rejected"}) - rejected
            )
            await recorded_fresh_job(tables, conn)
            assert reactor.listener is not None
            assert reactor.listener.state == "listening"
            # The running job of the flood finishes for real later: recorded once.
            tables.finish(conn, running)
            await anyio.sleep(GRACE)
            judgement, took = await settle(database_url, GRACE, within=10, mapping=tables.mapping)
            writes = worker_jobs(tables, conn)
    report(
        "input: garbage + 10k duplicate flood",
        1,
        judgement,
        recovery=took,
        note=f"{len(garbage)} garbage payloads, {got_rejected:g} counted rejected",
    )
    assert got_rejected == len(garbage)
    assert judgement.clean, str(judgement)
    assert not set(hidden) & set(writes)
    assert hard not in writes
    assert writes.count(running) == 1


async def test_jobs_flipping_terminal_running_terminal(
    database_url: str, tables: Tables, reactor_at: StartReactor, report: Report
) -> None:
    rng = random.Random(31)
    async with reactor_at(database_url, grace=GRACE):
        with connect(database_url) as conn:
            jobs = [tables.add_job(conn)[0] for _ in range(20)]
            for job_id in jobs:
                tables.finish(conn, job_id)
            await anyio.sleep(0.3 * GRACE)  # inside the grace window
            flipped = rng.sample(jobs, 10)
            for job_id in flipped:
                tables.reopen(conn, job_id)
            # Half of them stay running past their first deadline, then finish again.
            await anyio.sleep(0.3 * GRACE)
            for job_id in flipped[:5]:
                tables.finish(conn, job_id, results='{"verdicts": [2]}')
            # Once the jobs that stayed terminal (due at the same first deadline) and the five
            # finished again are recorded, the reactor has acted on every deadline so far: the
            # jobs still running must have been passed over.
            settled = set(jobs) - set(flipped[5:])
            await eventually(lambda: settled <= set(worker_jobs(tables, conn)), timeout=5 * GRACE)
            assert not set(flipped[5:]) & set(worker_jobs(tables, conn))
            for job_id in flipped[5:]:
                tables.finish(conn, job_id, results='{"verdicts": [3]}')
            await anyio.sleep(GRACE)
            judgement, took = await settle(database_url, GRACE, within=10, mapping=tables.mapping)
            writes = worker_jobs(tables, conn)
    report("input: terminal -> running -> terminal", 1, judgement, recovery=took)
    assert judgement.clean, str(judgement)
    assert sorted(writes) == sorted(jobs)


async def test_results_that_are_not_objects(
    database_url: str, tables: Tables, reactor_at: StartReactor, report: Report
) -> None:
    # DESIGN.md: a job needs a run when results IS NOT NULL and results <> '{}'. Arrays,
    # strings, numbers and JSON null are all "not empty" by that rule, so they are recorded.
    recorded = ["[]", "[1, 2]", '"a string"', "42", "3.5", "true", "null"]
    skipped = ["{}"]
    async with reactor_at(database_url, grace=GRACE):
        with connect(database_url) as conn:
            jobs = {}
            for results in recorded + skipped:
                job_id, _ = tables.add_job(conn)
                tables.finish(conn, job_id, results=results)
                jobs[results] = job_id
            await anyio.sleep(GRACE)
            judgement, took = await settle(database_url, GRACE, within=10, mapping=tables.mapping)
            await recorded_fresh_job(tables, conn)
            stored = dict(
                conn.execute(
                    tables.render(
                        "SELECT @r.job@, r.@results@ FROM @runs@ r WHERE @r.saved_by@ = @worker@"
                    )
                ).fetchall()
            )
    report("input: results not an object", 1, judgement, recovery=took)
    assert judgement.clean, str(judgement)
    for results in recorded:
        assert stored[jobs[results]] == json.loads(results)
    assert jobs["{}"] not in stored


def test_a_50_mb_document_never_travels_to_python(
    database_url: str, tables: Tables, replicas: Replicas, report: Report
) -> None:
    size = 50 * 1024 * 1024
    with connect(database_url) as conn:
        replica = replicas.start(replica_env(database_url, tables), "big")
        wait_for(lambda: listeners(conn) >= 1, 30, "listening")
        # Warm the replica up with ordinary jobs, so the baseline includes its steady state.
        for _ in range(5):
            job_id, _ = tables.add_job(conn)
            tables.finish(conn, job_id)
        wait_for(lambda: run_count(tables, conn) == 5, 10, "warm up")
        before = replica.rss()
        job_id, run = tables.add_job(conn, doc="")
        conn.execute(
            tables.render("UPDATE @jobs@ SET @doc@ = repeat('x', %s) WHERE @id@ = %s"),
            (size, job_id),
        )
        tables.finish(conn, job_id)
        wait_for(lambda: run_count(tables, conn, run), 30, "the big run recorded")
        grown = replica.rss() - before
        length = scalar(
            conn, tables.render("SELECT length(@doc@) FROM @runs@ WHERE @key@ = %s"), (run,)
        )
    judgement, took = settled(database_url, tables, within=10)
    report(
        "input: 50 MB document",
        1,
        judgement,
        recovery=took,
        note=f"replica RSS grew {grown / 1e6:.1f} MB while recording it",
    )
    assert length == size
    assert grown < 10 * 1024 * 1024
    assert judgement.clean, str(judgement)


@pytest.mark.second_mapping
async def test_one_run_shared_by_twenty_jobs(
    database_url: str, tables: Tables, reactor_at: StartReactor, report: Report
) -> None:
    if tables.loaded().one_to_one:
        pytest.skip("each job is its own run in a one-to-one mapping: no run has two jobs")
    rng = random.Random(33)
    async with reactor_at(database_url, grace=GRACE) as reactor:
        # Settled first: a startup poll or re-arm scan would arm or claim part of the first
        # run's jobs on a road of its own, and its write would not be the newest job's.
        await eventually(
            lambda: (
                reactor.listener is not None
                and reactor.listener.proven
                and not reactor.polling
                and not reactor.scan_pending
            )
        )
        with connect(database_url) as conn:
            # Twenty jobs of one run, created_at in a random order, finishing together.
            together = tables.new_run()
            offsets = rng.sample(range(20), 20)
            jobs = [tables.add_job(conn, run=together, created_age=o)[0] for o in offsets]
            newest = jobs[offsets.index(0)]
            with conn.transaction():
                for job_id in jobs:
                    tables.finish(conn, job_id)
            # Twenty more of another run, finishing one by one in a random order.
            staggered = tables.new_run()
            offsets2 = rng.sample(range(20), 20)
            jobs2 = [tables.add_job(conn, run=staggered, created_age=o)[0] for o in offsets2]
            newest2 = jobs2[offsets2.index(0)]
            for job_id in rng.sample(jobs2, 20):
                tables.finish(conn, job_id)
                await anyio.sleep(0.03)
            await anyio.sleep(GRACE)
            judgement, took = await settle(database_url, GRACE, within=10, mapping=tables.mapping)
            rows = dict(conn.execute(tables.render("SELECT @key@, @job@ FROM @runs@")).fetchall())
            together_writes = [
                r[0]
                for r in conn.execute(
                    "SELECT job_id FROM run_audit WHERE run_id = %s", (together,)
                ).fetchall()
            ]
    report("input: 20 jobs share a run", 2, judgement, recovery=took)
    assert judgement.clean, str(judgement)
    assert rows == {together: newest, staggered: newest2}
    assert together_writes == [newest]


@pytest.mark.second_mapping
async def test_jobs_hard_deleted_while_their_deadline_is_pending(
    database_url: str,
    tables: Tables,
    reactor_at: StartReactor,
    workload: Callable[..., Workload],
    report: Report,
) -> None:
    app = workload(grace=GRACE, seed=34, save_ratio=0.0, reanalyse_ratio=0.0)
    async with reactor_at(database_url, grace=GRACE):
        with connect(database_url) as conn:
            jobs = await anyio.to_thread.run_sync(app.finish, 30)
            gone = jobs[::2]
            # Where the app soft-deletes: a quarter of the jobs.
            soft = jobs[1::4] if tables.soft_deletes else []
            tables.delete(conn, *gone)
            if soft:
                tables.soft_delete(conn, *soft)
            await anyio.sleep(GRACE)
            judgement, took = await settle(database_url, GRACE, within=10, mapping=tables.mapping)
            writes = set(worker_jobs(tables, conn))
            await recorded_fresh_job(tables, conn)
    report(
        "input: hard/soft deletes before the deadline",
        1,
        judgement,
        recovery=took,
        note=f"{len(gone)} hard-deleted, {len(soft)} soft-deleted",
    )
    assert judgement.clean, str(judgement)
    assert not writes & set(gone)
    assert not writes & set(soft)
    assert writes == set(jobs) - set(gone) - set(soft)
