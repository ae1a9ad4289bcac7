"""A job whose run can never be written costs only itself.

The app's own CHECK, NOT NULL, foreign key or trigger on analysis_runs may reject the row a
job's run would be. Such a job must not head every batch and fail it: it is split down to, set
aside in reactor.set_aside with its error, shown by status and the metrics, and every other job
is recorded as if it did not exist. It is tried again later, at once when the app touches it,
and after `reactor sweep --once` or `reactor migrate`.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest

from reactor import db, status
from reactor.install import REFERENCE_INSTALL
from reactor.record.recorder import Recorder
from reactor.settings.config import Settings
from reactor.telemetry.metrics import Metrics
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.helpers import Conn
from tests.integration.conftest import StartReactor
from tests.integration.support import add_job, scalar, touch
from tests.polling import eventually

pytestmark = pytest.mark.anyio

GRACE = 0.5
# The app's own rule on its artifact table, which the reactor knows nothing of.
REJECT_FLAGGED = (
    "ALTER TABLE analysis_runs ADD CONSTRAINT no_flagged CHECK (NOT results ? 'flagged')"
)


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[db.Database]:
    async with db.make_pool(database_url, max_size=2) as pool:
        yield db.Database.pooled(REFERENCE_INSTALL, pool, settings=Settings(grace=GRACE))


def _backlog(conn: Conn, good: int, bad: int) -> list[uuid.UUID]:
    """``bad`` due jobs the app's constraint rejects, oldest first, then ``good`` due ones."""
    bad_jobs = [
        add_job(conn, status="complete", results={"flagged": True}, age=60 - i)[0]
        for i in range(bad)
    ]
    for i in range(good):
        add_job(conn, status="complete", results={"ok": i}, age=30)
    return bad_jobs


def _set_aside(conn: Conn) -> dict[uuid.UUID, str]:
    rows = conn.execute("SELECT job_id, error FROM reactor.set_aside").fetchall()
    return {row[0]: row[1] for row in rows}


