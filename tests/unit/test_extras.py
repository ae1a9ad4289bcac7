"""The cli extra: without rich (as in the container image) the commands that draw a table go
on to do their work, and print the table as plain text (tests/acceptance/test_plain_tables.py);
nothing says the extra is missing."""

from __future__ import annotations

import pytest

from tests.acceptance.conftest import reactor_env, run_reactor_without


@pytest.mark.parametrize("args", [("status",), ("hooks", "list"), ("status", "--json")])
def test_a_table_without_the_cli_extra_goes_on_to_connect(args: tuple[str, ...]) -> None:
    # A DSN nothing answers on: exit 3 says the command went as far as connecting.
    env = reactor_env("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")
    result = run_reactor_without("rich", *args, env=env)
    assert result.returncode == 3, result.stderr
    assert "cli extra" not in result.stderr
    assert "Traceback" not in result.stderr
