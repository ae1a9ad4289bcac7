"""What a benchmark is and returns: its interface, its :class:`Result`, the conditions it ran under.

A benchmark is a module with ``TITLE``, ``GOAL`` and ``async def run(ctx) -> Result``. It gets its
own PostgreSQL (bench/server.py), measures the reactor and an alternative on that same server,
and returns a :class:`Result`, which bench/report.py writes as JSON and renders into REPORT.md.
"""

from __future__ import annotations

import datetime
import functools
import os
import platform
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psycopg

from bench.server import Server

BENCH_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Context:
    """How this invocation runs: scale, where results go, and the command to cite."""

    quick: bool
    results_dir: Path
    report_path: Path
    command: str


@dataclass
class Table:
    """A small table: printed to the terminal and rendered into REPORT.md."""

    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        """Append a row; cells are turned into text."""
        self.rows.append([str(cell) for cell in cells])


@dataclass
class Result:
    """What one benchmark run found, as written to ``results/NAME.json``."""

    met: bool | None  # None: not measurable here (the notes say why)
    headline: str
    table: Table
    figures: dict[str, Any]
    settings: dict[str, Any]
    conditions: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    # What the runner knows of the run, filled in by it: the benchmark's name, its module's
    # TITLE and GOAL, the command line and the wall time.
    name: str = ""
    title: str = ""
    goal: str = ""
    command: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """A plain dict for json.dump."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        """The inverse of :meth:`to_json`."""
        table = Table(**data.pop("table"))
        return cls(table=table, **data)


def unmeasured(
    table: Table,
    *,
    settings: dict[str, Any],
    conditions: dict[str, Any],
    why: str,
) -> Result:
    """The result of a benchmark that counts statements on a server without pg_stat_statements
    (``why``): nothing measured, and how to measure."""
    notes = [why + "; run without DATABASE_URL to use the embedded server, which loads it."]
    return Result(None, why, table, {}, settings, conditions, notes)


def not_ours_to_stop(
    table: Table, *, settings: dict[str, Any], conditions: dict[str, Any]
) -> Result:
    """The result of a benchmark that stops and starts the server, run on DATABASE_URL's:
    nothing measured (``table`` has one row of dashes)."""
    table.add(*("-" for _ in table.headers))
    return Result(
        None,
        "not measured: the server is DATABASE_URL's, not ours to stop",
        table,
        {},
        settings,
        conditions,
        ["Stopping and starting the server needs the embedded cluster."],
    )


class Benchmark(Protocol):
    """The interface of a benchmark module."""

    TITLE: str
    GOAL: str

    async def run(self, ctx: Context) -> Result:
        """Measure and return the result (the runner adds command and timing)."""
        ...


async def conditions(
    server: Server | None, *, note: str | None = None, **extra: Any
) -> dict[str, Any]:
    """Versions, machine, date and server settings under which a figure was measured; ``note``
    (what a --quick run shortened, say) is recorded when given."""
    found: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "libpq": _libpq_version(),
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.machine(),
        },
        "reactor_version": product_version(),
        # The box is shared: the load before and after the run says how quiet it was.
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }
    if server is not None:
        info = await server.info()
        found["postgres"] = info.pop("server_version")
        found["server"] = {"source": server.source, **info}
    else:
        found["postgres"] = None
    found.update(extra)
    if note is not None:
        found["note"] = note
    return found


@functools.cache
def product_version() -> str:
    """The commit the reactor and its SQL come from, '+dirty' when they have local edits.

    Cached: the runner takes it when it loads the reactor, before the tree can move on.
    """
    root = BENCH_DIR.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "reactor", "triggers"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _libpq_version() -> str:
    version = psycopg.pq.version()
    return f"{version // 10000}.{version % 10000}"
