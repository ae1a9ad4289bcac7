"""``reactor demo`` as a newcomer runs it: its own screen and nothing else."""

from __future__ import annotations

import re

from tests.acceptance.conftest import reactor_env, run_reactor

# A log record in either of the reactor's formats: a JSON object, or "HH:MM:SS.mmm level ...".
_LOG_LINE = re.compile(r"^\s*\{|^\d\d:\d\d:\d\d\.\d{3} (debug|info|warning|error|critical) ")


def test_demo_prints_only_its_own_screen() -> None:
    # Four replicas go away twice while statements and probes are in flight. Cancelled there,
    # psycopg logged "query cancellation interrupted" into the table, in one run in five or so.
    result = run_reactor(
        "demo", "--jobs", "120", "--grace", "1", "--replicas", "4", env=reactor_env(None)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith("backstop-reactor demo: 120 jobs")
    assert [line for line in lines if _LOG_LINE.match(line)] == []
    assert "lost (needed a run, got none)" in result.stdout
    assert re.search(r"^the operator's page: http://127\.0\.0\.1:\d+/$", result.stdout, re.M)
