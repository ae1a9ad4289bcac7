"""``reactor status``: the numbers it reports, and exit 1 exactly when something is at risk.

The command runs as a subprocess, as an operator or a cron job would run it. The judging of a
snapshot (:func:`reactor.status.risks`) is also checked directly for what a test database
cannot easily show, like a full NOTIFY queue.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from reactor import db, status
from reactor.install import REFERENCE_INSTALL, sql
from reactor.install.mapping import REFERENCE
from reactor.settings.config import Settings
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.helpers import APP
from tests.integration.support import add_job

RESULTS = {"verdicts": [1]}


def run_status(database_url: str, *args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    """``reactor status ARGS`` with a 5 s grace and a one-hour trim horizon unless overridden."""
    env = reactor_env(
        database_url,
        **{
            "REACTOR_GRACE_SECONDS": "5",
            "REACTOR_TRIM_HORIZON_SECONDS": "3600",
            **variables,
        },
    )
    return run_reactor("status", *args, env=env)


def status_json(database_url: str, **variables: str) -> tuple[int, dict[str, Any]]:
    result = run_status(database_url, "--json", **variables)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def has_outbox(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT to_regclass('reactor.hook_outbox') IS NOT NULL").fetchone()
    return bool(row and row[0])


@pytest.fixture
def conn(database_url: str) -> Any:
    with psycopg.connect(database_url, autocommit=True) as connection:
        yield connection


def test_clean_database_exits_zero(database_url: str, conn: psycopg.Connection[Any]) -> None:
    code, report = status_json(database_url)
    assert code == 0, report
    assert report["at_risk"] is False
    assert report["risks"] == []
    assert report["jobs"] == {
        "due": 0,
        "in_grace": 0,
        "grace_seconds": 5.0,
        "own_grace_seconds": None,
        "oldest_due": None,
        "trim_horizon_seconds": 3600.0,
        "at_risk": False,
    }
    assert report["schema"] == {
        "version": sql.latest_version(),
        "required": sql.latest_version(),
        "behind": False,
        "mapping_changed": False,
    }
    assert report["listeners"] == {"mode": "listen", "count": 0, "sessions": []}
    assert 0.0 <= report["notify_queue"]["usage"] < 0.5
    assert report["notify_queue"]["at_risk"] is False
    datetime.fromisoformat(report["checked_at"])


def test_counts_due_and_in_grace(database_url: str, conn: psycopg.Connection[Any]) -> None:
    due = [add_job(conn, status="complete", results=RESULTS, age=60)[0] for _ in range(3)]
    oldest, _ = add_job(conn, status="failed", results=RESULTS, age=120)
    for _ in range(2):
        add_job(conn, status="complete", results=RESULTS, age=0)  # inside the 5 s grace
    # None of these needs a run: not terminal, empty results, no document, or recorded.
    add_job(conn, status="running", results=RESULTS, age=60)
    add_job(conn, status="complete", results={}, age=60)
    add_job(conn, status="complete", results=RESULTS, doc_html=None, age=60)
    saved, run_id = add_job(conn, status="complete", results=RESULTS, age=60)
    conn.execute(
        "INSERT INTO analysis_runs (id, job_id, results, saved_by) VALUES (%s, %s, '{}', 'client')",
        (run_id, saved),
    )

    # Poll mode: due jobs without a LISTEN session are expected there, so nothing is at risk.
    code, report = status_json(database_url, REACTOR_MODE="poll")
    assert code == 0, report
    jobs = report["jobs"]
    assert (jobs["due"], jobs["in_grace"]) == (len(due) + 1, 2)
    assert jobs["oldest_due"]["job_id"] == str(oldest)
    assert 119 < jobs["oldest_due"]["age_seconds"] < 180
    assert jobs["at_risk"] is False
    assert report["listeners"]["mode"] == "poll"

    # Listen mode: due jobs and nobody LISTENing is a risk.
    code, report = status_json(database_url)
    assert code == 1
    assert report["at_risk"] is True
    assert len(report["risks"]) == 1
    assert "no reactor is LISTENing" in report["risks"][0]


@pytest.mark.anyio
async def test_a_retried_job_counts_until_its_last_finish_is_written(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    retried, _ = add_job(conn, status="failed", results=RESULTS, age=120)
    add_job(conn, status="complete", results=RESULTS, age=120)
    async with db.make_pool(database_url, max_size=2) as pool:
        database = db.Database.pooled(REFERENCE_INSTALL, pool, settings=Settings(grace=5.0))
        assert len(await database.record_oldest(10)) == 2
        _, report = status_json(database_url, REACTOR_MODE="poll")
        assert (report["jobs"]["due"], report["jobs"]["in_grace"]) == (0, 0)
        # Retried, and finished again a minute ago: its run holds the earlier finish.
        conn.execute(*APP.reopen(retried, age=60))
        conn.execute(*APP.finish(retried, verdicts='{"verdicts": [2]}', age=60))
        _, report = status_json(database_url, REACTOR_MODE="poll")
        assert (report["jobs"]["due"], report["jobs"]["in_grace"]) == (1, 0)
        assert report["jobs"]["oldest_due"]["job_id"] == str(retried)
        assert [o.outcome for o in await database.record_oldest(10)] == ["recorded"]
    _, report = status_json(database_url, REACTOR_MODE="poll")
    assert report["jobs"]["due"] == 0


def test_listener_sessions_are_listed(database_url: str, conn: psycopg.Connection[Any]) -> None:
    add_job(conn, status="complete", results=RESULTS, age=60)
    listener_dsn = psycopg.conninfo.make_conninfo(
        database_url, application_name=db.LISTENER_APPLICATION_NAME
    )
    with psycopg.connect(listener_dsn, autocommit=True) as listener:
        listener.execute("LISTEN analysis_jobs_terminal")
        code, report = status_json(database_url)
    assert code == 0, report
    assert report["listeners"]["count"] == 1
    (session,) = report["listeners"]["sessions"]
    assert session["client_addr"] in ("127.0.0.1", "::1", None)
    assert session["backend_start"] is not None
    assert isinstance(session["pid"], int)


def test_oldest_job_past_half_the_horizon_is_at_risk(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    job_id, _ = add_job(conn, status="complete", results=RESULTS)
    conn.execute(
        "UPDATE analysis_jobs SET updated_at = now() - interval '1 hour' WHERE id = %s", (job_id,)
    )
    code, report = status_json(database_url, REACTOR_MODE="poll")
    assert code == 1
    assert report["jobs"]["at_risk"] is True
    assert report["jobs"]["oldest_due"]["job_id"] == str(job_id)
    assert report["jobs"]["oldest_due"]["age_seconds"] >= 3600
    assert any("trim horizon" in risk for risk in report["risks"])

    # The same job under a horizon twice as long is not yet past half of it.
    code, report = status_json(
        database_url, REACTOR_MODE="poll", REACTOR_TRIM_HORIZON_SECONDS="7300"
    )
    assert code == 0, report
    assert report["jobs"]["at_risk"] is False


def test_parked_hook_failure_is_at_risk(database_url: str, conn: psycopg.Connection[Any]) -> None:
    if not has_outbox(conn):
        pytest.skip("the hook outbox migration is not in this tree")
    run_id, job_id = uuid.uuid4(), uuid.uuid4()
    conn.execute(
        """
        INSERT INTO reactor.hook_outbox (run_id, job_id, hook, status, attempts, last_error)
        VALUES (%s, %s, 'judge', 'failed', 8, 'HTTP 500 from http://judge/\nsecond line'),
               (%s, %s, 'ops', 'pending', 0, NULL),
               (%s, %s, 'ops', 'done', 1, NULL)
        """,
        (run_id, job_id, run_id, job_id, uuid.uuid4(), job_id),
    )
    code, report = status_json(database_url)
    assert code == 1
    hooks = report["hooks"]
    assert hooks["outbox"] is True
    assert (hooks["pending"], hooks["running"], hooks["backlog"], hooks["failed"]) == (1, 0, 1, 1)
    assert hooks["oldest_backlog_age_seconds"] >= 0
    (failure,) = hooks["recent_failures"]
    assert failure["hook"] == "judge"
    assert failure["run_id"] == str(run_id)
    assert failure["attempts"] == 8
    assert report["risks"] == [
        "1 hook call(s) failed for good and are parked: `reactor hooks list --failed` shows "
        "them, `reactor hooks retry --failed` re-queues them"
    ]
    assert isinstance(failure["id"], int)


def test_missing_outbox_reports_null(database_url: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("DROP TABLE IF EXISTS reactor.hook_outbox CASCADE")
    code, report = status_json(database_url)
    assert code == 0, report
    assert report["hooks"] == {
        "outbox": False,
        "pending": None,
        "running": None,
        "backlog": None,
        "failed": None,
        "oldest_backlog_age_seconds": None,
        "recent_failures": [],
    }


def test_before_the_pending_queue_counts_from_the_jobs(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    add_job(conn, status="complete", results=RESULTS, age=60)
    add_job(conn, status="complete", results=RESULTS, age=0)
    # As a schema from before the queue: the jobs are there, the queue is not.
    conn.execute("DROP TABLE IF EXISTS reactor.pending CASCADE")
    code, report = status_json(database_url, REACTOR_MODE="poll")
    assert code == 0, report
    assert (report["jobs"]["due"], report["jobs"]["in_grace"]) == (1, 1)


def test_schema_behind_is_at_risk(database_url: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("DELETE FROM reactor.schema_version WHERE version = %s", (sql.latest_version(),))
    code, report = status_json(database_url)
    assert code == 1
    assert report["schema"]["behind"] is True
    assert report["schema"]["version"] == sql.migrations()[-2].version
    assert any("reactor migrate" in risk for risk in report["risks"])


def test_human_output(database_url: str, conn: psycopg.Connection[Any]) -> None:
    add_job(conn, status="complete", results=RESULTS, age=60)
    result = run_status(database_url)
    assert result.returncode == 1, result.stderr
    for needle in ("jobs needing a run", "1 due", "LISTEN sessions", "NOTIFY queue", "AT RISK"):
        assert needle in result.stdout
    assert result.stderr == ""


def test_missing_schema_is_one_line_exit_4(empty_database_url: str) -> None:
    result = run_status(empty_database_url, "--json")
    assert result.returncode == 4, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""


def test_unreachable_is_one_line_exit_3() -> None:
    result = run_status("postgresql://app:s3cret@127.0.0.1:1/db?connect_timeout=1", "--json")
    assert result.returncode == 3, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "s3cret" not in result.stderr


def snapshot(**changes: Any) -> status.Status:
    clean = status.Status(
        checked_at=datetime.now(UTC),
        grace=120.0,
        trim_horizon=86400.0,
        mode="listen",
        due=0,
        in_grace=0,
        oldest_job_id=None,
        oldest_age=None,
        hooks=status.Hooks(outbox=True, pending=0, running=0, failed=0),
        listeners=(),
        schema_version=sql.latest_version(),
        required_version=sql.latest_version(),
        queue_usage=0.0,
        trigger_channel="analysis_jobs_terminal",
        trigger_enabled=True,
    )
    return replace(clean, **changes)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"queue_usage": 0.5}, "NOTIFY queue is 50% full"),
        ({"oldest_age": 43201.0, "oldest_job_id": "j", "due": 1, "mode": "poll"}, "trim horizon"),
        ({"schema_version": sql.latest_version() - 1}, "reactor migrate"),
        ({"hooks": status.Hooks(outbox=True, pending=0, running=0, failed=2)}, "2 hook call"),
        ({"due": 1}, "no reactor is LISTENing"),
        ({"trigger_channel": None}, "job trigger on analysis_jobs is missing"),
        ({"trigger_enabled": False}, "job trigger on analysis_jobs is disabled"),
    ],
)
def test_each_risk(changes: dict[str, Any], needle: str) -> None:
    (risk,) = status.risks(snapshot(**changes))
    assert needle in risk
    assert status.as_json(snapshot(**changes))["at_risk"] is True


def test_no_risk_at_the_edges() -> None:
    assert status.risks(snapshot()) == []
    assert status.risks(snapshot(queue_usage=0.49)) == []
    assert status.risks(snapshot(oldest_age=43200.0, oldest_job_id="j", due=1, mode="poll")) == []
    assert status.risks(snapshot(hooks=status.Hooks(outbox=False))) == []
    assert status.risks(snapshot(schema_version=sql.latest_version() + 1)) == []


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (0.5, "0.5s"),
        (5.0, "5s"),
        (120.0, "2m"),
        (3725.0, "1h 2m 5s"),
        (90000, "1d 1h"),
    ],
)
def test_duration(seconds: float, text: str) -> None:
    assert status.duration(seconds) == text


def test_drift_found_by_the_last_pass_is_at_risk(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    code, report = status_json(database_url)
    assert code == 0, report["risks"]
    assert report["reconcile"]["last_pass"]["by"].startswith("install")
    # Jobs finished behind the triggers' back, then a pass finds them.
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        job, _ = add_job(conn, status="complete", results=RESULTS, age=60)
    sweep = run_reactor("sweep", "--once", env=reactor_env(database_url, REACTOR_GRACE_SECONDS="5"))
    assert sweep.returncode == 0, sweep.stderr
    code, report = status_json(database_url)
    assert code == 1
    assert report["reconcile"]["drift"] == 1
    assert report["reconcile"]["last_pass"]["example_job_id"] == str(job)
    assert report["reconcile"]["at_risk"] is True
    assert any("missing from the pending queue" in risk for risk in report["risks"])
    # The next pass finds nothing: the alarm clears by itself.
    sweep = run_reactor("sweep", "--once", env=reactor_env(database_url, REACTOR_GRACE_SECONDS="5"))
    assert sweep.returncode == 0, sweep.stderr
    code, report = status_json(database_url)
    assert code == 0, report["risks"]
    assert report["reconcile"]["last_pass"]["found"] == 0


def test_no_pass_within_twice_the_interval_is_at_risk(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    conn.execute(
        "UPDATE reactor.reconcile SET last_finished_at = now() - interval '21 minutes', "
        "last_started_at = now() - interval '22 minutes'"
    )
    code, report = status_json(database_url)
    assert code == 1
    assert report["reconcile"]["overdue"] is True
    assert any("no full reconcile pass ended" in risk for risk in report["risks"])
    # With the reconcile turned off, nobody owes a pass.
    code, report = status_json(database_url, REACTOR_RECONCILE_INTERVAL_SECONDS="0")
    assert code == 0, report["risks"]
    human = run_status(database_url)
    assert "reconcile" in human.stdout


@pytest.mark.anyio
async def test_the_job_trigger_as_migrate_installed_it(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    settings = Settings(database_url=database_url)

    async def trigger() -> dict[str, Any]:
        async with await db.connect(database_url, "status", configure_session=False) as c:
            collected = await status.collect(c, REFERENCE_INSTALL, settings)
            report: dict[str, Any] = status.as_json(collected)
        return report

    async def migrate(notify: bool | None) -> None:
        async with await db.connect(database_url, "migrate") as c:
            await db.migrate(c, REFERENCE, channel=settings.channel, notify=notify)

    notifying = {
        "installed": True,
        "enabled": True,
        "channel": "analysis_jobs_terminal",
        "notifies": True,
        "spread": False,
        "doorbell_awake_seconds": None,
        "at_risk": False,
    }
    assert (await trigger())["trigger"] == notifying
    # A replica keeps the doorbell awake: status says for how long, and what it means.
    conn.execute(
        "INSERT INTO reactor.doorbell VALUES ('analysis_jobs_terminal', now() + interval '1 hour')"
    )
    awake = (await trigger())["trigger"]["doorbell_awake_seconds"]
    assert 3500 < awake <= 3600
    assert "doorbell awake 59m" in run_status(database_url).stdout
    conn.execute("UPDATE reactor.doorbell SET awake_until = now() - interval '1 second'")
    assert (await trigger())["trigger"] == notifying
    # --spread is kept by a plain migrate too, and --no-spread undoes it.
    assert run_reactor("migrate", "--spread", env=reactor_env(database_url)).returncode == 0
    assert (await trigger())["trigger"] == {**notifying, "spread": True}
    await migrate(None)
    assert (await trigger())["trigger"] == {**notifying, "spread": True}
    assert run_reactor("migrate", "--no-spread", env=reactor_env(database_url)).returncode == 0
    assert (await trigger())["trigger"] == notifying
    assert run_reactor("migrate", "--no-notify", env=reactor_env(database_url)).returncode == 0
    quiet = {**notifying, "channel": "", "notifies": False}
    assert (await trigger())["trigger"] == quiet
    # A plain migrate (an upgrade, say) keeps the choice; notify=True turns it back.
    await migrate(None)
    assert (await trigger())["trigger"] == quiet
    conn.execute("ALTER TABLE analysis_jobs DISABLE TRIGGER reactor_job_update")
    report = await trigger()
    assert report["trigger"] == {**quiet, "enabled": False, "at_risk": True}
    assert "job trigger on analysis_jobs is disabled" in report["risks"][0]
    await migrate(True)
    assert (await trigger())["trigger"] == notifying
    conn.execute("DROP TRIGGER reactor_job_update ON analysis_jobs")
    code, report = status_json(database_url)
    missing = {
        "installed": False,
        "enabled": False,
        "channel": None,
        "notifies": False,
        "spread": False,
        "doorbell_awake_seconds": None,
    }
    assert (code, report["trigger"]) == (1, {**missing, "at_risk": True})
