"""Hostile and odd input: garbage on the channel, a flood of duplicates, jobs that flip back to
running, results that are not objects, a 50 MB document, runs shared by many jobs, and jobs
hard-deleted while their deadline is pending. The reactor stays up and records nothing wrong.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from reactor.service import Reactor
from tests.faults.conftest import Report, StartReactor
from tests.faults.support import (
    Conn,
    Replicas,
    Workload,
    connect,
    listeners,
    replica_env,
    scalar,
    settle,
    wait_for,
)
from tests.integration.conftest import eventually

pytestmark = pytest.mark.anyio

GRACE = 1.0
CHANNEL = "analysis_jobs_terminal"


def sample(reactor: Reactor, name: str, labels: dict[str, str] | None = None) -> float:
    return reactor.metrics.registry.get_sample_value(name, labels or {}) or 0.0


def add_job(
    conn: Conn,
    *,
    run_id: uuid.UUID | None = None,
    status: str = "running",
    results: Any = None,
    created_at_offset: float = 0.0,
) -> tuple[uuid.UUID, uuid.UUID]:
    """Insert a job (``results`` as JSON text, or None); returns (job id, run id)."""
    job_id, run_id = uuid.uuid4(), run_id or uuid.uuid4()
    conn.execute(
        "INSERT INTO analysis_jobs (id, run_id, status, doc_html, results, created_at) "
        "VALUES (%s, %s, %s, '<p>doc</p>', %s::jsonb, now() + make_interval(secs => %s))",
        (job_id, run_id, status, results, created_at_offset),
    )
    return job_id, run_id


def finish(conn: Conn, job_id: uuid.UUID, results: str = '{"verdicts": [1]}') -> None:
    conn.execute(
        "UPDATE analysis_jobs SET status = 'complete', results = %s::jsonb, updated_at = now() "
        "WHERE id = %s",
        (results, job_id),
    )


def worker_jobs(conn: Conn) -> list[uuid.UUID]:
    rows = conn.execute("SELECT job_id FROM run_audit WHERE saved_by = 'worker' ORDER BY seq")
    return [r[0] for r in rows.fetchall()]


async def recorded_fresh_job(conn: Conn) -> None:
    """The reactor is alive and its timer path works: a new job is recorded after its grace."""
    job_id, run_id = add_job(conn)
    finish(conn, job_id)
    await eventually(
        lambda: scalar(conn, "SELECT count(*) FROM analysis_runs WHERE id = %s", (run_id,)),
        timeout=GRACE + 5,
    )


async def test_garbage_and_a_flood_on_the_channel(
    database_url: str, reactor_at: StartReactor, report: Report
) -> None:
    garbage = [
        "not json at all",
        '{"job_id": "6d3b5a3e-2b1e-4f3c-9a57-0d6c1f1e2a10"}',
        "[1, 2, 3]",
        "42",
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
    async with reactor_at(database_url, grace=GRACE) as reactor:
        with connect(database_url) as conn:
            # Valid ids that must come to nothing: unknown, running, soft- and hard-deleted.
            running, _ = add_job(conn)
            soft, _ = add_job(conn)
            finish(conn, soft)
            conn.execute("UPDATE analysis_jobs SET deleted_at = now() WHERE id = %s", (soft,))
            hard, _ = add_job(conn)
            conn.execute("DELETE FROM analysis_jobs WHERE id = %s", (hard,))
            bogus = [str(uuid.uuid4()) for _ in range(5)] + [str(running), str(hard)]
            rejected = sample(reactor, "reactor_notifications_total", {"result": "rejected"})
            accepted = sample(reactor, "reactor_notifications_total", {"result": "accepted"})
            # Pipelined, with a sync after each, so each is its own transaction: PostgreSQL
            # folds identical payloads within one transaction.
            with conn.pipeline() as pipeline:
                for payload in garbage + bogus:
                    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
                    pipeline.sync()
                # A flood: 10,000 duplicates.
                for _ in range(10_000):
                    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, str(running)))
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
            await recorded_fresh_job(conn)
            assert reactor.listener is not None
            assert reactor.listener.state == "listening"
            # The running job of the flood finishes for real later: recorded once.
            finish(conn, running)
            await anyio.sleep(GRACE)
            judgement, took = await settle(database_url, GRACE, within=10)
            writes = worker_jobs(conn)
    report(
        "input: garbage + 10k duplicate flood",
        1,
        judgement,
        recovery=took,
        note=f"{len(garbage)} garbage payloads, {got_rejected:g} counted rejected",
    )
    assert got_rejected == len(garbage)
    assert judgement.clean, str(judgement)
    assert soft not in writes
    assert hard not in writes
    assert writes.count(running) == 1


async def test_jobs_flipping_terminal_running_terminal(
    database_url: str, reactor_at: StartReactor, report: Report
) -> None:
    rng = random.Random(31)
    async with reactor_at(database_url, grace=GRACE):
        with connect(database_url) as conn:
            jobs = [add_job(conn)[0] for _ in range(20)]
            for job_id in jobs:
                finish(conn, job_id)
            await anyio.sleep(0.3 * GRACE)  # inside the grace window
            flipped = rng.sample(jobs, 10)
            for job_id in flipped:
                conn.execute(
                    "UPDATE analysis_jobs SET status = 'running', updated_at = now() WHERE id = %s",
                    (job_id,),
                )
            # Half of them stay running past their first deadline, then finish again.
            await anyio.sleep(0.3 * GRACE)
            for job_id in flipped[:5]:
                finish(conn, job_id, '{"verdicts": [2]}')
            await anyio.sleep(1.5 * GRACE)
            assert not {j for j in flipped[5:]} & set(worker_jobs(conn))
            for job_id in flipped[5:]:
                finish(conn, job_id, '{"verdicts": [3]}')
            await anyio.sleep(GRACE)
            judgement, took = await settle(database_url, GRACE, within=10)
            writes = worker_jobs(conn)
    report("input: terminal -> running -> terminal", 1, judgement, recovery=took)
    assert judgement.clean, str(judgement)
    assert sorted(writes) == sorted(jobs)


async def test_results_that_are_not_objects(
    database_url: str, reactor_at: StartReactor, report: Report
) -> None:
    # DESIGN.md: a job needs a run when results IS NOT NULL and results <> '{}'. Arrays,
    # strings, numbers and JSON null are all "not empty" by that rule, so they are recorded.
    recorded = ["[]", "[1, 2]", '"a string"', "42", "3.5", "true", "null"]
    skipped = ["{}"]
    async with reactor_at(database_url, grace=GRACE):
        with connect(database_url) as conn:
            jobs = {}
            for results in recorded + skipped:
                job_id, _ = add_job(conn)
                finish(conn, job_id, results)
                jobs[results] = job_id
            await anyio.sleep(GRACE)
            judgement, took = await settle(database_url, GRACE, within=10)
            await recorded_fresh_job(conn)
            stored = dict(
                conn.execute(
                    "SELECT r.job_id, r.results FROM analysis_runs r WHERE r.saved_by = 'worker'"
                ).fetchall()
            )
    report("input: results not an object", 1, judgement, recovery=took)
    assert judgement.clean, str(judgement)
    for results in recorded:
        assert stored[jobs[results]] == json.loads(results)
    assert jobs["{}"] not in stored


def test_a_50_mb_document_never_travels_to_python(
    database_url: str, replicas: Replicas, report: Report
) -> None:
    size = 50 * 1024 * 1024
    with connect(database_url) as conn:
        replica = replicas.start(replica_env(database_url), "big")
        wait_for(lambda: listeners(conn) >= 1, 30, "listening")
        # Warm the replica up with ordinary jobs, so the baseline includes its steady state.
        for _ in range(5):
            job_id, _ = add_job(conn)
            finish(conn, job_id)
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM analysis_runs") == 5, 10, "warm up")
        before = replica.rss()
        job_id, run_id = uuid.uuid4(), uuid.uuid4()
        conn.execute(
            "INSERT INTO analysis_jobs (id, run_id, status, doc_html) "
            "VALUES (%s, %s, 'running', repeat('x', %s))",
            (job_id, run_id, size),
        )
        finish(conn, job_id)
        wait_for(
            lambda: scalar(conn, "SELECT count(*) FROM analysis_runs WHERE id = %s", (run_id,)),
            30,
            "the big run recorded",
        )
        grown = replica.rss() - before
        length = scalar(conn, "SELECT length(doc_html) FROM analysis_runs WHERE id = %s", (run_id,))
    judgement, took = anyio.run(lambda: settle(database_url, GRACE, within=10), backend="asyncio")
    report(
        "input: 50 MB doc_html",
        1,
        judgement,
        recovery=took,
        note=f"replica RSS grew {grown / 1e6:.1f} MB while recording it",
    )
    assert length == size
    assert grown < 10 * 1024 * 1024
    assert judgement.clean, str(judgement)


async def test_one_run_shared_by_twenty_jobs(
    database_url: str, reactor_at: StartReactor, report: Report
) -> None:
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
            together = uuid.uuid4()
            offsets = rng.sample(range(20), 20)
            jobs = [add_job(conn, run_id=together, created_at_offset=-o)[0] for o in offsets]
            newest = jobs[offsets.index(0)]
            with conn.transaction():
                for job_id in jobs:
                    finish(conn, job_id)
            # Twenty more of another run, finishing one by one in a random order.
            staggered = uuid.uuid4()
            offsets2 = rng.sample(range(20), 20)
            jobs2 = [add_job(conn, run_id=staggered, created_at_offset=-o)[0] for o in offsets2]
            newest2 = jobs2[offsets2.index(0)]
            for job_id in rng.sample(jobs2, 20):
                finish(conn, job_id)
                await anyio.sleep(0.03)
            await anyio.sleep(GRACE)
            judgement, took = await settle(database_url, GRACE, within=10)
            rows = dict(conn.execute("SELECT id, job_id FROM analysis_runs").fetchall())
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


async def test_jobs_hard_deleted_while_their_deadline_is_pending(
    database_url: str, reactor_at: StartReactor, workload: Callable[..., Workload], report: Report
) -> None:
    app = workload(grace=GRACE, seed=34, save_ratio=0.0, reanalyse_ratio=0.0)
    async with reactor_at(database_url, grace=GRACE):
        with connect(database_url) as conn:
            jobs = await anyio.to_thread.run_sync(app.finish, 30)
            gone = jobs[::2]
            soft = jobs[1::4]
            conn.execute("DELETE FROM analysis_jobs WHERE id = ANY(%s)", (gone,))
            conn.execute("UPDATE analysis_jobs SET deleted_at = now() WHERE id = ANY(%s)", (soft,))
            await anyio.sleep(GRACE)
            judgement, took = await settle(database_url, GRACE, within=10)
            writes = set(worker_jobs(conn))
            await recorded_fresh_job(conn)
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
