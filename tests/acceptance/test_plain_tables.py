"""The tables of `reactor status` and `reactor hooks list`. Without the cli extra (as in the
container image) they are plain text: the same rows, the same exit codes. Drawn by rich or not,
what a cell quotes (an error a hook's endpoint sent back) is shown as written: no escape
sequence reaches the terminal, and no bracket is taken for rich's markup."""

from __future__ import annotations

import re
from functools import partial

import psycopg
import pytest

from tests.acceptance.conftest import reactor_env, run_reactor, run_reactor_without
from tests.acceptance.test_hooks_ops_cli import add_row
from tests.helpers import finish, new_job


def test_status_prints_its_table_as_plain_text(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        job_id, _ = new_job(conn)
        finish(conn, job_id, age=3600)
    env = reactor_env(database_url, REACTOR_GRACE_SECONDS="0")
    result = run_reactor_without("rich", "status", env=env)
    # A job due an hour ago with no replica listening: at risk, exit 1, as with the extra.
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("reactor status at ")
    assert lines[1].split() == ["check", "state", "value"]
    assert set(lines[2]) == {"-", " "}
    # Columns are two spaces apart or more; a cell's second line starts with spaces.
    cells = [re.split(" {2,}", line) for line in lines[3:] if not line.startswith(" ")]
    rows = {row[0]: row[1:] for row in cells}
    assert rows["jobs needing a run"] == ["backlog", "1 due, 0 inside the 0s grace"]
    assert rows["LISTEN sessions"] == ["AT RISK", "0"]
    assert any(line.startswith("at risk: ") for line in lines)
    assert "\x1b" not in result.stdout


def test_hooks_list_prints_its_table_as_plain_text(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        failed = add_row(conn, "failed", "HTTP 503 from https://judge.example/hook")
        pending = add_row(conn, "pending")
    result = run_reactor_without("rich", "hooks", "list", env=reactor_env(database_url))
    assert result.returncode == 1, result.stderr  # a parked row needs a person
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["id", "hook", "status", "attempts"]
    rows = {line.split()[0]: line.split()[2] for line in lines[2:] if line[:1].isdigit()}
    assert rows == {str(failed): "failed", str(pending): "pending"}
    assert "HTTP 503 from https://judge.example/hook" in result.stdout
    assert "\x1b" not in result.stdout


# What a hook's endpoint might send back: rich markup, a closing tag rich fails on, and the
# escape sequence that clears a screen.
HOSTILE = "judge said [/nope] [reverse]x[/reverse] \x1b[2J"


@pytest.mark.parametrize("drawn", [True, False], ids=["drawn", "plain"])
def test_a_quoted_error_is_shown_as_written(database_url: str, drawn: bool) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        failed = add_row(conn, "failed", HOSTILE)
    # Wide enough that rich wraps no cell.
    env = reactor_env(database_url, COLUMNS="400")
    run = run_reactor if drawn else partial(run_reactor_without, "rich")
    for args in (("status",), ("hooks", "list")):
        result = run(*args, env=env)
        assert result.returncode == 1, result.stderr
        assert "judge said [/nope] [reverse]x[/reverse] \\x1b[2J" in result.stdout, args
        assert "\x1b" not in result.stdout
    assert failed
