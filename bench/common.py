"""What every benchmark shares: the server, scratch databases, conditions, results and the report.

A benchmark is a module with ``TITLE``, ``GOAL`` and ``async def run(ctx) -> Result``. It gets its
own PostgreSQL from :func:`open_server` (an embedded cluster, or the server of ``DATABASE_URL``,
where it creates and drops scratch databases), measures the reactor and an alternative on that
same server, and returns a :class:`Result`. The runner writes the result as JSON and renders
``REPORT.md`` from every JSON file present, so a partial re-run keeps the other sections.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import os
import platform
import secrets
import statistics
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import psycopg
import psycopg.conninfo

from reactor import audit, db
from reactor.embedded import EmbeddedPostgres
from reactor.install import REFERENCE_INSTALL
from reactor.mapping import REFERENCE

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
REPORT_PATH = BENCH_DIR / "REPORT.md"

Conn = psycopg.AsyncConnection[Any]

# The embedded server's settings on top of EmbeddedPostgres' own (fsync and full_page_writes
# off: a throwaway cluster). Room for the bulk loads of catchup and scan_scale.
SERVER_SETTINGS: Mapping[str, str] = {
    "shared_buffers": "512MB",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "30min",
}

# Server settings recorded with every result, whichever server ran it.
_SHOWN = (
    "server_version",
    "shared_buffers",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_level",
    "max_wal_size",
    "autovacuum",
    "default_toast_compression",
    "shared_preload_libraries",
    "max_connections",
)


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

    name: str
    title: str
    goal: str
    met: bool | None  # None: not measurable here (the notes say why)
    headline: str
    table: Table
    figures: dict[str, Any]
    settings: dict[str, Any]
    conditions: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
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


class Benchmark(Protocol):
    """The interface of a benchmark module."""

    TITLE: str
    GOAL: str

    async def run(self, ctx: Context) -> Result:
        """Measure and return the result (the runner adds command and timing)."""
        ...


# -- the server ---------------------------------------------------------------------------------


class Server:
    """One PostgreSQL for one benchmark, and the scratch databases made on it."""

    def __init__(self, admin_dsn: str, embedded: EmbeddedPostgres | None) -> None:
        self.admin_dsn = admin_dsn
        self.embedded = embedded
        self._scratch: list[str] = []

    @property
    def source(self) -> str:
        """Where the server came from, for the conditions."""
        return "embedded" if self.embedded is not None else "DATABASE_URL"

    @property
    def bin_dir(self) -> Path:
        """Client binaries (pgbench) matching the embedded server; also used for DATABASE_URL."""
        if self.embedded is not None:
            return self.embedded.bin_dir
        return EmbeddedPostgres().bin_dir

    def dsn_for(self, dbname: str) -> str:
        """A DSN for ``dbname`` on this server."""
        return psycopg.conninfo.make_conninfo(self.admin_dsn, dbname=dbname)

    async def create_database(self, label: str, *, template: str | None = None) -> str:
        """A new scratch database (dropped when the server closes); returns its name."""
        name = f"bench_{label}_{secrets.token_hex(3)}"
        clause = f" TEMPLATE {template} STRATEGY FILE_COPY" if template else ""
        async with await connect(self.admin_dsn, "admin") as conn:
            await conn.execute(f"CREATE DATABASE {name}{clause}")
        self._scratch.append(name)
        return name

    async def drop_database(self, name: str) -> None:
        """Drop one scratch database now."""
        async with await connect(self.admin_dsn, "admin") as conn:
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        if name in self._scratch:
            self._scratch.remove(name)

    async def app_database(
        self, label: str, *, with_audit: bool = True, notify: bool = True, spread: bool = False
    ) -> str:
        """A scratch database with the app's tables, every migration, and the audit trigger;
        with ``notify`` False, the job trigger is installed not to notify; with ``spread``, it
        notifies each share of the jobs on a channel of its own (`reactor migrate --spread`)."""
        dsn = self.dsn_for(await self.create_database(label))
        async with await connect(dsn, "setup") as conn:
            await db.migrate(conn, REFERENCE, reference_schema=True, notify=notify, spread=spread)
            if with_audit:
                await audit.install(conn, REFERENCE_INSTALL.mapping)
            await conn.execute(DOC_FUNCTION)
        return dsn

    async def info(self) -> dict[str, str]:
        """The server settings that matter for the figures."""
        async with await connect(self.admin_dsn, "admin") as conn:
            shown = {}
            for name in _SHOWN:
                cur = await conn.execute(f"SHOW {name}")
                row = await cur.fetchone()
                shown[name] = str(row[0]) if row else ""
            return shown

    async def postmaster_pid(self) -> int | None:
        """The server's postmaster, when it runs on this machine (its ``postmaster.pid`` is
        readable here), else None: what :func:`cpu_by_process` reads the server's CPU from."""
        async with await connect(self.admin_dsn, "admin") as conn:
            data_dir = str(await scalar(conn, "SHOW data_directory"))
        try:
            return int((Path(data_dir) / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    async def close(self) -> None:
        """Drop every scratch database still around."""
        for name in list(self._scratch):
            await self.drop_database(name)


@asynccontextmanager
async def open_server(settings: Mapping[str, str] | None = None) -> AsyncIterator[Server]:
    """The benchmark's server: ``DATABASE_URL``'s if set, else a fresh embedded cluster.

    ``settings`` apply to the embedded cluster only; a DATABASE_URL server runs as configured,
    and the conditions record what it actually had.
    """
    url = os.environ.get("DATABASE_URL")
    if url:
        server = Server(url, None)
        try:
            yield server
        finally:
            await server.close()
        return
    # Trusting 127.0.0.1, as the tests do: pgbench and the load generators connect over TCP.
    pg = EmbeddedPostgres(settings={**SERVER_SETTINGS, **(settings or {})}, trust_localhost=True)
    await anyio.to_thread.run_sync(pg.start)
    try:
        server = Server(pg.dsn, pg)
        try:
            yield server
        finally:
            await server.close()
    finally:
        await anyio.to_thread.run_sync(pg.cleanup)


async def connect(dsn: str, role: str, *, autocommit: bool = True) -> Conn:
    """A plain connection for the benchmark's own work, named ``bench-<role>``.

    The reactor's own sessions are named ``reactor-*``; ours never are, so counting by
    application_name (or by database) never mixes the two.
    """
    return await psycopg.AsyncConnection.connect(
        psycopg.conninfo.make_conninfo(dsn, application_name=f"bench-{role}"),
        autocommit=autocommit,
    )


def dbname(dsn: str) -> str:
    """The database a DSN names."""
    return str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])


