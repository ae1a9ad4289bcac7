"""A stuck row costs only itself: a run row held by an open client transaction, or a batch too
heavy for one statement, never stalls the jobs around it.

The stuck row is a tab's save of a run that is not committed yet: the reactor's upsert of that
run must wait for it, and used to make the whole batch wait with it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import replace

import anyio
import psycopg
import pytest

from reactor import db
from reactor.claim.dispatch import Answer
from reactor.install import REFERENCE_INSTALL
from reactor.record.recorder import Recorder, split
from reactor.telemetry.metrics import Metrics
from tests.faults.tables import RESULTS
from tests.helpers import TABLES, Conn, run_row, worker_writes
from tests.integration.conftest import StartReactor
from tests.integration.support import app_and_a_tab, scalar
from tests.polling import eventually

pytestmark = pytest.mark.anyio


def add_due_jobs(conn: Conn, count: int, *, doc_bytes: int = 16) -> list[tuple[str, str]]:
    """``count`` finished jobs, past any grace, oldest first (an hour ago, a millisecond apart):
    [(job id, run id)]."""
    jobs = []
    # One transaction: one now(), from which each job is a millisecond younger than the last.
    with conn.transaction():
        for n in range(count):
            age = 3600 - n / 1000
            job, run = TABLES.add_job(
                conn,
                finished=True,
                doc="x" * doc_bytes,
                results=RESULTS,
                created_age=age,
                updated_age=age,
            )
            jobs.append((str(job), str(run)))
    return jobs


def hold_run_row(tab: Conn, job_id: str) -> None:
    """A tab saving the job's run in a transaction it does not commit (yet)."""
    TABLES.client_save(tab, job_id)


@contextmanager
def one_run_row_held(
    database_url: str, count: int, held: int
) -> Iterator[tuple[Conn, Conn, list[tuple[str, str]], tuple[str, str]]]:
    """``count`` due jobs (:func:`add_due_jobs`) on the app's connection, and the run row of
    the ``held``-th held by a tab's transaction: (app, tab, the jobs, the held one)."""
    with app_and_a_tab(database_url) as (app, tab):
        jobs = add_due_jobs(app, count)
        hold_run_row(tab, jobs[held][0])
        yield app, tab, jobs, jobs[held]


def written(conn: Conn) -> set[str]:
    return {str(job) for _, job, _ in worker_writes(conn)}


async def test_one_locked_run_row_among_a_thousand_due_jobs(
    database_url: str, start_reactor: StartReactor
) -> None:
    scan_interval = 10.0
    # The oldest held: in the scan's first batch.
    with one_run_row_held(database_url, 1000, 0) as (app, tab, _, (stuck_job, stuck_run)):
        started = time.monotonic()
        async with start_reactor(grace=1.0, scan_interval=scan_interval) as reactor:
            await eventually(lambda: len(written(app)) >= 999, timeout=scan_interval)
            took = time.monotonic() - started
            assert stuck_job not in written(app)
            # The scan hands it to the work queue when its pass ends.
            await eventually(lambda: reactor.queue.stuck == {stuck_job}, timeout=scan_interval)
            metrics = reactor.metrics.registry
            assert metrics.get_sample_value("reactor_stuck_jobs") == 1
            assert (metrics.get_sample_value("reactor_record_timeouts_total") or 0) >= 1

            # The tab gives up; the job's own statement is waiting on that lock.
            tab.rollback()
            released = time.monotonic()
            await eventually(lambda: run_row(app, uuid.UUID(stuck_run)), timeout=5)
            waited = time.monotonic() - released
            assert run_row(app, uuid.UUID(stuck_run)) == (uuid.UUID(stuck_job), "worker")
            await eventually(lambda: not reactor.queue.stuck, timeout=5)
        assert len(worker_writes(app)) == 1000
    assert took < scan_interval
    # As soon as the lock goes: not a retry, not a scan later.
    assert waited < 1.0, waited


@pytest.fixture
async def recorder(database_url: str) -> AsyncIterator[Recorder]:
    """A recorder on its own database handle, no service around it."""
    async with db.make_pool(database_url, max_size=4) as pool:
        recorder = Recorder(db.Database.pooled(REFERENCE_INSTALL, pool), Metrics())
        recorder.batch_lock_timeout = 0.2
        yield recorder


