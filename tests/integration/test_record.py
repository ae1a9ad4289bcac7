"""The timer path: what gets recorded, when, and what never does.

Every test plays the app on a real PostgreSQL (a worker finishing jobs, a tab saving runs) and
reads the outcome from the database: analysis_runs for the result, run_audit for every write.
"""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import psycopg
import pytest

from reactor import db
from reactor.install import REFERENCE_INSTALL
from reactor.record.recorder import Recorder
from reactor.settings.config import Settings
from reactor.telemetry.metrics import Metrics
from tests.helpers import (
    Conn,
    client_save,
    early_writes,
    finish,
    new_job,
    run_row,
    worker_writes,
)
from tests.integration.conftest import StartReactor
from tests.integration.support import (
    add_job,
    audit,
    hints_heard,
    hints_ignored,
    recorded,
    scalar,
    start_scans_over,
    touch,
    watch_recorder,
    worker_lateness,
)
from tests.polling import eventually

pytestmark = pytest.mark.anyio

GRACE = 0.4
# Far below the 30 s scan interval: a write this close to its deadline came from the timer.
PROMPT = 2.0


def _connect(database_url: str) -> Conn:
    return psycopg.connect(database_url, autocommit=True)


def job_id_key(job_id: uuid.UUID) -> str:
    """The key the reactor's deadlines use for a job."""
    return str(job_id)


async def test_recorded_by_the_timer_right_after_grace(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE) as reactor:
            await start_scans_over(reactor)
            job_id, run_id = new_job(conn)
            finish(conn, job_id)
            row = await eventually(lambda: run_row(conn, run_id))
            assert row == (job_id, "worker")
            # The statement's commit is visible before the reactor has counted it.
            await eventually(lambda: recorded(reactor, "timer") == 1)
            assert recorded(reactor, "scan") == 0
        # By the database clock: never before updated_at + grace, and right after it.
        [lateness] = worker_lateness(conn, GRACE)
        assert 0.0 <= lateness < PROMPT
        assert early_writes(conn, GRACE) == 0
        assert worker_writes(conn) == [(run_id, job_id, "INSERT")]
        stored = conn.execute(
            "SELECT r.doc_html = j.doc_html, r.results = j.results "
            "FROM analysis_runs r JOIN analysis_jobs j ON j.id = r.job_id WHERE r.id = %s",
            (run_id,),
        ).fetchone()
        assert stored == (True, True)


async def test_failed_jobs_are_recorded_too(database_url: str, start_reactor: StartReactor) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE):
            job_id, run_id = new_job(conn)
            finish(conn, job_id, status="failed", results={"error": "timeout"})
            assert await eventually(lambda: run_row(conn, run_id)) == (job_id, "worker")
        assert early_writes(conn, GRACE) == 0


async def test_client_save_inside_grace_means_no_worker_write(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE) as reactor:
            await start_scans_over(reactor)
            log = watch_recorder(reactor)
            job_id, run_id = new_job(conn)
            finish(conn, job_id)
            client_save(conn, job_id)
            # The notification arms a timer; it fires after grace and its statement returns.
            await eventually(lambda: job_id_key(job_id) in reactor.queue or log.processed(job_id))
            await eventually(lambda: log.processed(job_id))
            await eventually(lambda: len(reactor.queue) == 0)
            assert log.rearmed(job_id) == []
            assert worker_writes(conn) == []
            # A later full pass agrees: nothing to write, nothing to arm.
            assert await reactor.scan(rearm=True) == 0
            assert len(reactor.queue) == 0
            assert recorded(reactor, "timer") + recorded(reactor, "scan") == 0
        assert run_row(conn, run_id) == (job_id, "client")
        assert audit(conn) == [("INSERT", run_id, job_id, "client")]


