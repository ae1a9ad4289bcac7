"""Several job/artifact pairs served by one `reactor run`: the reference pair and the second
mapping's, in one database, each recording its own jobs; a pair whose tables are broken costs
only itself."""

from __future__ import annotations

import json
import signal
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.acceptance.conftest import reactor_env, run_reactor
from tests.acceptance.test_cli import listening
from tests.helpers import finish, new_job, worker_writes
from tests.polling import wait_for
from tests.ports import free_port, http_get

Spawn = Callable[..., subprocess.Popen[str]]
MAPPINGS = Path(__file__).parent.parent / "mappings"
REPORTS = "reactor_reports"


@pytest.fixture
def two_pairs(database_url: str, tmp_path: Path) -> str:
    """REACTOR_CONFIG for the reference pair and the second mapping's, both installed."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute((MAPPINGS / "second.sql").read_text())
    reference = tmp_path / "analysis.toml"
    reference.write_text('reactor_schema = "reactor"\n')
    reports = tmp_path / "reports.toml"
    reports.write_text(
        f'reactor_schema = "{REPORTS}"\n'
        + (MAPPINGS / "second.toml").read_text()
        + "\n[reactor]\ngrace = 0.4\n"
    )
    config = f"{reference}:{reports}"
    migrated = run_reactor("migrate", env=reactor_env(database_url, REACTOR_CONFIG=config))
    assert migrated.returncode == 0, migrated.stderr
    assert f"{REPORTS}: applied migrations" in migrated.stdout
    assert "reactor: schema is up to date" in migrated.stdout
    return config


def add_report_job(conn: psycopg.Connection[Any], key: str) -> None:
    conn.execute(
        'INSERT INTO app."Job" ("reportKey", state, html, verdicts, "ownerId", "createdAt",'
        ' "updatedAt")'
        " VALUES (%s, 'done', '<p/>', '[\"ok\"]', gen_random_uuid(), now() AT TIME ZONE 'UTC',"
        " now() AT TIME ZONE 'UTC')",
        (key,),
    )


def a_job_for_each_pair_once_listening(
    conn: psycopg.Connection[Any], proc: subprocess.Popen[str]
) -> uuid.UUID:
    """Once the reactor process listens (and has not exited), a job finishes in each pair: the
    reference pair's job id."""
    wait_for(lambda: listening(conn) or proc.poll() is not None, what="a listener")
    assert proc.poll() is None
    job_id, _ = new_job(conn)
    finish(conn, job_id)
    add_report_job(conn, "quarterly")
    return job_id


