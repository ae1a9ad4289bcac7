"""Hooks across process deaths: a kill -9's calls run again at the next replica's first check,
a SIGTERM hands the lease back."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.acceptance.conftest import reactor_env, run_reactor
from tests.acceptance.test_cli import assert_one_clean_line, listening
from tests.helpers import finish, new_job
from tests.polling import wait_for

Spawn = Callable[..., subprocess.Popen[str]]

BLOCK = "judge=python:tests.hookmods:block"


def hook_row(conn: psycopg.Connection[Any]) -> tuple[Any, ...] | None:
    return conn.execute("SELECT status, attempts FROM reactor.hook_outbox").fetchone()


def log_lines(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def blocking_hook_env(
    database_url: str, tmp_path: Path, **variables: str
) -> tuple[dict[str, str], Path, Path]:
    """A reactor's environment whose hook notes its calls in ``log`` and blocks until
    ``release`` exists: the environment, the log and the release file."""
    log, release = tmp_path / "hooks.log", tmp_path / "release"
    env = reactor_env(
        database_url,
        REACTOR_GRACE_SECONDS="0.2",
        REACTOR_HOOKS=BLOCK,
        HOOK_LOG=str(log),
        HOOK_RELEASE=str(release),
        **variables,
    )
    return env, log, release


def first_replica_in_a_hook(
    spawn: Spawn, env: dict[str, str], conn: psycopg.Connection[Any], log: Path
) -> subprocess.Popen[str]:
    """A replica started, a job finished, and its hook running, blocked, in that replica."""
    first = spawn("run", env=env)
    wait_for(lambda: listening(conn))
    finish(conn, new_job(conn)[0])
    wait_for(lambda: log_lines(log))
    return first


def test_kill_9_mid_hook_another_replica_runs_it_again_without_waiting_out_the_lease(
    database_url: str, spawn: Spawn, tmp_path: Path
) -> None:
    env, log, release = blocking_hook_env(
        database_url, tmp_path, REACTOR_HOOK_TIMEOUT_SECONDS="2", REACTOR_HOOK_LEASE_SECONDS="60"
    )
    with psycopg.connect(database_url, autocommit=True) as conn:
        first = first_replica_in_a_hook(spawn, env, conn, log)
        first.kill()
        first.communicate()
        killed_at = time.monotonic()
        release.touch()
        spawn("run", env=env)
        wait_for(lambda: hook_row(conn) == ("done", 2), timeout=30)
        took = time.monotonic() - killed_at
    starts = [line for line in log_lines(log) if line[0] == "start"]
    assert [int(line[2]) for line in starts] == [1, 2]
    assert starts[0][3] != starts[1][3]  # two different processes
    # The killed replica's session ended with it, so the second one's first check made the
    # call due at once: it did not wait out the 60 s lease.
    assert took < 20


def test_sigterm_mid_hook_releases_the_lease_at_once(
    database_url: str, spawn: Spawn, tmp_path: Path
) -> None:
    env, log, release = blocking_hook_env(
        database_url,
        tmp_path,
        REACTOR_HOOK_TIMEOUT_SECONDS="120",  # lease 150 s: only a release explains a fast pickup
        REACTOR_DRAIN_SECONDS="0.5",
    )
    with psycopg.connect(database_url, autocommit=True) as conn:
        first = first_replica_in_a_hook(spawn, env, conn, log)
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)
        assert first.returncode == 0
        assert hook_row(conn) == ("pending", 0)  # handed back, the interrupted try not counted
        release.touch()
        started = time.monotonic()
        spawn("run", env=env)
        wait_for(lambda: hook_row(conn) == ("done", 1), timeout=30)
        assert time.monotonic() - started < 20


@pytest.mark.parametrize(
    ("hooks", "needle"),
    [
        ("judge=smoke:signals", "unknown kind"),
        ("judge=python:no_such_module_here:judge", "cannot import"),
        ("judge=python:tests.hookmods:not_a_function", "is not a function"),
        ("judge=python:tests.hookmods:missing", "has no"),
        ("judge=webhook:ftp://example.invalid/x", "http(s) URL"),
        ("judge=webhook:http://", "http(s) URL"),
        ("judge=notify:bad channel", "channel"),
        ("judge", "name=kind:target"),
    ],
)
def test_bad_hook_configuration_is_one_line_exit_2(
    database_url: str, hooks: str, needle: str
) -> None:
    result = run_reactor("run", env=reactor_env(database_url, REACTOR_HOOKS=hooks))
    assert needle in assert_one_clean_line(result, 2)