async def scalar(conn: Conn, query: str, params: Any = None) -> Any:
    """The first column of the first row."""
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    assert row is not None, query
    return row[0]


def asyncpg_params(dsn: str) -> dict[str, Any]:
    """Connection keywords for asyncpg, which takes no libpq key=value strings."""
    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    params: dict[str, Any] = {
        "host": parts.get("host", "127.0.0.1"),
        "port": int(str(parts.get("port", 5432))),
        "user": parts.get("user", "postgres"),
        "database": parts.get("dbname", "postgres"),
    }
    if "password" in parts:
        params["password"] = parts["password"]
    return params


# An HTML-like body of ``size`` bytes: citation paragraphs, mostly markup with a few random
# tokens, so it compresses roughly like real extracted HTML rather than to nothing.
DOC_FUNCTION = """
CREATE OR REPLACE FUNCTION bench_doc(seed int, size int) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT left(string_agg(format(
    '<p class="citation" id="c%1$s"><span class="author">%2$s et al.</span> (%3$s). '
    '<em class="title">On %4$s and its consequences</em>. '
    '<span class="journal">Journal of Applied Studies</span>, %5$s(%6$s), pp. %7$s-%8$s. '
    '<a href="https://doi.org/10.%9$s/%10$s">https://doi.org/10.%9$s/%10$s</a></p>' || chr(10),
    g, initcap(substr(h, 1, 8)), 1950 + (g * 7 + seed) % 75, substr(h, 9, 12), g % 90 + 1,
    g % 12 + 1, g % 400, g % 400 + 17, 1000 + g % 9000, substr(h, 21, 10)), ''), size)
  FROM (SELECT g, md5(seed || ':' || g) AS h FROM generate_series(1, size / 200 + 2) g) s
$$;
"""