def reports(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute('SELECT count(*) FROM app."Report" WHERE origin = %s', ("system",))
    return int(row.fetchone()[0])  # type: ignore[index]


def listener_sessions(conn: psycopg.Connection[Any]) -> set[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'reactor-listener'"
        " AND datname = current_database()"
    ).fetchall()
    return {pid for (pid,) in rows}


def heartbeat_sessions(conn: psycopg.Connection[Any], *schemas: str) -> set[int]:
    """The sessions the heartbeats of ``schemas`` name; empty until each names one."""
    named: set[int] = set()
    for schema in schemas:
        rows = conn.execute(
            f"SELECT session_pid FROM {schema}.replicas WHERE session_pid IS NOT NULL"
        ).fetchall()
        if not rows:
            return set()
        named.update(pid for (pid,) in rows)
    return named


def heartbeat_at(conn: psycopg.Connection[Any], schema: str) -> Any:
    row = conn.execute(f"SELECT max(heartbeat_at) FROM {schema}.replicas").fetchone()
    assert row is not None
    return row[0]


def test_one_process_serves_two_pairs(database_url: str, two_pairs: str, spawn: Spawn) -> None:
    port, page = free_port(), free_port()
    env = reactor_env(
        database_url,
        REACTOR_CONFIG=two_pairs,
        REACTOR_GRACE_SECONDS="0.3",
        REACTOR_HTTP_ADDR=f"127.0.0.1:{port}",
        REACTOR_DASHBOARD_ADDR=f"127.0.0.1:{page}",
    )
    proc = spawn("run", env=env)
    with psycopg.connect(database_url, autocommit=True) as conn:
        a_job_for_each_pair_once_listening(conn, proc)
        wait_for(lambda: worker_writes(conn) and reports(conn) == 1, what="both pairs record")
        assert len(worker_writes(conn)) == 1

        assert wait_for(lambda: http_get(port, "/readyz")[0] == 200, what="ready")
        # One LISTEN session serves both pairs, and one check on it beats for both.
        assert listener_sessions(conn) == heartbeat_sessions(conn, "reactor", REPORTS)
        assert len(listener_sessions(conn)) == 1
        _, metrics = http_get(port, "/metrics")
        assert 'reactor_runs_recorded_total{pair="reactor",source="timer"} 1.0' in metrics
        assert f'reactor_runs_recorded_total{{pair="{REPORTS}",source="timer"}} 1.0' in metrics

        shown = run_reactor("status", "--json", env=env)
        document = json.loads(shown.stdout)
        assert set(document["pairs"]) == {"reactor", REPORTS}
        assert document["pairs"][REPORTS]["trigger"]["channel"] == f"{REPORTS}_jobs_terminal"
        assert document["pairs"][REPORTS]["jobs"]["grace_seconds"] == 0.4

        # The page shows one pair at a time, the first by default, and links to the other.
        status, first = http_get(page, "/")
        assert status == 200
        assert f'href="/?pair={REPORTS}"' in first
        assert '<b aria-current="page">reactor</b>' in first
        status, body = http_get(page, f"/api/status?pair={REPORTS}")
        assert status == 200
        shown = json.loads(body)
        assert (shown["pair"], shown["pairs"]) == (REPORTS, ["reactor", REPORTS])
        assert shown["trigger"]["channel"] == f"{REPORTS}_jobs_terminal"
        assert shown["replica"]["ready"]
        assert http_get(page, "/api/status?pair=nope")[0] == 404

        unnamed = run_reactor("hooks", "list", env=env)
        assert unnamed.returncode == 2
        assert f"--pair reactor | {REPORTS}" in unnamed.stderr
        named = run_reactor("hooks", "--pair", REPORTS, "list", "--json", env=env)
        assert named.returncode == 0, named.stderr

        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    lines = [json.loads(line) for line in stderr.splitlines()]
    assert {line.get("pair") for line in lines if line["message"] == "stopped"} == {
        "reactor",
        REPORTS,
    }


def test_a_broken_pair_costs_only_itself(
    database_url: str, two_pairs: str, tmp_path: Path, spawn: Spawn
) -> None:
    gone = tmp_path / "gone.toml"
    gone.write_text(
        'reactor_schema = "reactor_gone"\n'
        '[jobs]\ntable = "app.Gone"\n[runs]\ntable = "app.GoneRuns"\n'
    )
    port = free_port()
    env = reactor_env(
        database_url,
        REACTOR_CONFIG=f"{two_pairs}:{gone}",
        REACTOR_GRACE_SECONDS="0.3",
        REACTOR_HTTP_ADDR=f"127.0.0.1:{port}",
    )
    # The commands that read every pair report the broken one, and serve the others.
    shown = run_reactor("status", "--json", env=env)
    assert shown.returncode == 1, shown.stderr
    document = json.loads(shown.stdout)
    assert document["verdict"]["state"] == "at risk"
    assert document["verdict"]["reason"].startswith("pair reactor_gone: not served:")
    assert document["pairs"][REPORTS]["trigger"]["installed"]
    with psycopg.connect(database_url, autocommit=True) as conn:
        add_report_job(conn, "swept")
        conn.execute('UPDATE app."Job" SET "updatedAt" = "updatedAt" - interval \'1 hour\'')
    swept = run_reactor("sweep", "--once", env=env)
    assert swept.returncode == 2, swept.stderr
    assert swept.stdout.strip() == "1"
    assert "pair reactor_gone: not swept:" in swept.stderr

    proc = spawn("run", env=env)
    with psycopg.connect(database_url, autocommit=True) as conn:
        wait_for(
            lambda: heartbeat_sessions(conn, "reactor", REPORTS) or proc.poll() is not None,
            what="both pairs beat on the LISTEN session",
        )
        assert proc.poll() is None
        session = listener_sessions(conn)
        # Left out at start, and said so where an orchestrator looks.
        status, body = http_get(port, "/readyz")
        assert status == 503
        assert "pair reactor_gone: not served" in json.loads(body)["reason"]

        # Broken while it runs: the second pair's artifact table and its reactor schema's
        # tables are dropped, so its every statement fails. The others record, and their
        # LISTEN session and its checks go on.
        conn.execute('DROP TABLE app."Report"')
        conn.execute(f"DROP SCHEMA {REPORTS} CASCADE")
        add_report_job(conn, "lost")
        beat = heartbeat_at(conn, "reactor")
        job_id, _ = new_job(conn)
        finish(conn, job_id)
        wait_for(lambda: worker_writes(conn), what="the reference pair records")
        wait_for(lambda: heartbeat_at(conn, "reactor") > beat, what="the reference pair beats")
        assert listener_sessions(conn) == session
        assert heartbeat_sessions(conn, "reactor") == session
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    left_out = [json.loads(line) for line in stderr.splitlines() if "pair not served" in line]
    assert [line["pair"] for line in left_out] == ["reactor_gone"]
    assert "app.Gone" in left_out[0]["error"] or "Gone" in left_out[0]["error"]
