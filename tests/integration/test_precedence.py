"""Who may overwrite a run: re-analysis, client rows, legacy rows, and two jobs in one batch.

DESIGN.md: a client save always outranks a worker save; a later job (newer created_at, ties
broken by id) may replace an earlier job's worker row; a NULL saved_by counts as client.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from reactor import db
from reactor.install import REFERENCE_INSTALL
from tests.helpers import (
    Conn,
    client_save,
    early_writes,
    finish,
    run_row,
    worker_writes,
)
from tests.integration.conftest import StartReactor
from tests.integration.support import add_job, audit, recorded, watch_recorder
from tests.polling import eventually

pytestmark = pytest.mark.anyio

GRACE = 0.3
EARLIER = datetime.now(UTC) - timedelta(hours=1)


def _connect(database_url: str) -> Conn:
    return psycopg.connect(database_url, autocommit=True)


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[db.Database]:
    """The reactor's statements on their own, with no timers or listener around them."""
    async with db.make_pool(database_url, max_size=2) as pool:
        yield db.Database.pooled(REFERENCE_INSTALL, pool, grace=GRACE)


def _ordered_ids() -> tuple[uuid.UUID, uuid.UUID]:
    """Two job ids, the first smaller than the second (PostgreSQL compares uuids bytewise)."""
    a, b = sorted((uuid.uuid4(), uuid.uuid4()), key=lambda u: u.bytes)
    return a, b


async def test_later_job_replaces_the_earlier_worker_row(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE):
            a, run_id = add_job(conn, created_at=EARLIER)
            finish(conn, a)
            assert await eventually(lambda: run_row(conn, run_id)) == (a, "worker")

            b, _ = add_job(conn, run_id=run_id)
            finish(conn, b)
            assert await eventually(lambda: run_row(conn, run_id) == (b, "worker"))
        assert audit(conn) == [
            ("INSERT", run_id, a, "worker"),
            ("UPDATE", run_id, b, "worker"),
        ]
        assert early_writes(conn, GRACE) == 0


async def test_later_job_does_not_replace_a_client_row(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE) as reactor:
            log = watch_recorder(reactor)
            a, run_id = add_job(conn, created_at=EARLIER)
            finish(conn, a)
            client_save(conn, a)
            b, _ = add_job(conn, run_id=run_id)
            finish(conn, b)
            await eventually(lambda: log.all_processed([a, b]))
            assert await reactor.scan(rearm=True) == 0
            assert len(reactor.queue) == 0
        assert run_row(conn, run_id) == (a, "client")
        assert worker_writes(conn) == []