async def test_client_save_after_the_worker_wins(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE) as reactor:
            log = watch_recorder(reactor)
            job_id, run_id = new_job(conn)
            finish(conn, job_id)
            assert await eventually(lambda: run_row(conn, run_id)) == (job_id, "worker")
            client_save(conn, job_id)
            assert run_row(conn, run_id) == (job_id, "client")

            # A later pass does not take it back...
            assert await reactor.scan(rearm=True) == 0
            # ...nor does a later finish of the job (the worker flips its status): queued and
            # notified, its timer finds the client's row, and settles it without a write.
            batches = len(log.batches)
            touch(conn, job_id, status="failed")
            await eventually(lambda: any(str(job_id) in b for b in log.batches[batches:]))
            assert scalar(conn, "SELECT count(*) FROM reactor.pending") == 0
            assert await reactor.scan(rearm=True) == 0
        assert run_row(conn, run_id) == (job_id, "client")
        assert audit(conn) == [
            ("INSERT", run_id, job_id, "worker"),
            ("UPDATE", run_id, job_id, "client"),
        ]


async def test_jobs_that_need_no_run_are_never_written(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE) as reactor:
            log = watch_recorder(reactor)
            wrong: dict[str, uuid.UUID] = {}
            notified: list[uuid.UUID] = []

            # Terminal transitions that notify, but whose job needs no run.
            job_id, _ = new_job(conn)
            with conn.transaction():
                finish(conn, job_id)
                touch(conn, job_id, deleted_at=_now(conn))
            wrong["deleted"] = job_id
            notified.append(job_id)

            job_id, _ = new_job(conn)
            finish(conn, job_id, results={})
            wrong["empty results"] = job_id
            notified.append(job_id)

            job_id, _ = new_job(conn, status="complete", results=None)
            wrong["null results"] = job_id
            notified.append(job_id)

            job_id, _ = new_job(conn, doc_html=None)
            finish(conn, job_id)
            wrong["null doc_html"] = job_id
            notified.append(job_id)

            job_id, _ = new_job(conn)
            finish(conn, job_id, status="failed", results={})
            wrong["failed, empty results"] = job_id
            notified.append(job_id)

            # Not terminal: full of data and long past any grace, but still in the queue.
            for status in ("queued", "running"):
                job_id, _ = add_job(conn, status=status, results={"verdicts": [1]}, age=60)
                wrong[status] = job_id
            # Past its grace and deleted.
            job_id, _ = add_job(conn, status="complete", results={"verdicts": [1]}, age=60)
            touch(conn, job_id, age=60, deleted_at=_now(conn))
            wrong["deleted, old"] = job_id

            # A control, finished last: once it is recorded, every job above is past its grace.
            control, control_run = new_job(conn)
            finish(conn, control)
            assert await eventually(lambda: run_row(conn, control_run)) == (control, "worker")
            # Each notified job was either queued and settled by its timer, or named no queued
            # job and was dropped when its hint was checked.
            await eventually(
                lambda: hints_ignored(reactor) + sum(map(log.processed, notified)) >= len(notified)
            )

            assert await reactor.scan(rearm=True) == 0
            assert len(reactor.queue) == 0
            assert await reactor.scan(rearm=True) == 0

        written = {row[1] for row in worker_writes(conn)}
        for case, job_id in wrong.items():
            assert job_id not in written, f"wrote a run for a job that is {case}"
        assert worker_writes(conn) == [(control_run, control, "INSERT")]
        assert scalar(conn, "SELECT count(*) FROM analysis_runs") == 1


