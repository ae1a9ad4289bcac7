"""Who may overwrite a run: re-analysis, retries, client rows, legacy rows, and two jobs in one
batch.

DESIGN.md: a client save always outranks a worker save; a later job (newer created_at, ties
broken by id) may replace an earlier job's worker row, and a later finish of the same job (a
retry) the worker row of its earlier finish; a NULL saved_by counts as client.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest

from reactor import db
from reactor.install import REFERENCE_INSTALL
from reactor.settings.config import Settings
from tests import hookmods
from tests.faults.support import judge
from tests.helpers import (
    APP,
    Conn,
    client_save,
    early_writes,
    finish,
    reopen,
    run_row,
    worker_writes,
)
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
        yield db.Database.pooled(REFERENCE_INSTALL, pool, settings=Settings(grace=GRACE))


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


# -- a job that finishes again: its last finish is the run's ---------------------------------

FIRST = {"verdicts": ["first"]}
LAST = {"verdicts": ["last"]}


def _results(conn: Conn, run_id: uuid.UUID) -> object:
    """The run's verdicts; None while it has no row."""
    row = conn.execute("SELECT results FROM analysis_runs WHERE id = %s", (run_id,)).fetchone()
    return None if row is None else row[0]


def _retry(conn: Conn, job: uuid.UUID, *, age: float = 0) -> None:
    """The job failed before; the worker takes it up again and it completes with LAST."""
    reopen(conn, job, age=age)
    finish(conn, job, results=LAST, age=age)


async def _clean(database_url: str) -> None:
    """Nothing lost, doubled per finish, clobbered, early, wrong or stale."""
    judged = await judge(database_url, GRACE)
    assert judged.clean, judged


async def test_a_retried_job_gets_its_last_finish_on_the_timer_road(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE) as reactor:
            await start_scans_over(reactor)
            a, run_id = add_job(conn)
            finish(conn, a, status="failed", results=FIRST)
            assert await eventually(lambda: _results(conn, run_id) == FIRST)
            _retry(conn, a)
            assert await eventually(lambda: _results(conn, run_id) == LAST)
            await eventually(lambda: recorded(reactor, "timer") == 2)
            assert await reactor.scan(rearm=True) == 0
        assert run_row(conn, run_id) == (a, "worker")
        assert worker_writes(conn) == [(run_id, a, "INSERT"), (run_id, a, "UPDATE")]
        assert early_writes(conn, GRACE) == 0
        await _clean(database_url)


async def test_a_job_moving_to_another_terminal_value_is_written_again(
    database_url: str, start_reactor: StartReactor
) -> None:
    # complete -> failed in one update: eligible before and after, queued all the same.
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE) as reactor:
            await start_scans_over(reactor)
            a, run_id = add_job(conn)
            finish(conn, a, results=FIRST)
            assert await eventually(lambda: _results(conn, run_id) == FIRST)
            finish(conn, a, status="failed", results=LAST)
            assert scalar(conn, "SELECT count(*) FROM reactor.pending WHERE job_id = %s", (a,))
            assert await eventually(lambda: _results(conn, run_id) == LAST)
        assert worker_writes(conn) == [(run_id, a, "INSERT"), (run_id, a, "UPDATE")]
        await _clean(database_url)


async def test_a_retried_job_gets_its_last_finish_on_the_scan_road(
    database_url: str, database: db.Database
) -> None:
    with _connect(database_url) as conn:
        a, run_id = add_job(conn)
        finish(conn, a, status="failed", results=FIRST, age=10)
        assert [o.outcome for o in await database.record_oldest(10)] == ["recorded"]
        # Written once for this finish: nothing more to do for it.
        assert await database.record_oldest(10) == []
        _retry(conn, a, age=5)
        assert [o.outcome for o in await database.record_oldest(10)] == ["recorded"]
        assert _results(conn, run_id) == LAST
        assert await database.record_oldest(10) == []
        assert await database.record_jobs([str(a)]) == []
        assert worker_writes(conn) == [(run_id, a, "INSERT"), (run_id, a, "UPDATE")]


