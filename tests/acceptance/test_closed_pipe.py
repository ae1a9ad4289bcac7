"""A reader that stops reading is a normal end: `reactor status --json | head -c 10` prints
its ten bytes, and the reactor ends quietly, with the status a shell gives SIGPIPE (141)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from tests.acceptance.conftest import reactor_env, run_reactor

Spawn = Callable[..., subprocess.Popen[str]]

PIPE_CLOSED = 141


def test_a_closed_pipe_ends_a_command_without_a_traceback(
    empty_database_url: str, spawn: Spawn
) -> None:
    env = reactor_env(empty_database_url)
    assert run_reactor("migrate", "--reference-schema", env=env).returncode == 0
    # The reader gone before the first write: every write to stdout fails, deterministically.
    # (argparse's own help drops a failed write itself, and ends 0.)
    for args, ends in (
        (("status", "--json"), PIPE_CLOSED),
        (("migrate", "--print"), PIPE_CLOSED),
        (("--help",), 0),
    ):
        proc = spawn(*args, env=env)
        assert proc.stdout is not None
        proc.stdout.close()
        _, stderr = proc.communicate(timeout=60)
        assert (proc.returncode, stderr) == (ends, ""), args


def test_status_json_into_head_ends_quietly(empty_database_url: str) -> None:
    env = reactor_env(empty_database_url)
    assert run_reactor("migrate", "--reference-schema", env=env).returncode == 0
    piped = subprocess.run(
        [
            "bash",
            "-c",
            f'"{sys.executable}" -m reactor status --json | head -c 10; '
            'echo "${PIPESTATUS[0]}" >&2',
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert len(piped.stdout) == 10
    assert piped.stdout.startswith("{")
    # Whether the reactor wrote before head left or after: a normal end either way.
    assert piped.stderr.strip() in ("0", str(PIPE_CLOSED)), piped.stderr
