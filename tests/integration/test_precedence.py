"""Who may overwrite a run: re-analysis, client rows, legacy rows, and two jobs in one batch.

DESIGN.md: a client save always outranks a worker save; a later job (newer created_at, ties
broken by id) may replace an earlier job's worker row; a NULL saved_by counts as client.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest

from reactor import db
from reactor.install import REFERENCE_INSTALL
from tests.helpers import APP, Conn, client_save, early_writes, finish, run_row, worker_writes
from tests.integration.conftest import StartReactor
from tests.integration.support import (
    add_job,
    audit,
    recorded,
    scalar,
    start_scans_over,
    watch_recorder,
)
from tests.polling import eventually

pytestmark = pytest.mark.anyio

GRACE = 0.3
# How long ago the earlier job of a run was created, in seconds.
EARLIER = 3600.0


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
            a, run_id = add_job(conn, created_age=EARLIER)
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


@pytest.mark.parametrize("saved_by", ["client", None], ids=["client", "legacy"])
async def test_later_job_does_not_replace_a_tab_row(
    database_url: str, start_reactor: StartReactor, saved_by: str | None
) -> None:
    # A legacy row (saved_by NULL, from before the column) counts as the client's.
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE) as reactor:
            await start_scans_over(reactor)
            log = watch_recorder(reactor)
            a, run_id = add_job(conn, created_age=EARLIER)
            finish(conn, a)
            client_save(conn, a, legacy=saved_by is None)
            b, _ = add_job(conn, run_id=run_id)
            finish(conn, b)
            await eventually(lambda: log.all_processed([a, b]))
            assert await reactor.scan(rearm=True) == 0
            assert len(reactor.queue) == 0
        assert run_row(conn, run_id) == (a, saved_by)
        assert worker_writes(conn) == []


async def test_earlier_job_never_replaces_the_later_worker_row(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE) as reactor:
            await start_scans_over(reactor)
            log = watch_recorder(reactor)
            a, run_id = add_job(conn, created_age=EARLIER)
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
        a, run_id = add_job(conn, created_age=EARLIER)
        b, _ = add_job(conn, run_id=run_id)
        for job in (a, b):
            finish(conn, job, age=10)
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
        oldest, run_id = add_job(conn, created_age=2 * EARLIER)
        finish(conn, oldest, age=20)
        assert [o.outcome for o in await database.record_jobs([str(oldest)])] == ["recorded"]

        a, _ = add_job(conn, run_id=run_id, created_age=EARLIER)
        b, _ = add_job(conn, run_id=run_id)
        for job in (a, b):
            finish(conn, job, age=10)
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
        _, run_id = add_job(conn, status="complete", results={"v": 1}, created_age=EARLIER, age=30)
        b, _ = add_job(conn, run_id=run_id, status="failed", results={"v": 2}, age=20)
        async with start_reactor(grace=GRACE) as reactor:
            assert await eventually(lambda: run_row(conn, run_id)) == (b, "worker")
            await eventually(lambda: reactor.scans >= 1)
            await eventually(lambda: recorded(reactor, "scan") == 1)
            assert await reactor.scan(rearm=True) == 0
        assert worker_writes(conn) == [(run_id, b, "INSERT")]
        assert early_writes(conn, GRACE) == 0


@pytest.mark.parametrize("first", ["smaller id", "larger id"])
async def test_created_at_tie_is_broken_by_id(
    database_url: str, database: db.Database, first: str
) -> None:
    # The larger id is the later job: it replaces the smaller one's worker row, and the smaller
    # one never replaces the larger one's.
    small, large = _ordered_ids()
    with _connect(database_url) as conn:
        # Both in one statement, so that their created_at is the same to the microsecond.
        run_id = uuid.uuid4()
        conn.execute(*APP.create([run_id, run_id], jobs=[small, large], created_age=EARLIER))
        created = "SELECT count(DISTINCT created_at) FROM analysis_jobs WHERE run_id = %s"
        assert scalar(conn, created, (run_id,)) == 1
        outcomes = []
        for job in (small, large) if first == "smaller id" else (large, small):
            finish(conn, job, age=10)
            outcomes.append([o.outcome for o in await database.record_jobs([str(job)])])
        assert run_row(conn, run_id) == (large, "worker")
        if first == "smaller id":
            assert outcomes == [["recorded"], ["recorded"]]
            assert worker_writes(conn) == [(run_id, small, "INSERT"), (run_id, large, "UPDATE")]
        else:
            assert outcomes[0] == ["recorded"]
            assert worker_writes(conn) == [(run_id, large, "INSERT")]
