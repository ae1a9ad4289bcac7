"""The cli extra: without rich (as in the container image) the commands that draw a table say
so in one line and exit 2, before they connect; their --json needs nothing more."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.acceptance.conftest import reactor_env

# An installed reactor without the cli extra: Python finds no rich.
_WITHOUT_RICH = """
import importlib.abc, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] == "rich":
            raise ModuleNotFoundError(name)
        return None

sys.meta_path.insert(0, NotInstalled())
from reactor.cli import main
main(sys.argv[1:])
"""


def without_rich(*args: str) -> subprocess.CompletedProcess[str]:
    # A DSN nothing answers on: a command that got as far as connecting would say so instead.
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_RICH, *args],
        env=reactor_env("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
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