async def test_touched_after_terminal_waits_for_the_new_updated_at(
    database_url: str, start_reactor: StartReactor
) -> None:
    grace = 1.0
    with _connect(database_url) as conn:
        async with start_reactor(grace=grace) as reactor:
            log = watch_recorder(reactor)
            job_id, run_id = new_job(conn)
            finish(conn, job_id)
            # The notification armed the timer for the old updated_at.
            await eventually(lambda: job_id_key(job_id) in reactor.queue)
            deadline = reactor.queue.when(job_id_key(job_id))
            assert deadline is not None
            # The app touches the job in the middle of its grace window: well after the
            # notification (so the timer's first firing is early for the new updated_at), well
            # before that firing. This wait is the scenario's timing, not a synchronisation.
            await anyio.sleep(max(0.0, (deadline - reactor.clock.now()) / 2))
            touch(conn, job_id)
            assert not log.processed(job_id), "the timer fired before the touch"
            touched: Any = scalar(
                conn, "SELECT updated_at FROM analysis_jobs WHERE id = %s", (job_id,)
            )
            assert await eventually(lambda: run_row(conn, run_id)) == (job_id, "worker")
            # The first firing found the job waiting and moved its timer instead of writing.
            delays = log.rearmed(job_id)
            assert len(delays) >= 1
            assert all(0.0 < d <= grace + 0.1 for d in delays)
            await eventually(lambda: recorded(reactor, "timer") == 1)
        written_at = scalar(conn, "SELECT at FROM run_audit WHERE saved_by = 'worker'")
        assert (written_at - touched).total_seconds() >= grace
        [lateness] = worker_lateness(conn, grace)
        assert 0.0 <= lateness < PROMPT
        assert early_writes(conn, grace) == 0


def _now(conn: Conn) -> Any:
    return scalar(conn, "SELECT now()")


async def test_job_inserted_terminal_is_recorded(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE) as reactor:
            job_id, run_id = new_job(conn, status="complete", results={"verdicts": [3]})
            assert await eventually(lambda: run_row(conn, run_id)) == (job_id, "worker")
            await eventually(lambda: recorded(reactor, "timer") == 1)
        assert early_writes(conn, GRACE) == 0


async def test_status_flip_after_recording_is_a_later_finish(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE) as reactor:
            job_id, run_id = new_job(conn)
            finish(conn, job_id)
            assert await eventually(lambda: run_row(conn, run_id)) == (job_id, "worker")
            # A second terminal transition, queued and notified: the job finished again, and
            # its run is written once more from it after its grace.
            touch(conn, job_id, status="failed")
            await eventually(lambda: len(worker_writes(conn)) == 2)
            await eventually(lambda: recorded(reactor, "timer") == 2)
            assert await reactor.scan(rearm=True) == 0
        assert worker_writes(conn) == [(run_id, job_id, "INSERT"), (run_id, job_id, "UPDATE")]
        assert early_writes(conn, GRACE) == 0


async def test_a_touch_after_recording_is_left_to_the_reconcile(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE) as reactor:
            job_id, run_id = new_job(conn)
            finish(conn, job_id)
            assert await eventually(lambda: run_row(conn, run_id)) == (job_id, "worker")
            await eventually(lambda: recorded(reactor, "timer") == 1)
            heard = hints_heard(reactor)
            # No transition: neither queued nor notified, so the app's commit pays nothing for
            # it (the reconcile writes the run again: test_reconcile.py).
            touch(conn, job_id)
            assert scalar(conn, "SELECT count(*) FROM reactor.pending") == 0
            assert await reactor.scan(rearm=True) == 0
            assert hints_heard(reactor) == heard
        assert worker_writes(conn) == [(run_id, job_id, "INSERT")]


async def test_garbage_notifications_are_ignored(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE) as reactor:
            channel = reactor.database.install.channel
            for payload in ("not-a-uuid", "", "x" * 7000, str(uuid.uuid4()) * 2):
                conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))
            # A notification for a job that does not exist arms a timer that finds nothing.
            conn.execute("SELECT pg_notify(%s, %s)", (channel, str(uuid.uuid4()).upper()))
            registry = reactor.metrics.registry
            await eventually(
                lambda: (
                    registry.get_sample_value("reactor_notifications_total", {"result": "rejected"})
                    == 4
                )
            )
            job_id, run_id = new_job(conn)
            finish(conn, job_id)
            assert await eventually(lambda: run_row(conn, run_id)) == (job_id, "worker")
            assert reactor.listener is not None
            assert reactor.listener.connections == 1
        assert worker_writes(conn) == [(run_id, job_id, "INSERT")]