async def stat_statements_problem(server: Server) -> str | None:
    """None when pg_stat_statements works on ``server`` (loaded by its settings); else why not."""
    try:
        async with await connect(server.admin_dsn, "count") as conn:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            await scalar(conn, "SELECT count(*) FROM pg_stat_statements")
    except psycopg.Error as error:
        return f"pg_stat_statements is not available on this server: {error}".splitlines()[0]
    return None


async def total_sizes(conn: Conn, names: Sequence[str]) -> dict[str, int]:
    """Each relation's total size in bytes (indexes and TOAST included), by name."""
    return {
        name: int(await scalar(conn, "SELECT pg_total_relation_size(%s)", (name,)))
        for name in names
    }


def size_text(n: int) -> str:
    """Bytes as MiB or KiB for a note."""
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n / 1024:,.0f} KiB"


# -- conditions ---------------------------------------------------------------------------------


async def conditions(server: Server | None, **extra: Any) -> dict[str, Any]:
    """Versions, machine, date and server settings under which a figure was measured."""
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


# -- numbers ------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) with linear interpolation, like percentile_cont."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """n, mean, p50, p99 and max of a sample."""
    if not values:
        return {"n": 0, "mean": math.nan, "p50": math.nan, "p99": math.nan, "max": math.nan}
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "p50": percentile(values, 0.5),
        "p99": percentile(values, 0.99),
        "max": max(values),
    }


def ms(seconds: float) -> str:
    """Seconds as milliseconds for a table cell."""
    if math.isnan(seconds):
        return "-"
    value = seconds * 1000
    if abs(value) >= 100:
        return f"{value:,.0f} ms"
    return f"{value:.2f} ms" if abs(value) < 10 else f"{value:.1f} ms"


def ratio(value: float) -> str:
    """A ratio for a table cell."""
    if math.isnan(value) or math.isinf(value):
        return "-"
    if value >= 100:
        return f"{value:,.0f}x"
    return f"{value:.2f}x"


def safe_div(a: float, b: float) -> float:
    """a / b, NaN when b is 0."""
    return a / b if b else math.nan


def cpu_by_process(pids: Sequence[int], *, children: bool = False) -> dict[int, float]:
    """User plus system CPU seconds of each of ``pids`` (and, with ``children``, of each of
    their child processes), from Linux's /proc; a process that is gone is left out."""
    tick = os.sysconf("SC_CLK_TCK")
    wanted = set(pids)
    found: dict[int, float] = {}
    listed = (int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit())
    for pid in listed if children else wanted:
        try:
            # The fields after the command name, which is in parentheses and may hold spaces:
            # state (3rd field) first, so ppid is [1], utime [11] and stime [12].
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if pid in wanted or (children and int(fields[1]) in wanted):
            found[pid] = (int(fields[11]) + int(fields[12])) / tick
    return found


# -- output -------------------------------------------------------------------------------------


def write_result(ctx: Context, result: Result) -> Path:
    """Write ``NAME.json`` (atomically) and return its path."""
    ctx.results_dir.mkdir(parents=True, exist_ok=True)
    path = ctx.results_dir / f"{result.name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result.to_json(), indent=2, default=_jsonable) + "\n")
    tmp.replace(path)
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def print_table(result: Result) -> None:
    """The result's table on stdout, columns aligned."""
    table = result.table
    widths = [
        max(len(cell) for cell in column) for column in zip(table.headers, *table.rows, strict=True)
    ]
    line = "  ".join("-" * width for width in widths)
    print(f"\n{result.name}: {result.title}")
    print("  ".join(h.ljust(w) for h, w in zip(table.headers, widths, strict=True)))
    print(line)
    for row in table.rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    verdict = {True: "MET", False: "MISSED", None: "NOT MEASURED"}[result.met]
    print(f"goal: {result.goal}\n=> {verdict}: {result.headline}\n")


