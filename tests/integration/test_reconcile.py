"""Self-healing: every road around the pending queue, and how the reactor comes back from it.

Each test takes one road that bypasses the queue, runs a real reactor, and ends with the
database's own verdict: lost = dup = clobbered = early = stale = wrong = 0. Roads a trigger can
close are checked with the reconcile turned off, so the trigger alone must have done it; the rest
need the reconcile, which runs every second here.
"""

from __future__ import annotations

import json
import random
import uuid

import anyio
import psycopg
import pytest

from reactor import db
from reactor.install import REFERENCE_INSTALL, sql
from reactor.install.mapping import REFERENCE
from tests.faults.support import judge
from tests.helpers import APP, Conn, client_save, new_job, run_row
from tests.integration.conftest import StartReactor
from tests.integration.support import scalar
from tests.polling import eventually

pytestmark = pytest.mark.anyio

GRACE = 0.3
# What the worker finishes a job with here.
VERDICTS = '{"v": 1}'
# Short enough that a test waits for a pass rather than for its timeout.
RECONCILE = 1.0


def _connect(dsn: str) -> Conn:
    return psycopg.connect(dsn, autocommit=True)


def _queued(conn: Conn, job_id: uuid.UUID) -> bool:
    return bool(scalar(conn, "SELECT count(*) FROM reactor.pending WHERE job_id = %s", (job_id,)))


async def _clean(dsn: str) -> None:
    """Wait until no job needs a run any more, in grace or not; then nothing may be broken."""
    for _ in range(300):
        # Judged with no grace, "lost" counts every job that still needs a run.
        if (await judge(dsn, 0.0)).verdict.lost == 0:
            break
        await anyio.sleep(0.05)
    result = await judge(dsn, GRACE)
    assert result.clean, result


def _finished(conn: Conn, count: int) -> list[uuid.UUID]:
    """``count`` jobs the worker has just finished, each of a run of its own."""
    return [new_job(conn, status="complete", results={"v": 1})[0] for _ in range(count)]


def _finish_bypassing_triggers(conn: Conn, count: int) -> list[uuid.UUID]:
    """Finish jobs as a data-only restore or a replication apply worker does: no triggers."""
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        return _finished(conn, count)


def _two_jobs_of_one_run(conn: Conn) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
    """(older, newer, run): two finished jobs of one run, past their grace."""
    older, run = new_job(conn, status="complete", results={"v": 1}, age=10)
    newer, _ = new_job(conn, run_id=run, status="complete", results={"v": 2}, age=5)
    return older, newer, run


# -- roads only the reconcile can see ---------------------------------------------------------


