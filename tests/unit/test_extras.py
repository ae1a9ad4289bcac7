"""The cli extra: without rich (as in the container image) the commands that draw a table say
so in one line and exit 2, before they connect; their --json needs nothing more."""

from __future__ import annotations

import subprocess

import pytest

from tests.acceptance.conftest import reactor_env, run_reactor_without


def without_rich(*args: str) -> subprocess.CompletedProcess[str]:
    """``reactor ARGS`` installed without the cli extra: Python finds no rich."""
    # A DSN nothing answers on: a command that got as far as connecting would say so instead.
    return run_reactor_without(
        "rich", *args, env=reactor_env("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")
    )


@pytest.mark.parametrize(
    ("args", "command"),
    [(("status",), "reactor status"), (("hooks", "list"), "reactor hooks list")],
)
def test_a_table_without_the_cli_extra_names_it_and_exits_2(
    args: tuple[str, ...], command: str
) -> None:
    result = without_rich(*args)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.strip() == (
        f"reactor: {command} draws its table with rich, which the cli extra installs: "
        "pip install 'backstop-reactor[cli]', or give --json"
    )


def test_json_needs_no_extra() -> None:
    # It goes on to connect, and fails there: exit 3, not the extra's message.
    result = without_rich("status", "--json")
    assert result.returncode == 3, result.stderr
    assert "cli extra" not in result.stderr
