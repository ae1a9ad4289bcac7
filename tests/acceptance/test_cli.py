"""The real command line: exit codes, one-line errors, signals, and recovery after kill -9."""

from __future__ import annotations

import json
import signal
import subprocess
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql

from reactor import db
from reactor.db.script import CHECK_BODIES
from tests import pgbouncer as bouncer
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.helpers import Conn, early_writes, finish, new_job, worker_writes
from tests.integration.support import scalar
from tests.integration.test_pgbouncer import server_sessions
from tests.polling import wait_for

Spawn = Callable[..., subprocess.Popen[str]]


def listening(conn: psycopg.Connection[Any], count: int = 1) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'reactor-listener'"
        " AND datname = current_database()"
    ).fetchone()
    return row is not None and row[0] >= count


def assert_one_clean_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_sigterm_drains_and_exits_zero(database_url: str, spawn: Spawn) -> None:
    env = reactor_env(database_url, REACTOR_GRACE_SECONDS="0.3")
    proc = spawn("run", env=env)
    with psycopg.connect(database_url, autocommit=True) as conn:
        wait_for(lambda: listening(conn))
        job_id, _ = new_job(conn)
        finish(conn, job_id)
        wait_for(lambda: worker_writes(conn))
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 0, stderr
        messages = [json.loads(line)["message"] for line in stderr.splitlines()]
        assert "stopped" in messages
        assert not listening(conn)


def kill_9_and_restart(conn: Conn, spawn: Spawn, env: dict[str, str]) -> subprocess.Popen[str]:
    """A reactor is killed inside the grace of ten of thirty jobs, the other twenty finish while
    nobody listens, and another starts: each of the thirty is recorded once, never early (grace
    1 s). Returns the one started last."""
    first = spawn("run", env=env)
    wait_for(lambda: listening(conn))
    jobs = [new_job(conn)[0] for _ in range(30)]
    for job_id in jobs[:10]:
        finish(conn, job_id)
    first.kill()  # inside the grace window of the first ten: their timers die with it
    first.communicate()
    for job_id in jobs[10:]:
        finish(conn, job_id)  # nobody is listening for these
    second = spawn("run", env=env)
    wait_for(lambda: len(worker_writes(conn)) == 30)
    assert len({(run, job) for run, job, _ in worker_writes(conn)}) == 30
    assert early_writes(conn, 1.0) == 0
    return second


def test_kill_9_and_restart_loses_nothing(database_url: str, spawn: Spawn) -> None:
    env = reactor_env(database_url, REACTOR_GRACE_SECONDS="1")
    with psycopg.connect(database_url, autocommit=True) as conn:
        kill_9_and_restart(conn, spawn, env)