@pytest.mark.parametrize("queue", ["kept", "lost"])
async def test_a_retry_while_no_reactor_runs_is_written_after_a_restart(
    database_url: str, start_reactor: StartReactor, queue: str
) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE):
            a, run_id = add_job(conn)
            finish(conn, a, status="failed", results=FIRST)
            assert await eventually(lambda: _results(conn, run_id) == FIRST)
        _retry(conn, a)
        if queue == "lost":
            # An unlogged queue after a crash: the reconcile rebuilds it from the job table.
            conn.execute("DELETE FROM reactor.pending")
        # The next replica reads the queue (the trigger's, or the walk's), and writes the last
        # finish.
        async with start_reactor(grace=GRACE, reconcile_interval=1.0):
            assert await eventually(lambda: _results(conn, run_id) == LAST)
        assert worker_writes(conn) == [(run_id, a, "INSERT"), (run_id, a, "UPDATE")]
        await _clean(database_url)


async def test_two_finishes_within_one_grace_are_written_once(
    database_url: str, start_reactor: StartReactor
) -> None:
    grace = 1.0
    with _connect(database_url) as conn:
        async with start_reactor(grace=grace) as reactor:
            await start_scans_over(reactor)
            log = watch_recorder(reactor)
            a, run_id = add_job(conn)
            finish(conn, a, status="failed", results=FIRST)
            _retry(conn, a)
            assert await eventually(lambda: _results(conn, run_id) == LAST)
            await eventually(lambda: log.processed(a))
            assert await reactor.scan(rearm=True) == 0
        assert worker_writes(conn) == [(run_id, a, "INSERT")]
        assert early_writes(conn, grace) == 0


async def test_a_tab_that_saves_within_the_new_grace_wins(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE) as reactor:
            await start_scans_over(reactor)
            log = watch_recorder(reactor)
            a, run_id = add_job(conn)
            finish(conn, a, status="failed", results=FIRST)
            assert await eventually(lambda: _results(conn, run_id) == FIRST)
            batches = len(log.batches)
            _retry(conn, a)
            client_save(conn, a)
            await eventually(lambda: len(log.batches) > batches and log.processed(a))
            assert await reactor.scan(rearm=True) == 0
            # Finished once more: the client's row still stands.
            _retry(conn, a, age=10)
            assert await reactor.scan(rearm=True) == 0
        assert run_row(conn, run_id) == (a, "client")
        assert _results(conn, run_id) == LAST
        assert worker_writes(conn) == [(run_id, a, "INSERT")]


async def test_a_retried_earlier_job_leaves_the_later_jobs_row(
    database_url: str, database: db.Database
) -> None:
    with _connect(database_url) as conn:
        a, run_id = add_job(conn, created_age=EARLIER)
        b, _ = add_job(conn, run_id=run_id)
        finish(conn, a, results=FIRST, age=20)
        finish(conn, b, results=FIRST, age=20)
        assert {o.outcome for o in await database.record_oldest(10)} == {"recorded", "superseded"}
        assert run_row(conn, run_id) == (b, "worker")
        # The earlier job finishes again: the later job still outranks it.
        _retry(conn, a, age=10)
        assert await database.record_oldest(10) == [] or run_row(conn, run_id) == (b, "worker")
        assert await database.record_jobs([str(a)]) == []
        assert run_row(conn, run_id) == (b, "worker")
        assert _results(conn, run_id) == FIRST
        # The later job finishes again: its last finish replaces its earlier one.
        _retry(conn, b, age=10)
        assert [o.outcome for o in await database.record_jobs([str(b)])] == ["recorded"]
        assert run_row(conn, run_id) == (b, "worker")
        assert _results(conn, run_id) == LAST
        assert worker_writes(conn) == [(run_id, b, "INSERT"), (run_id, b, "UPDATE")]


async def test_hooks_run_once_per_finish(database_url: str, start_reactor: StartReactor) -> None:
    hookmods.reset()
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE, hooks="judge=python:tests.hookmods:count") as r:
            await start_scans_over(r)
            a, run_id = add_job(conn)
            finish(conn, a, status="failed", results=FIRST)
            await eventually(lambda: len(hookmods.done) == 1)
            _retry(conn, a)
            assert await eventually(lambda: _results(conn, run_id) == LAST)
            await eventually(lambda: len(hookmods.done) == 2)
            assert await r.scan(rearm=True) == 0
        # One call per finish, each under a key of its own: the first finish's as before.
        assert dict(hookmods.done) == {
            f"{run_id}:{a}:judge": 1,
            f"{run_id}:{a}:judge:1": 1,
        }
        row = conn.execute(
            "SELECT status, finish FROM reactor.hook_outbox WHERE run_id = %s", (run_id,)
        ).fetchall()
        assert row == [("done", 1)]