async def test_results_arriving_after_the_transition_are_recorded_by_the_timer(
    database_url: str, start_reactor: StartReactor
) -> None:
    # An app that sets the status first and the results in a later UPDATE: the job becomes
    # eligible on the second update, which queues it and notifies again, so its own timer
    # records it (not the scan, whose interval here is far away).
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE, scan_interval=30.0) as reactor:
            await start_scans_over(reactor)
            job_id, run_id = new_job(conn, status="running")
            touch(conn, job_id, status="complete")  # results still NULL: not queued
            await eventually(lambda: hints_ignored(reactor) >= 1)
            assert run_row(conn, run_id) is None
            touch(conn, job_id, results='{"verdicts": [1]}')
            assert await eventually(lambda: run_row(conn, run_id)) == (job_id, "worker")
            await eventually(lambda: recorded(reactor, "timer") == 1)
            assert recorded(reactor, "scan") == 0
        assert early_writes(conn, GRACE) == 0


async def test_each_timer_settles_its_job_in_the_queue(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE, scan_interval=30.0) as reactor:
            await start_scans_over(reactor)
            timer = watch_recorder(reactor)
            saved, _ = new_job(conn)
            finish(conn, saved)
            client_save(conn, saved)
            recorded_job, run_id = new_job(conn)
            finish(conn, recorded_job)
            new_job(conn)  # running: never queued
            assert scalar(conn, "SELECT count(*) FROM reactor.pending") == 2
            await eventually(lambda: run_row(conn, run_id))
            # The queue holds only what timers have yet to settle: the recorded job leaves it
            # with its run, the one a tab saved when its timer finds it needs none. Neither
            # waits for a scan, which the reactor skips while nothing is overdue.
            await eventually(lambda: scalar(conn, "SELECT count(*) FROM reactor.pending") == 0)
            # The statements' rows are visible before the replica has read their outcomes.
            await eventually(lambda: timer.all_processed([saved, recorded_job]))
            scanned = reactor.metrics.registry.get_sample_value("reactor_scan_rows_total")
            assert scanned == 0


async def test_poll_mode_records_after_grace_without_listen(
    database_url: str, start_reactor: StartReactor
) -> None:
    with _connect(database_url) as conn:
        async with start_reactor(grace=GRACE, mode="poll", scan_interval=0.5) as reactor:
            assert reactor.listener is None
            job_id, run_id = new_job(conn)
            finish(conn, job_id)
            assert await eventually(lambda: run_row(conn, run_id)) == (job_id, "worker")
            listeners = scalar(
                conn,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = 'reactor-listener'",
            )
            assert listeners == 0
        [lateness] = worker_lateness(conn, GRACE)
        # The poll arms a timer for the upcoming deadline: on time, not a scan late.
        assert 0.0 <= lateness < 0.5 + PROMPT
        assert early_writes(conn, GRACE) == 0


async def test_the_timer_aims_at_updated_at_plus_grace_by_the_database_clock(
    database_url: str, start_reactor: StartReactor
) -> None:
    # The app's transaction set updated_at 0.4 s before it committed: a timer armed at receipt
    # plus grace would write 0.4 s late. Aimed by the database clock, it writes on time.
    grace = 0.6
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(grace=grace, probe_interval=0.2, probe_timeout=0.5) as reactor:
            await eventually(lambda: reactor.db_clock.local(0.0) is not None)
            job_id, run_id = new_job(conn)
            conn.execute(
                "UPDATE analysis_jobs SET status = 'complete', results = '{\"v\": 1}', "
                "updated_at = now() - interval '0.4 seconds' WHERE id = %s",
                (job_id,),
            )
            await eventually(lambda: run_row(conn, run_id) is not None)
        [late] = worker_lateness(conn, grace)
        assert 0 <= late < 0.2