async def test_later_job_does_not_replace_a_legacy_row(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        a, run_id = add_job(conn, status="complete", results={"v": 1}, created_at=EARLIER, age=60)
        conn.execute(
            "INSERT INTO analysis_runs (id, job_id, doc_html, results, saved_by) "
            "VALUES (%s, %s, 'old', '{\"v\": 0}', NULL)",
            (run_id, a),
        )
        async with start_reactor(grace=GRACE) as reactor:
            log = watch_recorder(reactor)
            b, _ = add_job(conn, run_id=run_id)
            finish(conn, b)
            await eventually(lambda: log.processed(b))
            assert await reactor.scan(rearm=True) == 0
        assert run_row(conn, run_id) == (a, None)
        assert worker_writes(conn) == []


async def test_earlier_job_never_replaces_the_later_worker_row(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE) as reactor:
            log = watch_recorder(reactor)
            a, run_id = add_job(conn, created_at=EARLIER)
            b, _ = add_job(conn, run_id=run_id)
            finish(conn, b)
            assert await eventually(lambda: run_row(conn, run_id)) == (b, "worker")
            # The earlier job of the run finishes late (e.g. a retried first analysis).
            finish(conn, a)
            await eventually(lambda: log.processed(a))
            assert await reactor.scan(rearm=True) == 0
        assert run_row(conn, run_id) == (b, "worker")
        assert worker_writes(conn) == [(run_id, b, "INSERT")]


@pytest.mark.parametrize("order", ["older first", "newer first"])
async def test_both_jobs_of_a_run_due_in_one_timer_batch(
    database_url: str, database: db.Database, order: str
) -> None:
    with _connect(database_url) as conn:
        a, run_id = add_job(conn, created_at=EARLIER)
        b, _ = add_job(conn, run_id=run_id)
        for job in (a, b):
            finish(conn, job)
            conn.execute(
                "UPDATE analysis_jobs SET updated_at = now() - interval '10 seconds' WHERE id = %s",
                (job,),
            )
        batch = [str(a), str(b)] if order == "older first" else [str(b), str(a)]
        outcomes = {o.job_id: o.outcome for o in await database.record_jobs(batch)}
        assert outcomes == {str(a): "superseded", str(b): "recorded"}
        assert run_row(conn, run_id) == (b, "worker")
        assert worker_writes(conn) == [(run_id, b, "INSERT")]
        # Nothing is left to do for either job.
        assert await database.record_jobs(batch) == []
        assert await database.record_oldest(10) == []


async def test_both_jobs_due_in_one_batch_over_an_older_worker_row(
    database_url: str, database: db.Database
) -> None:
    with _connect(database_url) as conn:
        oldest, run_id = add_job(conn, created_at=EARLIER - timedelta(hours=1))
        finish(conn, oldest)
        conn.execute(
            "UPDATE analysis_jobs SET updated_at = now() - interval '20 seconds' WHERE id = %s",
            (oldest,),
        )
        assert [o.outcome for o in await database.record_jobs([str(oldest)])] == ["recorded"]

        a, _ = add_job(conn, run_id=run_id, created_at=EARLIER)
        b, _ = add_job(conn, run_id=run_id)
        for job in (a, b):
            finish(conn, job)
            conn.execute(
                "UPDATE analysis_jobs SET updated_at = now() - interval '10 seconds' WHERE id = %s",
                (job,),
            )
        outcomes = {o.job_id: o.outcome for o in await database.record_oldest(10)}
        assert outcomes == {str(a): "superseded", str(b): "recorded"}
        assert run_row(conn, run_id) == (b, "worker")
        assert worker_writes(conn) == [
            (run_id, oldest, "INSERT"),
            (run_id, b, "UPDATE"),
        ]


async def test_both_jobs_due_at_startup_scan(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        _, run_id = add_job(conn, status="complete", results={"v": 1}, created_at=EARLIER, age=30)
        b, _ = add_job(conn, run_id=run_id, status="failed", results={"v": 2}, age=20)
        async with start_reactor(grace=GRACE) as reactor:
            assert await eventually(lambda: run_row(conn, run_id)) == (b, "worker")
            await eventually(lambda: reactor.scans >= 1)
            await eventually(lambda: recorded(reactor, "scan") == 1)
            assert await reactor.scan(rearm=True) == 0
        assert worker_writes(conn) == [(run_id, b, "INSERT")]
        assert early_writes(conn, GRACE) == 0


async def test_created_at_tie_is_broken_by_id(database_url: str, database: db.Database) -> None:
    with _connect(database_url) as conn:
        # Forward: the larger id is the later job and replaces the smaller one's worker row.
        small, large = _ordered_ids()
        _, run_id = add_job(conn, job_id=small, created_at=EARLIER)
        add_job(conn, job_id=large, run_id=run_id, created_at=EARLIER)
        finish(conn, small)
        conn.execute(
            "UPDATE analysis_jobs SET updated_at = now() - interval '10 seconds' WHERE id = %s",
            (small,),
        )
        assert [o.outcome for o in await database.record_jobs([str(small)])] == ["recorded"]
        finish(conn, large)
        conn.execute(
            "UPDATE analysis_jobs SET updated_at = now() - interval '10 seconds' WHERE id = %s",
            (large,),
        )
        assert [o.outcome for o in await database.record_jobs([str(large)])] == ["recorded"]
        assert run_row(conn, run_id) == (large, "worker")

        # Backward: the smaller id never replaces the larger one's worker row.
        small, large = _ordered_ids()
        _, run_id = add_job(conn, job_id=large, created_at=EARLIER)
        add_job(conn, job_id=small, run_id=run_id, created_at=EARLIER)
        for job in (large, small):
            finish(conn, job)
            conn.execute(
                "UPDATE analysis_jobs SET updated_at = now() - interval '10 seconds' WHERE id = %s",
                (job,),
            )
            await database.record_jobs([str(job)])
        assert run_row(conn, run_id) == (large, "worker")
        assert [w for w in worker_writes(conn) if w[0] == run_id] == [(run_id, large, "INSERT")]