async def test_jobs_rejected_by_the_app_are_set_aside_and_the_rest_recorded(
    database_url: str, database: db.Database
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(REJECT_FLAGGED)
        bad = _backlog(conn, good=42, bad=3)
    metrics = Metrics()
    recorder = Recorder(database, metrics)

    assert (await recorder.drain(batch_size=500)).recorded == 42
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert scalar(conn, "SELECT count(*) FROM analysis_runs") == 42
        held = _set_aside(conn)
        assert set(held) == set(bad)
        assert all("no_flagged" in error for error in held.values())
        # Still queued: set aside is not dropped.
        assert scalar(conn, "SELECT count(*) FROM reactor.pending") == 3
    assert metrics.registry.get_sample_value("reactor_jobs_set_aside_total") == 3

    # The next scan leaves them out instead of failing on them again.
    assert (await recorder.drain(batch_size=500)).recorded == 0
    assert metrics.registry.get_sample_value("reactor_jobs_set_aside_total") == 3

    # status names them as a risk the moment they are set aside, not at the trim horizon.
    async with await db.connect(database_url, "test") as conn:
        report = await status.collect(conn, REFERENCE_INSTALL, Settings(grace=GRACE))
    assert report.set_aside_count == 3
    assert report.oldest_job_id is not None
    found = status.risks(report)
    assert any("3 job(s) cannot be written" in risk and "no_flagged" in risk for risk in found)
    assert status.as_json(report)["set_aside"]["at_risk"] is True

    # The app fixes its data: a job it touches is new data, tried at once (past its grace).
    with psycopg.connect(database_url, autocommit=True) as conn:
        touch(conn, bad[0], age=10, results='{"fixed": true}')
    assert (await recorder.drain(batch_size=500)).recorded == 1
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert set(_set_aside(conn)) == set(bad[1:])

    # The app fixes its rule instead: an operator's sweep tries the rest now.
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE analysis_runs DROP CONSTRAINT no_flagged")
    assert await database.release_set_aside() == 2
    assert (await recorder.drain(batch_size=500)).recorded == 2
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert _set_aside(conn) == {}
        assert scalar(conn, "SELECT count(*) FROM analysis_runs") == 45


async def test_a_job_set_aside_is_tried_again_on_its_schedule(
    database_url: str, database: db.Database
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(REJECT_FLAGGED)
        (job,) = _backlog(conn, good=0, bad=1)
    recorder = Recorder(database, Metrics())
    await recorder.drain(batch_size=10)
    with psycopg.connect(database_url, autocommit=True) as conn:
        first = conn.execute(
            "SELECT failures, retry_at - last_failed_at FROM reactor.set_aside"
        ).fetchone()
        # Its retry comes due: it fails again, and waits twice as long.
        conn.execute("UPDATE reactor.set_aside SET retry_at = now()")
    await recorder.drain(batch_size=10)
    with psycopg.connect(database_url, autocommit=True) as conn:
        second = conn.execute(
            "SELECT failures, retry_at - last_failed_at FROM reactor.set_aside WHERE job_id = %s",
            (job,),
        ).fetchone()
    assert first is not None
    assert second is not None
    assert (first[0], second[0]) == (1, 2)
    assert second[1] == 2 * first[1]


async def test_an_artifact_column_added_under_a_running_reactor_sets_its_jobs_aside(
    database_url: str, start_reactor: StartReactor
) -> None:
    # A NOT NULL column nothing fills is named before anything runs (tests/acceptance/
    # test_mapping_checks.py). One the app adds while a reactor runs is met at the write: every
    # job is set aside with the error, and the next command's check names the fix.
    async with start_reactor(grace=GRACE) as reactor:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE analysis_runs ADD COLUMN owner_id uuid NOT NULL")
            jobs = {add_job(conn, status="complete", results={"ok": i})[0] for i in range(3)}
            await eventually(lambda: set(_set_aside(conn)) == jobs)
            errors = conn.execute("SELECT DISTINCT error FROM reactor.set_aside").fetchall()
            assert len(errors) == 1
            assert 'null value in column "owner_id"' in errors[0][0]
        assert reactor.recorder.set_aside
    reported = run_reactor("status", env=reactor_env(database_url))
    assert reported.returncode == 2, reported.stderr
    assert "owner_id" in reported.stderr
    assert "[runs.columns]" in reported.stderr


async def test_a_running_reactor_sets_a_rejected_job_aside_and_records_the_next(
    database_url: str, start_reactor: StartReactor
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(REJECT_FLAGGED)
        async with start_reactor(grace=0.3) as reactor:
            bad, _ = add_job(conn, status="complete", results={"flagged": True})
            _, good_run = add_job(conn, status="complete", results={"ok": 1})

            def settled() -> bool:
                held = set(_set_aside(conn))
                written = scalar(
                    conn, "SELECT count(*) FROM analysis_runs WHERE id = %s", (good_run,)
                )
                return held == {bad} and written == 1

            await eventually(settled)
            sample = reactor.metrics.registry.get_sample_value
            await eventually(lambda: sample("reactor_set_aside_jobs") == 1)


async def test_a_table_that_is_gone_is_said_once_not_at_every_statement(
    database: db.Database, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder(database, Metrics())
    with psycopg.connect(database_url, autocommit=True) as conn:
        jobs = [
            str(add_job(conn, status="complete", results={"ok": i}, age=30)[0]) for i in range(3)
        ]
        conn.execute("ALTER TABLE analysis_runs RENAME TO analysis_runs_away")
        caplog.set_level("DEBUG", logger="reactor.record.recorder")
        delays = []
        for job in jobs:
            answer = await recorder.record([job])
            assert [job_id for job_id, _ in answer.retry] == [job]
            delays.append(answer.retry[0][1])
        failed = [r for r in caplog.records if r.getMessage() == "record failed, will retry"]
        assert [r.levelname for r in failed] == ["WARNING", "DEBUG", "DEBUG"]
        # Each failure in a row puts the jobs off longer: the pair's backlog does not cycle.
        assert delays == [1.0, 2.0, 4.0]
        conn.execute("ALTER TABLE analysis_runs_away RENAME TO analysis_runs")
        caplog.clear()
        await recorder.record(jobs)
        said = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
        assert said.count("record statements succeed again") == 1
        assert scalar(conn, "SELECT count(*) FROM analysis_runs") == 3
        # Repaired, a later failure starts from the short retry again.
        conn.execute("ALTER TABLE analysis_runs RENAME TO analysis_runs_away")
        try:
            job = str(add_job(conn, status="complete", results={"ok": 9}, age=30)[0])
            answer = await recorder.record([job])
            assert answer.retry == [(job, 1.0)]
        finally:
            conn.execute("ALTER TABLE analysis_runs_away RENAME TO analysis_runs")