def test_sweep_once_prints_the_count(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for _ in range(3):
            finish(conn, new_job(conn)[0])
        result = run_reactor(
            "sweep", "--once", env=reactor_env(database_url, REACTOR_GRACE_SECONDS="0")
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "3"
        assert len(worker_writes(conn)) == 3


def test_sweep_once_repairs_a_restore(database_url: str) -> None:
    # A data-only restore: jobs arrive finished, with every trigger off. One command finds them
    # all and records the due ones; one inside its grace stays queued for the reactors.
    with psycopg.connect(database_url, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            for age in (7200, 7200, 7200, 0):
                job_id, _ = new_job(conn)
                conn.execute(
                    "UPDATE analysis_jobs SET status = 'complete', results = '{\"v\": 1}', "
                    "updated_at = now() - make_interval(secs => %s) WHERE id = %s",
                    (age, job_id),
                )
        result = run_reactor(
            "sweep", "--once", env=reactor_env(database_url, REACTOR_GRACE_SECONDS="60")
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "3"
        assert "found 4 missing from the queue" in result.stderr
        assert "recorded 3 run(s)" in result.stderr
        assert len(worker_writes(conn)) == 3
        row = conn.execute("SELECT count(*) FROM reactor.pending").fetchone()
        assert row == (1,)


def test_migrate_print_is_sql(database_url: str) -> None:
    result = run_reactor(
        "migrate",
        "--print",
        "--reference-schema",
        env=reactor_env(None, REACTOR_CHANNEL="my_channel"),
    )
    assert result.returncode == 0, result.stderr
    # Function bodies are compiled whatever the database sets, then the first transaction.
    assert result.stdout.startswith(f"{CHECK_BODIES}\nBEGIN;")
    assert "CREATE TABLE IF NOT EXISTS analysis_jobs" in result.stdout
    assert "'my_channel'" in result.stdout
    # What follows the script proper is for review: comments only.
    script, reviewed = result.stdout.split("-- For review, not run by this script")
    assert all(line.startswith("--") for line in reviewed.splitlines()[1:])
    lines = script.splitlines()
    # It ends with the walk index, built on its own outside any transaction, as marked.
    marker = lines.index(db.OUTSIDE_TRANSACTION, len(lines) - 12)
    assert lines[marker + 1].startswith("CREATE INDEX CONCURRENTLY IF NOT EXISTS")
    assert "COMMIT;" in lines[marker - 5 : marker]
    assert "reactor sweep --once" in lines[-3]


def test_migrate_print_from_a_version_prints_only_the_upgrade() -> None:
    result = run_reactor("migrate", "--print", "--from", "7", env=reactor_env(None))
    assert result.returncode == 0, result.stderr
    assert "-- 0008_reconcile" in result.stdout
    assert "-- 0007_" not in result.stdout
    assert "CREATE INDEX CONCURRENTLY" in result.stdout
    wrong = run_reactor("migrate", "--from", "7", env=reactor_env(None))
    assert_one_clean_line(wrong, 2)


@pytest.mark.parametrize(
    ("variables", "needle"),
    [
        ({"REACTOR_GRACE_SECONDS": "soon"}, "REACTOR_GRACE_SECONDS"),
        ({"REACTOR_GRACE_SECONDS": "nan"}, "REACTOR_GRACE_SECONDS"),
        ({"REACTOR_BATCH_SIZE": "0"}, "REACTOR_BATCH_SIZE"),
        ({"REACTOR_MODE": "push"}, "REACTOR_MODE"),
        ({"REACTOR_CHANNEL": "bad channel"}, "REACTOR_CHANNEL"),
        ({"REACTOR_LOG_LEVEL": "verbose"}, "REACTOR_LOG_LEVEL"),
        ({"REACTOR_LOG_FORMAT": "xml"}, "REACTOR_LOG_FORMAT"),
    ],
)
def test_bad_setting_is_one_line_exit_2(
    database_url: str, variables: dict[str, str], needle: str
) -> None:
    result = run_reactor("run", env=reactor_env(database_url, **variables))
    assert needle in assert_one_clean_line(result, 2)


@pytest.mark.parametrize(
    "args", [("run",), ("status", "--json"), ("migrate", "--print"), ("hooks", "list")]
)
def test_a_bad_log_level_flag_is_one_line_exit_2_for_every_command(
    database_url: str, args: tuple[str, ...]
) -> None:
    result = run_reactor("--log-level", "verbose", *args, env=reactor_env(database_url))
    line = assert_one_clean_line(result, 2)
    assert "--log-level='verbose' is not a log level" in line
    assert result.stdout == ""


def test_log_levels_are_any_case_and_an_empty_one_is_the_default(database_url: str) -> None:
    for level in ("debug", "WARNING", " "):
        env = reactor_env(database_url, REACTOR_LOG_LEVEL=level)
        assert run_reactor("migrate", "--print", env=env).returncode == 0, level


def test_hooks_leaves_no_session_setting_behind_a_pooler(
    database_url: str, pgbouncer: bouncer.PgBouncer
) -> None:
    # Through a transaction-mode pooler a session setting stays on the server session, and the
    # app's next transaction there runs with it; `reactor status` never sets any, nor may this.
    pooled = pgbouncer.dsn_for(database_url)
    for args in (("hooks", "list"), ("hooks", "retry", "--failed"), ("status", "--json")):
        result = run_reactor(*args, env=reactor_env(pooled))
        assert result.returncode == 0, result.stderr
    for session in server_sessions(pooled):
        assert session["settings"] == [], session


def test_missing_database_url_exit_2() -> None:
    line = assert_one_clean_line(run_reactor("run", env=reactor_env(None)), 2)
    assert "DATABASE_URL" in line


def test_malformed_dsn_exit_2_without_password() -> None:
    env = reactor_env("postgresql://app:s3cret@[::1:5432/x")
    line = assert_one_clean_line(run_reactor("run", env=env), 2)
    assert "s3cret" not in line


# A password holding every character that means something in a URL's authority.
AWKWARD_PASSWORD = "p@ss:w/rd"


@pytest.mark.parametrize("command", ["status", "run"])
@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://u:{AWKWARD_PASSWORD}@127.0.0.1/db",
        "postgresql://u:p@ss@127.0.0.1:1/db?connect_timeout=1",
        f"host=127.0.0.1 port=1 password='{AWKWARD_PASSWORD} dbname=db",
    ],
)
def test_a_dsn_its_password_broke_exit_2_naming_the_fix_and_no_part_of_it(
    command: str, dsn: str
) -> None:
    # Refused before anything connects: the broken URL would have libpq resolve a host named
    # after the password's tail, and say so.
    line = assert_one_clean_line(run_reactor(command, env=reactor_env(dsn)), 2)
    assert "percent-encoded (@ as %40" in line
    for fragment in ("p@ss", "ss:w", "w/rd", "rd", "ss"):
        assert fragment not in line, (fragment, line)


def test_a_dsn_with_its_password_percent_encoded_connects(database_url: str) -> None:
    # The role's name holds them too: a user that decoded wrong would not exist.
    role = f"rx@:/{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(database_url, autocommit=True)
    with admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(AWKWARD_PASSWORD)
            )
        )
        try:
            params = psycopg.conninfo.conninfo_to_dict(database_url)
            host = str(params.get("host") or "127.0.0.1")
            dsn = (
                f"postgresql://{quote(role, safe='')}:{quote(AWKWARD_PASSWORD, safe='')}"
                f"@{quote(host, safe='')}:{params['port']}/{params['dbname']}"
            )
            for encoded in ("%40", "%3A", "%2F"):
                assert encoded in dsn
            result = run_reactor("status", env=reactor_env(dsn))
            assert result.returncode == 0, result.stderr
        finally:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_wrong_password_exit_2_without_password(database_url: str, server: Any) -> None:
    if server.embedded is None:
        pytest.skip("needs a server whose authentication we control")
    dsn = psycopg.conninfo.make_conninfo(database_url, user="nosuchrole", password="s3cret")
    result = run_reactor("run", env=reactor_env(dsn))
    line = assert_one_clean_line(result, 2)
    assert "s3cret" not in line + result.stdout


