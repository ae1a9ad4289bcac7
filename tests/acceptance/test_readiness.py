"""Ready means "can write": a `reactor run` whose record statements fail on the pair's own
objects says so on /readyz and in `reactor status` within two failures, and recovers by itself
once a statement succeeds; `status` judges the backlog by the grace the replicas run with."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable

import psycopg
import psycopg.conninfo
import pytest

from reactor.record.recorder import MAX_BROKEN_RETRY_S
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.acceptance.test_cli import listening
from tests.conftest import NewRole
from tests.helpers import finish, grant_audit, new_job, worker_writes
from tests.polling import wait_for
from tests.ports import free_port, http_get

Spawn = Callable[..., subprocess.Popen[str]]

# The goal: not ready within 30 s of the first failing statement (it takes two failures, about
# a second and a half apart at the record retry's back-off).
NOT_READY_WITHIN = 30.0


@pytest.fixture
def runtime_role(new_login_role: NewRole, database_url: str) -> str:
    """A login role holding what `reactor migrate --print-grants` grants, and no more."""
    role = new_login_role("runtime")
    grants = run_reactor("migrate", "--print-grants", role, env=reactor_env(database_url))
    assert grants.returncode == 0, grants.stderr
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(grants.stdout.encode())
        grant_audit(conn, role)
    return role


def test_a_pair_that_cannot_write_is_not_ready_and_status_names_why(
    database_url: str, runtime_role: str, spawn: Spawn
) -> None:
    port = free_port()
    as_runtime = psycopg.conninfo.make_conninfo(database_url, user=runtime_role)
    env = reactor_env(
        as_runtime, REACTOR_GRACE_SECONDS="0.3", REACTOR_HTTP_ADDR=f"127.0.0.1:{port}"
    )
    proc = spawn("run", env=env)
    with psycopg.connect(database_url, autocommit=True) as conn:
        wait_for(lambda: listening(conn) or proc.poll() is not None, what="a listener")
        wait_for(lambda: http_get(port, "/readyz")[0] == 200, what="ready")

        # The grant to write the artifact table is gone: every record statement fails (42501),
        # while the LISTEN session, the health checks and the trigger are as well as before,
        # and the mapping still fits the tables (status, as their owner, finds nothing amiss).
        conn.execute(f'REVOKE INSERT ON analysis_runs FROM "{runtime_role}"')
        job_id, _ = new_job(conn)
        finish(conn, job_id)
        failed_from = time.monotonic()
        wait_for(
            lambda: http_get(port, "/readyz")[0] == 503,
            timeout=NOT_READY_WITHIN + 5,
            what="not ready",
        )
        assert time.monotonic() - failed_from < NOT_READY_WITHIN
        code, body = http_get(port, "/readyz")
        assert code == 503
        assert "permission denied for table analysis_runs" in json.loads(body)["reason"]
        _, metrics = http_get(port, "/metrics")
        assert "reactor_writes_failing 1.0" in metrics

        # status, as another process with its default grace, reads the replica's heartbeat.
        def says_unwritable() -> subprocess.CompletedProcess[str] | None:
            result = run_reactor("status", "--json", env=reactor_env(database_url))
            return result if "writes nothing" in result.stdout else None

        reported = wait_for(says_unwritable, what="status names the failing writes")
        assert reported.returncode == 1, reported.stderr
        document = json.loads(reported.stdout)
        assert any(
            "writes nothing" in risk and "permission denied" in risk for risk in document["risks"]
        )
        assert document["jobs"]["grace_seconds"] == 0.3
        assert document["jobs"]["own_grace_seconds"] == 120.0

        conn.execute(f'GRANT INSERT ON analysis_runs TO "{runtime_role}"')
        # Its retries had backed off (a broken pair's backlog does not cycle every second).
        wait_for(
            lambda: worker_writes(conn),
            timeout=MAX_BROKEN_RETRY_S + 10,
            what="the job recorded once repaired",
        )
        wait_for(lambda: http_get(port, "/readyz")[0] == 200, what="ready again")
        _, metrics = http_get(port, "/metrics")
        assert "reactor_writes_failing 0.0" in metrics
    assert proc.poll() is None