def load_results(results_dir: Path, order: Sequence[str]) -> list[Result]:
    """Every ``NAME.json`` in ``results_dir``, in the registry's order."""
    found = []
    for path in sorted(results_dir.glob("*.json")):
        try:
            found.append(Result.from_json(json.loads(path.read_text())))
        except (ValueError, TypeError, KeyError) as error:
            print(f"skipping {path}: {error}")
    rank = {name: i for i, name in enumerate(order)}
    return sorted(found, key=lambda r: (rank.get(r.name, len(rank)), r.name))


def render_report(results: Sequence[Result], results_dir: Path, report_path: Path) -> str:
    """REPORT.md's text, from the results."""
    rel = Path(os.path.relpath(results_dir, report_path.parent))
    out = [
        "# Benchmarks",
        "",
        "Generated by `python -m bench` from the JSON files in "
        f"`{rel.as_posix()}/`; do not edit by hand. Every figure is a ratio against an "
        "alternative measured in the same run on the same PostgreSQL. Benchmarks are not "
        "tests: a missed goal is reported as measured, with what would close the gap.",
        "",
        "| benchmark | goal | result | headline |",
        "|---|---|---|---|",
    ]
    for r in results:
        out.append(f"| [{r.name}](#{r.name}) | {r.goal} | {_verdict(r.met)} | {r.headline} |")
    for r in results:
        out += ["", f"## {r.name}", "", f"**{r.title}**", ""]
        out += [f"- **Goal:** {r.goal}", f"- **Result:** {_verdict(r.met)}: {r.headline}"]
        out += [f"- **Command:** `{r.command}` ({r.seconds:.0f} s)", ""]
        out += _markdown_table(r.table)
        if r.notes:
            out.append("")
            out += [f"- {note}" for note in r.notes]
        for plot in r.plots:
            out += ["", f"![{plot}]({(rel / plot).as_posix()})"]
        out += ["", _conditions_line(r)]
    return "\n".join(out) + "\n"


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "**missed**", None: "not measured"}[met]


def _markdown_table(table: Table) -> list[str]:
    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return [row(table.headers), row(["---"] * len(table.headers)), *map(row, table.rows)]


def _conditions_line(r: Result) -> str:
    c = r.conditions
    machine = c.get("machine", {})
    server = c.get("server", {})
    parts = [
        f"date {c.get('date')}",
        f"{machine.get('cpu_count')} CPUs, {machine.get('platform')}",
        f"Python {c.get('python')}",
        f"psycopg {c.get('psycopg')} (libpq {c.get('libpq')})",
        f"reactor at {c.get('reactor_version')}",
    ]
    if c.get("postgres"):
        parts.append(f"PostgreSQL {c.get('postgres')} ({server.get('source')})")
        shown = ("fsync", "synchronous_commit", "full_page_writes", "shared_buffers", "autovacuum")
        parts.append(", ".join(f"{k}={server[k]}" for k in shown if k in server))
    extra = {k: v for k, v in c.items() if k not in _BASE_CONDITIONS}
    if extra:
        parts.append(", ".join(f"{k} {v}" for k, v in extra.items()))
    settings = ", ".join(f"{k}={v}" for k, v in r.settings.items())
    return f"<sub>Conditions: {'; '.join(parts)}. Settings: {settings}.</sub>"


_BASE_CONDITIONS = {
    "date",
    "python",
    "psycopg",
    "libpq",
    "machine",
    "postgres",
    "server",
    "reactor_version",
}
