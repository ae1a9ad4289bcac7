"""The package's optional parts (pyproject's extras): whether one is installed.

The sidecar needs none of them: a container image installs the package alone. The terminal's
tables and progress bars (rich, the ``cli`` extra) are for a person at a terminal; without it
the tables are plain text and the bars log lines. The demo's PostgreSQL is for ``reactor
demo``, which says so before it starts when the extra is missing.
"""

from __future__ import annotations

import importlib.util


def installed(module: str) -> bool:
    """Whether ``module`` can be imported; looked up, not imported (an import may run setup)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
