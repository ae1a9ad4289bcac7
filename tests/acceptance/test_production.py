"""The real command line in front of a production-shaped database: PgBouncer in transaction
mode between the reactor and PostgreSQL, and a listen DSN that does not work.

.ci/run runs this file on PostgreSQL 18 and 15.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio
import psycopg
import psycopg.conninfo

from reactor.install.mapping import REFERENCE
from reactor.testing import audit
from tests import pgbouncer as bouncer
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.acceptance.test_cli import kill_9_and_restart
from tests.helpers import client_save, finish, new_job, run_row, worker_writes
from tests.integration.test_pgbouncer import server_sessions
from tests.polling import wait_for
from tests.ports import free_port, http_get

Spawn = Callable[..., subprocess.Popen[str]]


def verdict(dsn: str, grace: float) -> audit.Verdict:
    async def read() -> audit.Verdict:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await audit.verdict(conn, REFERENCE.in_public(), grace)

    return anyio.run(read)


def logged(stderr: str) -> list[dict[str, Any]]:
    """The JSON log records of a reactor process."""
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM, wait for the drain, return stderr; the exit code must be 0."""
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    return stderr


def test_two_poll_mode_replicas_through_pgbouncer(
    database_url: str, pgbouncer: bouncer.PgBouncer, spawn: Spawn
) -> None:
    # The setup of the field report: DATABASE_URL through PgBouncer in transaction mode,
    # REACTOR_MODE=poll, two replicas, tabs saving some runs, the app on the same pooler.
    pooled = pgbouncer.dsn_for(database_url)
    grace = 0.3
    ports = [free_port(), free_port()]
    replicas = [
        spawn(
            "run",
            env=reactor_env(
                pooled,
                REACTOR_MODE="poll",
                REACTOR_SCAN_INTERVAL_SECONDS="0.1",
                REACTOR_GRACE_SECONDS=str(grace),
                REACTOR_HTTP_ADDR=f"127.0.0.1:{port}",
            ),
        )
        for port in ports
    ]
    # Both at work before the app starts: each must have run its statements many times.
    for port, proc in zip(ports, replicas, strict=True):
        wait_for(partial(_ready_or_gone, port, proc))
        assert proc.poll() is None, proc.communicate()[1]
    jobs = 150
    with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as app:
        for n in range(jobs):
            job_id, _ = new_job(app)
            finish(app, job_id)
            if n % 3 == 0:
                client_save(app, job_id)
        wait_for(lambda: len(worker_writes(app)) == jobs - jobs // 3, timeout=60)
    outputs = [stop(proc) for proc in replicas]

    judged = verdict(database_url, grace)
    assert judged.clean, judged
    assert (judged.saved_by_client, judged.saved_by_worker) == (jobs // 3, jobs - jobs // 3)
    for stderr in outputs:
        assert "prepared statement" not in stderr
        problems = [r for r in logged(stderr) if r["level"] in ("warning", "error")]
        assert problems == [], problems
    # Nothing either replica set is left on the server sessions the app gets.
    for session in server_sessions(pooled):
        assert session["settings"] == [], session


def test_listen_direct_pool_through_pgbouncer_survives_kill_9(
    database_url: str, pgbouncer: bouncer.PgBouncer, spawn: Spawn
) -> None:
    env = reactor_env(
        pgbouncer.dsn_for(database_url),
        REACTOR_LISTEN_DATABASE_URL=database_url,
        REACTOR_GRACE_SECONDS="1",
    )
    with psycopg.connect(database_url, autocommit=True) as conn:
        second = kill_9_and_restart(conn, spawn, env)
    stop(second)


def test_sweep_and_status_through_pgbouncer(
    database_url: str, pgbouncer: bouncer.PgBouncer
) -> None:
    pooled = pgbouncer.dsn_for(database_url)
    with psycopg.connect(database_url, autocommit=True) as conn:
        for _ in range(3):
            finish(conn, new_job(conn)[0])
    env = reactor_env(pooled, REACTOR_GRACE_SECONDS="0")
    result = run_reactor("sweep", "--once", env=env)
    assert (result.returncode, result.stdout.strip()) == (0, "3"), result.stderr
    result = run_reactor("status", "--json", env=env)
    report = json.loads(result.stdout)
    assert report["jobs"]["due"] == 0
    assert report["listeners"]["count"] == 0
    for session in server_sessions(pooled):
        assert session["settings"] == [], session


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        return http_get(port, path, timeout=5)
    except OSError:
        return 0, ""  # not serving yet


def _ready_or_gone(port: int, proc: subprocess.Popen[str]) -> bool:
    return _get(port, "/readyz")[0] == 200 or proc.poll() is not None


def _listener_failures(port: int) -> float:
    status, text = _get(port, "/metrics")
    for line in text.splitlines() if status == 200 else []:
        if line.startswith("reactor_listener_failures_total "):
            return float(line.split()[1])
    return 0.0


def test_a_listen_dsn_that_is_refused_costs_lateness_not_work(
    database_url: str, spawn: Spawn
) -> None:
    refused = psycopg.conninfo.make_conninfo(database_url, user="reactor_no_such_role")
    port = free_port()
    env = reactor_env(
        database_url,
        REACTOR_LISTEN_DATABASE_URL=refused,
        REACTOR_GRACE_SECONDS="0.3",
        REACTOR_SCAN_INTERVAL_SECONDS="0.5",
        REACTOR_HTTP_ADDR=f"127.0.0.1:{port}",
        REACTOR_LOG_LEVEL="DEBUG",
    )
    proc = spawn("run", env=env)
    with psycopg.connect(database_url, autocommit=True) as conn:
        job_id, run_id = new_job(conn)
        finish(conn, job_id)
        wait_for(lambda: run_row(conn, run_id) or proc.poll() is not None)
        assert run_row(conn, run_id) == (job_id, "worker"), proc.poll()
    status, body = _get(port, "/readyz")
    assert status == 503
    reason = json.loads(body)["reason"]
    assert reason.startswith("LISTEN connection down: "), reason
    assert "reactor_no_such_role" in reason
    assert _get(port, "/healthz")[0] == 200
    wait_for(lambda: _listener_failures(port) >= 3)
    stderr = stop(proc)
    refusals = [r for r in logged(stderr) if r["message"].startswith("listener cannot connect")]
    # Once per state change: the first refusal is news, the same one again is not.
    assert len(refusals) >= 3
    assert [r["level"] for r in refusals] == ["warning"] + ["debug"] * (len(refusals) - 1)
