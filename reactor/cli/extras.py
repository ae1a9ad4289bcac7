"""The package's optional parts (pyproject's extras): whether one is installed, and the one
line that says how to install it.

The sidecar needs none of them: a container image installs the package alone. The terminal's
tables and progress bars (rich, the ``cli`` extra) are for a person at a terminal, the demo's
PostgreSQL for ``reactor demo``; a command that needs one it lacks says so before it connects.
"""

from __future__ import annotations

import importlib.util

from reactor.errors import ConfigError


def installed(module: str) -> bool:
    """Whether ``module`` can be imported; looked up, not imported (an import may run setup)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require_tables(command: str) -> None:
    """Raise ConfigError naming the ``cli`` extra when rich, which draws ``command``'s table,
    is not installed (as in the container image); ``--json`` needs nothing more."""
    if not installed("rich"):
        raise ConfigError(
            f"{command} draws its table with rich, which the cli extra installs: "
            "pip install 'backstop-reactor[cli]', or give --json"
        )