async def test_a_job_due_on_arrival_is_claimed_at_once_by_one_statement(
    database_url: str, start_reactor: StartReactor
) -> None:
    # At grace 0 the deadline has passed when the notification arrives: the job takes the work
    # queue's road like any other, and is claimed by one statement with nothing to retry.
    with _connect(database_url) as conn:
        # A probe interval and timeout the test cannot outlast: a LISTEN reconnect (a probe late
        # under load) asks for a re-arm scan, which at grace 0 would claim the job too.
        async with start_reactor(grace=0.0, probe_interval=10.0, probe_timeout=10.0) as reactor:
            # Startup's scans are over: the one at start, the re-arm LISTEN asked for, and the
            # retry of either if it failed (a failed scan is pending until its retry ran; that
            # retry, unseen by this wait, could claim the job first). Not polling either.
            await eventually(
                lambda: (
                    reactor.listener is not None
                    and reactor.listener.checking
                    and not reactor.polling
                    and not reactor.scan_pending
                )
            )
            log = watch_recorder(reactor)
            job_id, run_id = new_job(conn)
            finish(conn, job_id)
            assert await eventually(lambda: run_row(conn, run_id)) == (job_id, "worker")
            await eventually(lambda: log.processed(job_id))
            assert log.batches == [[str(job_id)]]
            assert log.rearms == [[]]
            assert recorded(reactor, "timer") == 1
            assert recorded(reactor, "scan") == 0


@pytest.mark.parametrize("road", ["timer", "scan"])
async def test_one_batch_isolates_a_held_row_and_sets_aside_a_rejected_one(
    database_url: str, road: str
) -> None:
    # The timer's claim and the scan write by one road: one split-and-isolate finds both kinds
    # of bad row in the same batch, and writes every other job.
    with _connect(database_url) as app, psycopg.connect(database_url) as tab:
        app.execute(
            "ALTER TABLE analysis_runs ADD CONSTRAINT no_flagged CHECK (NOT results ? 'flagged')"
        )
        rejected, _ = add_job(app, status="complete", results={"flagged": True}, age=60)
        held, held_run = add_job(app, status="complete", results={"ok": -1}, age=45)
        good = [add_job(app, status="complete", results={"ok": i}, age=30)[0] for i in range(20)]
        # A tab saving the held job's run, in a transaction it does not commit.
        tab.execute(
            "INSERT INTO analysis_runs (id, job_id, doc_html, results, saved_by) "
            "VALUES (%s, %s, '<p>tab</p>', '{}', 'client')",
            (held_run, held),
        )
        async with db.make_pool(database_url, max_size=4) as pool:
            recorder = Recorder(db.Database.pooled(REFERENCE_INSTALL, pool), Metrics())
            recorder.batch_lock_timeout = 0.2
            if road == "timer":
                answer = await recorder.record([str(job) for job in [rejected, held, *good]])
                assert answer.stuck == {str(held)}
                assert answer.retry == [(str(held), 0.0)]  # again at once, alone
            else:
                drained = await recorder.drain(batch_size=500)
                assert (drained.recorded, drained.stuck) == (20, [str(held)])
                assert str(rejected) in drained.settled
        assert set(recorder.set_aside) == {str(rejected)}
        assert scalar(app, "SELECT job_id FROM reactor.set_aside") == rejected
        assert {job for _, job, _ in worker_writes(app)} == set(good)
        tab.rollback()


async def test_a_drain_remembers_its_last_settled_jobs_newest_last(database_url: str) -> None:
    """The operator's page lists the last jobs settled: a drain of more than it keeps leaves
    the newest of them, oldest first, each with how late it was recorded."""
    with _connect(database_url) as app:
        jobs = [add_job(app, status="complete", results={"v": i}, age=60 - i)[0] for i in range(30)]
        async with db.make_pool(database_url, max_size=2) as pool:
            recorder = Recorder(
                db.Database.pooled(REFERENCE_INSTALL, pool, settings=Settings(grace=1.0)), Metrics()
            )
            drained = await recorder.drain(batch_size=500)
    assert drained.recorded == 30
    kept = list(recorder.recent)
    assert [s.job_id for s in kept] == [str(job) for job in jobs[-20:]]
    assert {s.outcome for s in kept} == {"recorded"}
    # Job i was last updated 60 - i seconds ago: recorded about 59 - i seconds past its grace.
    for i, settled in enumerate(kept, start=10):
        assert settled.lateness is not None
        assert abs(settled.lateness - (59 - i)) < 1.0
