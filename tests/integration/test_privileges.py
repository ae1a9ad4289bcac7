"""Least privilege: a role holding exactly what ``reactor migrate --print-grants`` prints runs
the reactor (record, hooks, status), and a role missing any one of those grants is refused at
startup with exit 5 and one line naming that grant.

Roles are cluster-wide, so each test makes its own, with a unique name, and drops it after.
The embedded test server trusts every local connection, so a role needs no password.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg.conninfo
import pytest

from reactor.install import grants
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.acceptance.test_cli import assert_one_clean_line
from tests.conftest import NewRole
from tests.helpers import finish, new_job, run_row
from tests.integration.support import scalar
from tests.polling import wait_for

Spawn = Callable[..., subprocess.Popen[str]]

HOOK_CHANNEL = "reactor_privileges_hook"


def print_grants(role: str) -> str:
    result = run_reactor("migrate", "--print-grants", role, env=reactor_env(None))
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture
def role(new_login_role: NewRole) -> str:
    """A fresh LOGIN role with no privileges of its own."""
    return new_login_role("reactor_rt")


def dsn_as(database_url: str, role: str) -> str:
    return psycopg.conninfo.make_conninfo(database_url, user=role)


def grant_all(database_url: str, role: str) -> None:
    """Apply the printed script as the owner: it must be valid SQL as printed."""
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(print_grants(role).encode())


def test_print_grants_is_exactly_the_required_list() -> None:
    script = print_grants("reactor_app")
    statements = [line for line in script.splitlines() if line and not line.startswith("--")]
    assert all(s.startswith("GRANT ") and s.endswith(' TO "reactor_app";') for s in statements)
    printed = " ".join(statements)
    for needed in grants.REQUIRED:
        assert needed.privilege in printed
        assert f"ON {needed.target} TO" in printed
    # The minimum for the row locks, not UPDATE on the whole table; DELETE only on the queue
    # and on the hook outbox (retention), never on the app's tables.
    assert 'GRANT UPDATE (updated_at) ON public.analysis_jobs TO "reactor_app";' in statements
    assert 'GRANT SELECT, INSERT, UPDATE (since), DELETE ON reactor.pending TO "reactor_app";' in (
        statements
    )
    assert [s for s in statements if "DELETE" in s] == [
        'GRANT SELECT, INSERT, UPDATE (since), DELETE ON reactor.pending TO "reactor_app";',
        'GRANT SELECT, INSERT, UPDATE, DELETE ON reactor.set_aside TO "reactor_app";',
        'GRANT SELECT, INSERT, UPDATE, DELETE ON reactor.replicas TO "reactor_app";',
        'GRANT SELECT, INSERT, UPDATE, DELETE ON reactor.hook_outbox TO "reactor_app";',
    ]
    assert "ALL" not in printed


@pytest.mark.parametrize("bad", ["bad role", "1role", "x;DROP TABLE y", "public", "pg_monitor", ""])
def test_print_grants_rejects_a_bad_role(bad: str) -> None:
    result = run_reactor("migrate", "--print-grants", bad, env=reactor_env(None))
    assert_one_clean_line(result, 2)
    assert result.stdout == ""


def test_least_privileged_role_records_runs_and_hooks(
    database_url: str, role: str, spawn: Spawn
) -> None:
    grant_all(database_url, role)
    with psycopg.connect(database_url, autocommit=True) as admin:
        # The tests' audit trigger writes run_audit as whoever writes a run; granting that here
        # would hide a missing grant of the reactor's own, so this test goes without it.
        admin.execute("DROP TRIGGER run_audit ON analysis_runs")
    env = reactor_env(
        dsn_as(database_url, role),
        REACTOR_GRACE_SECONDS="0.3",
        REACTOR_HOOKS=f"ping=notify:{HOOK_CHANNEL}",
        REACTOR_SCAN_INTERVAL_SECONDS="1",
    )
    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        psycopg.connect(database_url, autocommit=True) as hook_listener,
    ):
        hook_listener.execute(f"LISTEN {HOOK_CHANNEL}")
        proc = spawn("run", env=env)
        wait_for(lambda: _listening(conn, role) or proc.poll() is not None)
        assert proc.poll() is None, proc.communicate()[1]
        job_id, run_id = new_job(conn)
        finish(conn, job_id)
        wait_for(lambda: run_row(conn, run_id) or proc.poll() is not None)
        assert run_row(conn, run_id) == (job_id, "worker"), proc.communicate()[1]

        # The hook ran: its outbox row is done, and its notification arrived.
        def hook_done() -> bool:
            row = conn.execute(
                "SELECT status FROM reactor.hook_outbox WHERE run_id = %s AND hook = 'ping'",
                (run_id,),
            ).fetchone()
            return row is not None and row[0] == "done"

        wait_for(hook_done)
        payloads = [n.payload for n in hook_listener.notifies(timeout=5, stop_after=1)]
        assert str(run_id) in payloads[0]

        # The same role can read the status: nothing due, one LISTEN replica (its own).
        result = run_reactor("status", "--json", env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        report = json.loads(result.stdout)
        assert report["listeners"]["count"] == 1
        assert report["jobs"]["due"] == 0
        assert report["hooks"]["failed"] == 0

        # And sweep, which takes the same startup checks.
        result = run_reactor("sweep", "--once", env=env)
        assert (result.returncode, result.stdout.strip()) == (0, "0"), result.stderr

        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 0, stderr


@pytest.mark.parametrize("missing", grants.REQUIRED, ids=lambda p: p.grant)
def test_each_missing_grant_is_one_line_exit_5(
    database_url: str, role: str, missing: grants.Privilege
) -> None:
    grant_all(database_url, role)
    revoke = missing.grant.replace("GRANT", "REVOKE", 1)
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(revoke + f' FROM "{role}"')
        if missing.kind == "function":
            # Functions are executable by PUBLIC unless the database revoked that; this one has.
            admin.execute(revoke + " FROM PUBLIC")
    result = run_reactor("run", env=reactor_env(dsn_as(database_url, role)), timeout=30)
    line = assert_one_clean_line(result, 5)
    assert missing.grant in line


def _listening(conn: psycopg.Connection[Any], role: str) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'reactor-listener'"
        " AND usename = %s AND datname = current_database()",
        (role,),
    ).fetchone()
    return row is not None and row[0] >= 1


def test_migrate_as_the_runtime_role_names_the_owner(database_url: str, role: str) -> None:
    # Not a grant the runtime role lacks but one it never gets: the schema is the owner's, and
    # only the owner migrates it (a schema another role made is never adopted).
    grant_all(database_url, role)
    with psycopg.connect(database_url) as admin:
        owner = scalar(
            admin, "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'reactor'"
        )
    result = run_reactor("migrate", env=reactor_env(dsn_as(database_url, role)))
    line = assert_one_clean_line(result, 2)
    assert f"schema reactor exists and belongs to role {owner}, not to {role}" in line
    assert f"run `reactor migrate` as {owner}" in line


def test_status_without_the_reactor_schema_is_one_line_exit_5(database_url: str, role: str) -> None:
    grant_all(database_url, role)
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f'REVOKE USAGE ON SCHEMA reactor FROM "{role}"')
    result = run_reactor("status", "--json", env=reactor_env(dsn_as(database_url, role)))
    line = assert_one_clean_line(result, 5)
    assert "permission denied for schema reactor" in line
    assert "--print-grants" in line
    assert result.stdout == ""


def test_the_app_role_finishes_jobs_without_any_reactor_grant(database_url: str, role: str) -> None:
    # The trigger runs in the app's transactions, as the app's role: it must not need the
    # reactor's schema (the queue insert runs as the function's owner).
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f'GRANT SELECT, INSERT, UPDATE ON analysis_jobs, analysis_runs TO "{role}"')
    with psycopg.connect(dsn_as(database_url, role), autocommit=True) as app:
        job_id, _ = new_job(app)
        finish(app, job_id)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("SELECT count(*) FROM reactor.pending")
    with psycopg.connect(database_url, autocommit=True) as admin:
        queued = admin.execute(
            "SELECT count(*) FROM reactor.pending WHERE job_id = %s", (job_id,)
        ).fetchone()
        assert queued == (1,)
