"""A mapping file changed after `reactor migrate`: `run` and `sweep` refuse it, `status` reports
it, and `migrate` re-installs and says so. And `migrate --print` shows the statements the
running reactor sends to the app's tables, for review, without running them.

On tests/mappings/onetoone.sql, the one-to-one shape of a Django app.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from reactor import db
from reactor.install import sql
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.acceptance.test_cli import assert_one_clean_line
from tests.helpers import scalar_from
from tests.integration.test_schema import execute
from tests.polling import wait_for

Spawn = Callable[..., subprocess.Popen[str]]

MAPPINGS = Path(__file__).parent.parent / "mappings"
ONETOONE_SQL = (MAPPINGS / "onetoone.sql").read_text()
ONETOONE_TOML = (MAPPINGS / "onetoone.toml").read_text()
TERMINAL = 'terminal = ["done", "error"]'


@pytest.fixture
def app_url(empty_database_url: str) -> str:
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(ONETOONE_SQL)
    return empty_database_url


def _env(url: str, path: Path, toml: str) -> dict[str, str]:
    path.write_text(toml)
    return reactor_env(url, REACTOR_CONFIG=str(path))


def _migrated(env: dict[str, str]) -> str:
    result = run_reactor("migrate", env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _finished_export(url: str) -> int:
    insert = (
        "INSERT INTO app.exports (state, body, summary, owner_id, updated_at)"
        " VALUES ('done', 'b', '{\"a\": 1}', 7, now() - interval '1 hour') RETURNING id"
    )
    return int(scalar_from(url, insert))


def _reports(url: str) -> int:
    return int(scalar_from(url, "SELECT count(*) FROM app.export_reports"))


def _listening(url: str) -> bool:
    listeners = (
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'reactor-listener'"
        " AND datname = current_database()"
    )
    return int(scalar_from(url, listeners)) >= 1


def test_a_changed_mapping_is_refused_until_migrate_reinstalls_it(
    app_url: str, tmp_path: Path, spawn: Spawn
) -> None:
    path = tmp_path / "reactor.toml"
    first = _migrated(_env(app_url, path, ONETOONE_TOML))
    assert "applied migrations" in first
    assert db.REINSTALLED not in first

    # The file changes under the install: 'error' is no longer terminal, which the installed
    # trigger functions still judge by the old file.
    env = _env(app_url, path, ONETOONE_TOML.replace(TERMINAL, 'terminal = ["done"]'))
    _finished_export(app_url)
    for command in (("run",), ("sweep", "--once")):
        line = assert_one_clean_line(run_reactor(*command, env=env), 2)
        assert "mapping file changed since the last `reactor migrate`" in line, command
        assert "run `reactor migrate`" in line
    assert _reports(app_url) == 0

    status = run_reactor("status", "--json", env=env)
    assert status.returncode == 1, status.stderr
    report = json.loads(status.stdout)
    assert report["schema"]["mapping_changed"] is True
    assert any(
        "mapping file changed since the last `reactor migrate`" in risk for risk in report["risks"]
    ), report["risks"]
    shown = run_reactor("status", env=env)
    assert shown.returncode == 1
    assert "mapping file changed since the last" in " ".join(shown.stdout.split())

    # migrate says what it did, and then that nothing is left to do.
    again = _migrated(env)
    assert db.REINSTALLED in again
    assert "up to date" not in again
    said = _migrated(env).splitlines()
    assert said[0] == f"schema is up to date at version {sql.latest_version()}"
    assert not any("re-installed" in line for line in said)

    swept = run_reactor("sweep", "--once", env=env)
    assert (swept.returncode, swept.stdout.strip()) == (0, "1"), swept.stderr
    assert _reports(app_url) == 1
    status = run_reactor("status", "--json", env=env)
    assert status.returncode == 0, status.stdout
    assert json.loads(status.stdout)["schema"]["mapping_changed"] is False

    proc = spawn("run", env=env)
    wait_for(lambda: _listening(app_url) or proc.poll() is not None)
    assert proc.poll() is None, proc.communicate()[1]
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr


def test_a_change_that_installs_nothing_is_no_drift(app_url: str, tmp_path: Path) -> None:
    # The [runs.columns] expressions are sent by the running reactor itself, not installed:
    # the new file takes effect without `reactor migrate`.
    path = tmp_path / "reactor.toml"
    _migrated(_env(app_url, path, ONETOONE_TOML))
    env = _env(app_url, path, ONETOONE_TOML.replace('"j.body"', '"upper(j.body)"'))
    _finished_export(app_url)
    swept = run_reactor("sweep", "--once", env=env)
    assert (swept.returncode, swept.stdout.strip()) == (0, "1"), swept.stderr
    with psycopg.connect(app_url) as conn:
        assert conn.execute("SELECT body FROM app.export_reports").fetchone() == ("B",)
    # Nor is the channel, an option of the install the trigger's own argument shows.
    other = reactor_env(app_url, REACTOR_CONFIG=str(path), REACTOR_CHANNEL="elsewhere")
    assert run_reactor("sweep", "--once", env=other).returncode == 0


def test_an_install_from_before_the_record_is_no_drift(app_url: str, tmp_path: Path) -> None:
    path = tmp_path / "reactor.toml"
    _migrated(_env(app_url, path, ONETOONE_TOML))
    with psycopg.connect(app_url, autocommit=True) as conn:
        conn.execute("UPDATE reactor.app_tables SET mapping_digest = NULL")
    env = _env(app_url, path, ONETOONE_TOML.replace(TERMINAL, 'terminal = ["done"]'))
    assert run_reactor("sweep", "--once", env=env).returncode == 0
    assert run_reactor("status", env=env).returncode == 0
    # Nothing to compare with: migrate re-installs as always, and records the file from now on.
    assert _migrated(env).startswith("schema is up to date")
    with psycopg.connect(app_url) as conn:
        row = conn.execute("SELECT mapping_digest IS NOT NULL FROM reactor.app_tables").fetchone()
    assert row == (True,)


def test_print_shows_the_record_statement_and_applies_cleanly(app_url: str, tmp_path: Path) -> None:
    env = _env(app_url, tmp_path / "reactor.toml", ONETOONE_TOML)
    printed = run_reactor("migrate", "--print", env=env)
    assert printed.returncode == 0, printed.stderr
    script = printed.stdout
    reviewed = script[script.index("-- For review, not run by this script") :]
    # Everything after the header is comments: the script does not send it.
    assert all(line.startswith("--") for line in reviewed.splitlines()), reviewed
    for name in ("record_jobs", "record_oldest", "reconcile_step"):
        assert f"-- {name}: " in reviewed
    assert '--       INSERT INTO "app"."export_reports" AS r (' in reviewed
    assert "FOR NO KEY UPDATE OF j SKIP LOCKED" in reviewed

    # Applied as psql would, it installs what `reactor migrate` does, the record included: the
    # same file then runs, and a changed one is refused.
    execute(app_url, script)
    assert run_reactor("sweep", "--once", env=env).returncode == 0
    changed = _env(
        app_url, tmp_path / "reactor.toml", ONETOONE_TOML.replace(TERMINAL, 'terminal = ["done"]')
    )
    assert_one_clean_line(run_reactor("sweep", "--once", env=changed), 2)