async def test_a_timer_batch_splits_around_a_locked_run_row(
    database_url: str, recorder: Recorder
) -> None:
    # Long enough that the waits, not the statements, make the time.
    recorder.batch_lock_timeout = 1.0
    with one_run_row_held(database_url, 40, 17) as (app, tab, jobs, (stuck_job, _)):
        started = time.monotonic()
        answer = await recorder.record([job for job, _ in jobs])
        # Found behind the lock after the batch's wait and two short ones (its part of five,
        # then alone), and tried again at once, alone.
        assert answer == Answer([(stuck_job, 0.0)], frozenset({stuck_job}))
        assert time.monotonic() - started < 2 * recorder.batch_lock_timeout
        assert written(app) == {job for job, _ in jobs} - {stuck_job}
        tab.rollback()
        # Alone now, it waits for the lock as long as the usual lock timeout allows.
        assert await recorder.record([stuck_job], alone=True) == Answer([])
        assert stuck_job in written(app)


async def test_a_cancelled_batch_is_split_like_a_lock_timeout(
    database_url: str, recorder: Recorder
) -> None:
    # A statement timeout surfaces as QueryCanceled, as this cancel does: the batch is split
    # and only the job behind the lock is left for later.
    recorder.batch_lock_timeout = 30.0
    with one_run_row_held(database_url, 10, 3) as (app, tab, jobs, (stuck_job, _)):

        async def cancel_waits() -> None:
            # The batch of ten, then its part of two, then the stuck job alone: each waits on
            # the lock until cancelled.
            for cancels in range(1, 4):
                pid = await eventually(lambda: lock_waiter(app), timeout=10)
                app.execute("SELECT pg_cancel_backend(%s)", (pid,))
                await eventually(
                    lambda: timeouts() >= cancels,  # noqa: B023 -- awaited in this turn
                    timeout=10,
                )

        def timeouts() -> float:
            registry = recorder.metrics.registry
            return registry.get_sample_value("reactor_record_timeouts_total") or 0.0

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_waits)
            answer = await recorder.record([job for job, _ in jobs])
        assert [job for job, _ in answer.retry] == [stuck_job]
        assert answer.stuck == {stuck_job}
        assert written(app) == {job for job, _ in jobs} - {stuck_job}
        tab.rollback()


def lock_waiter(conn: Conn) -> int | None:
    """The pid of a reactor pool session waiting on a lock, if any."""
    row = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'reactor-pool' "
        "AND datname = current_database() AND wait_event_type = 'Lock' LIMIT 1"
    ).fetchone()
    return None if row is None else int(row[0])


async def test_the_scan_caps_a_batch_by_document_bytes(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as app:
        jobs = add_due_jobs(app, 10, doc_bytes=1000)
        async with db.make_pool(database_url, max_size=2) as pool:
            database = replace(db.Database.pooled(REFERENCE_INSTALL, pool), batch_bytes=2500)
            first = await database.record_oldest(100)
            outcomes = [o.outcome for o in first]
            # Three documents fit under the cap (the third starts below it); the rest wait.
            assert outcomes == ["recorded"] * 3 + ["deferred"] * 7
            assert [o.job_id for o in first] == [job for job, _ in jobs]
            assert written(app) == {job for job, _ in jobs[:3]}
            assert scalar(app, "SELECT count(*) FROM reactor.pending") == 7

            # The drain goes on past a batch cut by bytes, not only past a full one.
            assert (await Recorder(database, Metrics()).drain(100)).recorded == 7
            assert len(written(app)) == 10

            # A document larger than the cap still goes, alone.
            (big, _), *_ = add_due_jobs(app, 2, doc_bytes=5000)
            alone = await database.record_oldest(100)
            assert [(o.job_id, o.outcome) for o in alone] == [
                (big, "recorded"),
                (alone[1].job_id, "deferred"),
            ]


def test_split_keeps_order_and_covers_everything() -> None:
    items = [str(i) for i in range(19)]
    parts = split(items, 8)
    assert len(parts) == 8
    assert [x for part in parts for x in part] == items
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert split(["a", "b"], 8) == [["a"], ["b"]]
    assert split([], 8) == []
