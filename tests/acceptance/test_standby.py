"""The command line pointed at a read-only hot standby, and at several hosts.

Every command needs the primary: on a standby each says so in one line naming the fix and exits
3 (``run`` after its startup attempts, which a standby being promoted meanwhile passes; the
others at once). A multi-host DSN with ``target_session_attrs=read-write``, in either form,
finds the primary wherever it is in the list.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from reactor.demo.embedded import EmbeddedPostgres
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.acceptance.test_cli import assert_one_clean_line
from tests.conftest import Server
from tests.faults.support import Replicas, connect, host_port, listeners, scalar
from tests.helpers import finish, new_job, worker_writes
from tests.polling import wait_for
from tests.standby import caught_up, embedded_of, multi_host, on, standby_of

RETRY_LINE = "the database is a read-only hot standby; trying again in case it is being promoted"


def split_output(stderr: str) -> tuple[list[str], list[str]]:
    """(what the default log level shows, the messages of the debug records) of stderr."""
    shown, debug = [], []
    for line in stderr.strip().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict) and record.get("level") == "debug":
            debug.append(str(record.get("message")))
        else:
            shown.append(line)
    return shown, debug


def assert_names_the_fix(line: str, port: int) -> None:
    assert f"127.0.0.1:{port}" in line, line
    assert "read-only hot standby" in line, line
    assert "primary" in line, line
    assert "target_session_attrs=read-write" in line, line


COMMANDS = [
    ("migrate",),
    ("migrate", "--reference-schema"),
    ("sweep", "--once"),
    ("status",),
    ("hooks", "list"),
    ("hooks", "retry", "--failed"),
    ("hooks", "cancel", "1"),
]


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_every_command_on_a_standby_is_one_line_exit_3_at_once(
    standby_url: str, standby: EmbeddedPostgres, args: tuple[str, ...]
) -> None:
    # Debug records are left out of what is judged: they show that no attempt was repeated.
    result = run_reactor(*args, env=reactor_env(standby_url, REACTOR_LOG_LEVEL="debug"))
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    shown, debug = split_output(result.stderr)
    assert len(shown) == 1, result.stderr
    assert shown[0].startswith("reactor: ")
    assert_names_the_fix(shown[0], standby.port)
    assert RETRY_LINE not in debug
    assert result.stdout == ""


def test_status_json_on_a_standby_reports_the_risk_and_exits_3(
    standby_url: str, standby: EmbeddedPostgres
) -> None:
    result = run_reactor("status", "--json", env=reactor_env(standby_url))
    line = assert_one_clean_line(result, 3)
    assert_names_the_fix(line, standby.port)
    report = json.loads(result.stdout)
    assert report["standby"] is True
    assert report["at_risk"] is True
    assert "read-only hot standby" in report["risks"][0]
    # The rest of the report is the standby's view, as of its last replay.
    assert report["schema"]["behind"] is False


def test_status_on_the_primary_is_no_standby(database_url: str) -> None:
    result = run_reactor("status", "--json", env=reactor_env(database_url))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["standby"] is False


def test_run_on_a_standby_tries_its_startup_attempts_then_exits_3(
    standby_url: str, standby: EmbeddedPostgres
) -> None:
    env = reactor_env(standby_url, REACTOR_LOG_LEVEL="debug")
    result = run_reactor("run", env=env, timeout=60)
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    shown, debug = split_output(result.stderr)
    assert len(shown) == 1, result.stderr
    assert_names_the_fix(shown[0], standby.port)
    # Five attempts: the standby was given four more chances to be promoted.
    assert debug.count(RETRY_LINE) == 4, debug


def test_run_starts_once_the_standby_it_found_is_promoted(
    database_url: str, server: Server, tmp_path: Path
) -> None:
    with standby_of(embedded_of(server)) as replica:
        dsn = on(replica, database_url)
        caught_up(database_url, dsn)
        group = Replicas(tmp_path)
        try:
            env = reactor_env(dsn, REACTOR_LOG_LEVEL="debug", REACTOR_GRACE_SECONDS="0.2")
            reactor = group.start(env)
            wait_for(lambda: RETRY_LINE in reactor.messages(), 30, "the first standby retry")
            replica.promote()
            with connect(dsn) as conn:
                wait_for(lambda: listeners(conn) == 1, 30, "a listener on the promoted server")
                job_id, _ = new_job(conn)
                finish(conn, job_id)
                wait_for(lambda: worker_writes(conn), 30, "the job's run")
            reactor.proc.send_signal(signal.SIGTERM)
            assert reactor.wait(30) == 0, reactor.messages()
        finally:
            group.close()


@pytest.mark.parametrize("form", ["url", "keywords"])
def test_a_multi_host_dsn_finds_the_primary_for_every_command(
    database_url: str,
    standby_url: str,
    standby: EmbeddedPostgres,
    form: Any,
    spawn: Any,
) -> None:
    primary_port = host_port(database_url)[1]
    # The standby comes first: libpq passes over it. Trust auth ignores the password, which
    # must never be shown.
    dsn = multi_host(
        psycopg.conninfo.make_conninfo(database_url, password="s3cret"),
        standby.port,
        primary_port,
        form=form,
    )
    env = reactor_env(dsn, REACTOR_GRACE_SECONDS="0.2")
    migrate = run_reactor("migrate", env=env)
    assert (migrate.returncode, migrate.stdout.startswith("schema is up to date")) == (0, True)
    state = run_reactor("status", "--json", env=env)
    assert state.returncode == 0, state.stderr
    assert json.loads(state.stdout)["standby"] is False
    assert run_reactor("hooks", "list", env=env).returncode == 0
    sweep = run_reactor("sweep", "--once", env=env)
    assert (sweep.returncode, sweep.stdout.strip()) == (0, "0"), sweep.stderr

    proc: subprocess.Popen[str] = spawn("run", env=env)
    with connect(database_url) as conn:
        wait_for(lambda: listeners(conn) == 1, 30, "a listener on the primary")
        job_id, _ = new_job(conn)
        finish(conn, job_id)
        wait_for(lambda: worker_writes(conn), 30, "the job's run")
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "s3cret" not in stderr
    [starting] = [r for r in map(json.loads, stderr.splitlines()) if r["message"] == "starting"]
    assert f"port={standby.port},{primary_port}" in starting["database"]
    assert "password=***" in starting["database"]


@pytest.mark.parametrize("args", [("migrate",), ("status", "--json"), ("hooks", "list")])
def test_a_multi_host_dsn_without_a_writable_host_is_one_line_exit_3(
    standby_url: str, standby: EmbeddedPostgres, args: tuple[str, ...]
) -> None:
    # Port 1 refuses the connection; the standby is turned down by target_session_attrs.
    dsn = multi_host(standby_url, standby.port, 1, connect_timeout="2")
    line = assert_one_clean_line(run_reactor(*args, env=reactor_env(dsn)), 3)
    assert f"no host of DATABASE_URL accepts writes: 127.0.0.1:{standby.port} is read-only" in line
    assert "the others did not answer" in line
    assert "primary's address" in line


def test_the_standby_replays_what_the_primary_writes(database_url: str, standby_url: str) -> None:
    # The harness itself: what the tests above read on the standby is the primary's.
    with connect(database_url) as primary:
        job_id, _ = new_job(primary)
    caught_up(database_url, standby_url)
    with connect(standby_url) as replica:
        assert scalar(replica, "SELECT pg_is_in_recovery()") is True
        assert scalar(replica, "SELECT count(*) FROM analysis_jobs WHERE id = %s", (job_id,)) == 1
