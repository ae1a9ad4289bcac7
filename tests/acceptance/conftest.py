"""Running the real ``reactor`` command as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys


def reactor_env(database_url: str | None, **variables: str) -> dict[str, str]:
    """A clean environment for a reactor process: only what the test sets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTOR_")}
    env.pop("DATABASE_URL", None)
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    # No HTTP unless asked for: processes side by side would contend for the default ports.
    env.update(
        {
            "REACTOR_HTTP_ADDR": "",
            "REACTOR_DASHBOARD_ADDR": "",
            "REACTOR_LOG_FORMAT": "json",
            **variables,
        }
    )
    return env


def run_reactor(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m reactor ARGS`` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "reactor", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# `python -c` this, a package's name, then the reactor's arguments: an installed reactor whose
# extra that package comes with was left out, so Python finds none of its modules.
_WITHOUT_PACKAGE = """
import importlib.abc, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] == sys.argv[1]:
            raise ModuleNotFoundError(name)
        return None

sys.meta_path.insert(0, NotInstalled())
from reactor.cli import main
main(sys.argv[2:])
"""


def run_reactor_without(
    package: str, *args: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run ``reactor ARGS`` to completion as if ``package`` were not installed."""
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_PACKAGE, package, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