async def test_jobs_finished_with_triggers_bypassed_are_recorded(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        # Before the reactor starts, so that only the triggers could have queued them.
        jobs = _finish_bypassing_triggers(conn, 16)
        assert not any(_queued(conn, j) for j in jobs)
        async with start_reactor(grace=GRACE, reconcile_interval=RECONCILE) as reactor:
            await _clean(database_url)
            assert all(run_row(conn, r) is not None for r in _runs(conn, jobs))
            found = reactor.metrics.registry.get_sample_value("reactor_reconcile_found_total")
            assert found == 16


async def test_jobs_finished_while_the_trigger_is_disabled_are_recorded(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        conn.execute("ALTER TABLE analysis_jobs DISABLE TRIGGER reactor_job_insert")
        try:
            jobs = _finished(conn, 5)
        finally:
            conn.execute("ALTER TABLE analysis_jobs ENABLE TRIGGER reactor_job_insert")
        assert not any(_queued(conn, j) for j in jobs)
        async with start_reactor(grace=GRACE, reconcile_interval=RECONCILE):
            await _clean(database_url)


async def test_queue_rows_deleted_by_hand_are_found_again(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        jobs = _finished(conn, 5)
        conn.execute("DELETE FROM reactor.pending")
        async with start_reactor(grace=GRACE, reconcile_interval=RECONCILE):
            await _clean(database_url)
        assert all(not _queued(conn, j) for j in jobs)


async def test_a_found_job_keeps_its_whole_grace(
    database_url: str, start_reactor: StartReactor
) -> None:
    # Long enough that even a loaded machine's first pass finds the job inside its grace.
    grace = 5.0
    with _connect(database_url) as conn:
        async with start_reactor(grace=grace, reconcile_interval=0.2) as reactor:
            [job] = _finish_bypassing_triggers(conn, 1)
            # Found well inside its grace: armed, not written, until updated_at + grace.
            await eventually(lambda: str(job) in reactor.queue)
            assert scalar(conn, "SELECT count(*) FROM analysis_runs") == 0
            await eventually(lambda: scalar(conn, "SELECT count(*) FROM analysis_runs") == 1)
        result = await judge(database_url, grace)
        assert result.clean, result


async def test_truncated_runs_are_written_again(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        # The interval is long: the TRUNCATE itself must ask for the pass.
        async with start_reactor(grace=GRACE, reconcile_interval=3600):
            jobs = _finished(conn, 4)
            await eventually(lambda: scalar(conn, "SELECT count(*) FROM analysis_runs") == 4)
            conn.execute("TRUNCATE analysis_runs")
            assert scalar(conn, "SELECT requested_at IS NOT NULL FROM reactor.reconcile")
            await eventually(lambda: scalar(conn, "SELECT count(*) FROM analysis_runs") == 4)
        assert not any(_queued(conn, j) for j in jobs)
        await _clean(database_url)


async def test_a_retry_with_triggers_bypassed_gets_its_last_finish(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE, reconcile_interval=RECONCILE) as reactor:
            [job] = _finished(conn, 1)
            [run] = _runs(conn, [job])
            await eventually(lambda: _verdicts(conn, run) == {"v": 1})
            # Retried and finished again as a restore or a replication apply writes it: no
            # trigger queues it, and only the walk can tell the row holds an earlier finish.
            with conn.transaction():
                conn.execute("SET LOCAL session_replication_role = replica")
                conn.execute(*APP.reopen(job))
                conn.execute(*APP.finish(job, verdicts='{"v": 2}'))
            assert not _queued(conn, job)
            await eventually(lambda: _verdicts(conn, run) == {"v": 2})
            found = reactor.metrics.registry.get_sample_value("reactor_reconcile_found_total")
            assert (found or 0) >= 1
        assert scalar(conn, "SELECT count(*) FROM run_audit WHERE saved_by = 'worker'") == 2
        await _clean(database_url)


async def test_a_touch_of_a_recorded_job_is_written_once_more_by_the_reconcile(
    database_url: str, start_reactor: StartReactor
) -> None:
    # A touch is not told apart from a finish by the tables: the job's updated_at moved since
    # its run was written. The trigger leaves it (no transition); the walk writes it once.
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE, reconcile_interval=RECONCILE):
            [job] = _finished(conn, 1)
            await eventually(lambda: scalar(conn, "SELECT count(*) FROM analysis_runs") == 1)
            conn.execute(*APP.touch(job))
            assert not _queued(conn, job)
            await eventually(
                lambda: (
                    scalar(conn, "SELECT count(*) FROM run_audit WHERE saved_by = 'worker'") == 2
                )
            )
            await _clean(database_url)
            # Once: the row stands for the job as it is now.
            passes = scalar(conn, "SELECT pass FROM reactor.reconcile")
            await eventually(lambda: scalar(conn, "SELECT pass FROM reactor.reconcile") > passes)
        assert scalar(conn, "SELECT count(*) FROM run_audit WHERE saved_by = 'worker'") == 2


# -- roads the triggers close at once ---------------------------------------------------------


async def test_a_deleted_run_is_written_again(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE, reconcile_interval=0):
            jobs = _finished(conn, 5)
            await eventually(lambda: scalar(conn, "SELECT count(*) FROM analysis_runs") == 5)
            with conn.transaction():
                conn.execute("DELETE FROM analysis_runs")
                # Queued by the trigger, in the deleting transaction itself.
                assert all(_queued(conn, job) for job in jobs)
            await eventually(lambda: scalar(conn, "SELECT count(*) FROM analysis_runs") == 5)
        # Written twice each, but once per life of the row: not a duplicate.
        assert (await judge(database_url, GRACE)).clean
        assert scalar(conn, "SELECT count(*) FROM run_audit WHERE op = 'INSERT'") == 10


async def test_a_run_row_moved_to_an_older_job_brings_the_newer_one_back(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        older, newer, run = _two_jobs_of_one_run(conn)
        client_save(conn, newer)
        conn.execute("DELETE FROM reactor.pending")
        async with start_reactor(grace=GRACE, reconcile_interval=0):
            # The app rewrites the row as a worker row of the older job: the newer job needs
            # its run again (rule (b)), and the trigger queued it in that same statement.
            with conn.transaction():
                conn.execute(
                    "UPDATE analysis_runs SET saved_by = 'worker', job_id = %s WHERE id = %s",
                    (older, run),
                )
                assert _queued(conn, newer)
            await eventually(lambda: run_row(conn, run) == (newer, "worker"))
        # The app's own rewrite counts as a worker write in the audit (and as landing on its
        # client row); the reactor's is the one after it.
        verdict = (await judge(database_url, GRACE)).verdict
        assert (verdict.lost, verdict.dup, verdict.early, verdict.wrong) == (0, 0, 0, 0)


async def test_deleting_the_job_a_worker_row_stands_for_brings_back_the_earlier_one(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        older, newer, run = _two_jobs_of_one_run(conn)
        async with start_reactor(grace=GRACE, reconcile_interval=0):
            await eventually(lambda: run_row(conn, run) == (newer, "worker"))
            with conn.transaction():
                conn.execute(*APP.delete(newer))
                assert _queued(conn, older)
            await eventually(lambda: run_row(conn, run) == (older, "worker"))
        assert (await judge(database_url, GRACE)).clean


async def test_an_app_before_trigger_that_sets_status_is_seen(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        # The app completes a job in its own BEFORE trigger once the results are in, on an
        # update that names none of the columns the reactor's trigger looks at.
        conn.execute(
            """
            CREATE FUNCTION app_complete() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.results IS NOT NULL THEN NEW.status := 'complete'; END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER app_complete BEFORE UPDATE ON analysis_jobs
                FOR EACH ROW EXECUTE FUNCTION app_complete();
            """
        )
        job, run = new_job(conn, status="running")
        conn.execute(
            "UPDATE analysis_jobs SET results = %s WHERE id = %s", (json.dumps({"v": 1}), job)
        )
        async with start_reactor(grace=GRACE, reconcile_interval=0):
            with conn.transaction():
                conn.execute(*APP.touch(job))
                status = scalar(conn, "SELECT status FROM analysis_jobs WHERE id = %s", (job,))
                assert status == "complete"
                assert _queued(conn, job)
            await eventually(lambda: run_row(conn, run) is not None)
        assert (await judge(database_url, GRACE)).clean


async def test_a_client_save_does_not_queue_anything(database_url: str) -> None:
    # The common path stays cheap: a tab's save, first or again, leaves the queue alone.
    with _connect(database_url) as conn:
        job, _ = new_job(conn, status="complete", results={"v": 1}, age=10)
        conn.execute("DELETE FROM reactor.pending")
        client_save(conn, job)
        client_save(conn, job)
        assert not _queued(conn, job)


# -- the NOTIFY is only a hint ----------------------------------------------------------------


async def test_the_trigger_skips_the_notify_past_the_queue_limit(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn, _connect(database_url) as listener:
        listener.execute("LISTEN analysis_jobs_terminal")
        conn.execute("SET reactor.notify_queue_limit = '0'")
        job, run = new_job(conn, status="complete", results={"v": 1})
        assert _queued(conn, job)
        assert list(listener.notifies(timeout=0.2)) == []
        conn.execute("RESET reactor.notify_queue_limit")
        other, _ = new_job(conn, status="complete", results={"v": 1})
        [note] = list(listener.notifies(timeout=1, stop_after=1))
        assert note.payload.startswith(f"{other}@")
        # The reactor finds the silent one through the queue.
        async with start_reactor(grace=GRACE, scan_interval=0.2, reconcile_interval=0):
            await eventually(lambda: run_row(conn, run) is not None)


# -- one pass at a time, shared by the replicas -----------------------------------------------


async def test_a_pass_walks_in_chunks_and_counts_what_it_found(database_url: str) -> None:
    with _connect(database_url) as conn:
        _finished(conn, 5)
        conn.execute("DELETE FROM reactor.pending")
        async with await db.connect(database_url, "test") as aconn:
            steps = []
            queries = db.Database.dedicated(REFERENCE_INSTALL, aconn)
            step = await queries.reconcile_step(owner="a", interval=60, force=True)
            steps.append(step)
            while step.outcome == "stepped":
                step = await queries.reconcile_step(owner="a", interval=60, limit=2)
                steps.append(step)
            assert [s.outcome for s in steps][-1] == "completed"
            assert sum(len(s.found) for s in steps) == 5
            # Another replica finds it not due; the owner of a pass in progress holds it.
            idle = await queries.reconcile_step(owner="b", interval=60)
            assert idle.outcome == "idle"
            assert idle.next_in is not None
            assert idle.next_in > 50
            await queries.reconcile_step(owner="a", interval=60, force=True, limit=2)
            busy = await queries.reconcile_step(owner="b", interval=60, limit=2)
            assert busy.outcome == "busy"
            assert busy.next_in is not None
            assert busy.next_in > 20
            last = await queries.last_reconcile_pass()
            assert (last.found, last.examined) == (5, 5)
            assert last.example is not None


async def test_two_replicas_share_one_pass(database_url: str, start_reactor: StartReactor) -> None:
    with _connect(database_url) as conn:
        jobs = _finish_bypassing_triggers(conn, 30)
        async with (
            start_reactor(grace=GRACE, reconcile_interval=RECONCILE) as first,
            start_reactor(grace=GRACE, reconcile_interval=RECONCILE) as second,
        ):
            await _clean(database_url)
            found = [
                r.metrics.registry.get_sample_value("reactor_reconcile_found_total") or 0
                for r in (first, second)
            ]
            # Each job was found once, by one replica or the other.
            assert sum(found) == len(jobs)


def _verdicts(conn: Conn, run: uuid.UUID) -> object:
    """The run's verdicts; None while it has no row."""
    row = conn.execute("SELECT results FROM analysis_runs WHERE id = %s", (run,)).fetchone()
    return None if row is None else row[0]


def _runs(conn: Conn, jobs: list[uuid.UUID]) -> list[uuid.UUID]:
    return [scalar(conn, *APP.run_of(job)) for job in jobs]


# -- no install window ------------------------------------------------------------------------


async def test_jobs_finishing_during_migrate_are_all_queued(empty_database_url: str) -> None:
    # An app with history: 100,000 finished jobs, a third of them without their run. Every
    # migration, the index build and the walk run while the worker keeps finishing jobs.
    dsn = empty_database_url
    with _connect(dsn) as conn:
        conn.execute(sql.read("reference.sql"))
        history = APP.create(count=100_000, finished=True, verdicts=VERDICTS)
        jobs = [job for job, _ in conn.execute(*history).fetchall()]
        conn.execute(*APP.tab_save(*(job for job in jobs if random.random() < 0.67)))
    finished = 0
    stop = anyio.Event()

    async def app() -> None:
        # The worker keeps finishing jobs before, during and after the install: each job is
        # created running and finished by a second commit, as a real worker does.
        nonlocal finished
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            while not stop.is_set():
                created = await aconn.execute(*APP.create())
                [(job, _)] = await created.fetchall()
                await aconn.execute(*APP.finish(job, verdicts=VERDICTS))
                finished += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(app)
        await eventually(lambda: finished >= 50)
        async with await db.connect(dsn, "test") as aconn:
            await db.migrate(aconn, REFERENCE)
        before = finished
        await eventually(lambda: finished >= before + 50)
        stop.set()
    with _connect(dsn) as conn:
        assert scalar(conn, "SELECT count(*) FROM analysis_jobs") == finished + 100_000
        unqueued = scalar(
            conn,
            "SELECT count(*) FROM analysis_jobs j "
            "WHERE NOT EXISTS (SELECT 1 FROM analysis_runs r WHERE r.id = j.run_id) "
            "AND NOT EXISTS (SELECT 1 FROM reactor.pending p WHERE p.job_id = j.id)",
        )
        assert unqueued == 0
        # The pass found what history owed; it ran on install, so none of it counts as drift.
        last = scalar(conn, "SELECT last_owner FROM reactor.reconcile")
        assert last.startswith("install")