def test_unreachable_exit_3_without_password() -> None:
    env = reactor_env("postgresql://app:s3cret@127.0.0.1:1/db?connect_timeout=1")
    result = run_reactor("run", env=env, timeout=120)
    line = assert_one_clean_line(result, 3)
    assert "s3cret" not in line


def test_missing_schema_exit_4(empty_database_url: str) -> None:
    line = assert_one_clean_line(run_reactor("run", env=reactor_env(empty_database_url)), 4)
    assert "reactor migrate" in line


def _latest_after_one_of_two_is_killed(
    conn: Conn, spawn: Spawn, env: dict[str, str], where: str
) -> float:
    """Two replicas (grace 0.5 s) run until both listen and both rows of reactor.replicas match
    ``where``; one is killed and forty jobs finish: each is recorded once, never early. Returns
    how long past its grace the latest write came, in seconds."""
    victim = spawn("run", env=env)
    spawn("run", env=env)
    matching = f"SELECT count(*) FROM reactor.replicas WHERE {where}"
    wait_for(lambda: listening(conn, 2) and scalar(conn, matching) == 2)
    victim.kill()
    victim.communicate()
    jobs = [new_job(conn)[0] for _ in range(40)]
    for job_id in jobs:
        finish(conn, job_id)
    wait_for(lambda: len(worker_writes(conn)) == len(jobs))
    assert early_writes(conn, 0.5) == 0
    assert len({(run, job) for run, job, _ in worker_writes(conn)}) == len(jobs)
    late = "SELECT max(extract(epoch FROM a.at - j.updated_at))::float8 - 0.5 "
    late += "FROM run_audit a JOIN analysis_jobs j ON j.id = a.job_id"
    return float(scalar(conn, late))


def test_a_killed_replicas_jobs_are_taken_over_within_the_takeover_delay(
    database_url: str, spawn: Spawn
) -> None:
    # Probes every 0.5 s: a replica is live while its heartbeat is younger than 1.5 s, and the
    # others take its jobs within 2 s of its death.
    env = reactor_env(
        database_url,
        REACTOR_GRACE_SECONDS="0.5",
        REACTOR_PROBE_INTERVAL_SECONDS="0.5",
        REACTOR_PROBE_TIMEOUT_SECONDS="1",
    )
    # Both replicas' heartbeats are live before one dies.
    where = "heartbeat_at > now() - interval '1 second'"
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert _latest_after_one_of_two_is_killed(conn, spawn, env, where) <= 2.0 + 1.0


def test_a_killed_replica_is_dropped_at_the_next_check_not_when_its_heartbeat_ages(
    database_url: str, spawn: Spawn
) -> None:
    # Probes every 2 s: a heartbeat stays live for 6 s, so by heartbeats alone a killed owner's
    # jobs would wait 4 s or more. Its LISTEN session ends with its process, and the heartbeat
    # names that session: the survivor drops it at its next check, within one probe interval.
    probe = 2.0
    env = reactor_env(
        database_url,
        REACTOR_GRACE_SECONDS="0.5",
        REACTOR_PROBE_INTERVAL_SECONDS=str(probe),
        REACTOR_PROBE_TIMEOUT_SECONDS="2",
    )
    # Both heartbeats name their replica's LISTEN session before one dies.
    where = "session_pid IS NOT NULL"
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert _latest_after_one_of_two_is_killed(conn, spawn, env, where) <= probe + 1.0
