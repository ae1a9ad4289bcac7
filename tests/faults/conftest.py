"""Fixtures of the fault suite: the app's tables on each mapping, in-process reactors at any
DSN, the fault proxy, reactor processes, the app, and the results table.

Every scenario runs on the tables of each mapping that ``REACTOR_FAULT_MAPPING`` names
(:data:`MAPPINGS`), with that mapping in force, and with ``REACTOR_FAULT_SPREAD=1`` on a job
trigger installed with ``--spread``; with ``REACTOR_FAULT_PAIRS=2`` every replica serves the
other mapping's tables too, as a second pair beside the scenario's (:class:`Scenario` drives and
judges it). Every scenario adds a row with ``report(...)``;
at the end of the session the table is printed and, when ``REACTOR_FAULTS_REPORT`` names a
file, written there as Markdown.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, cast

import psycopg
import pytest

from reactor.demo.embedded import EmbeddedPostgres
from reactor.runtime.replica import open_replica
from reactor.runtime.service import Reactor
from reactor.settings.config import Settings
from reactor.settings.pairs import Pair
from tests.conftest import FAULT_ROW, Server
from tests.faults import tables as app_tables
from tests.faults.proxy import FaultProxy
from tests.faults.scenario import REPLICAS, Scenario
from tests.faults.support import (
    FaultWindows,
    Judgement,
    Replicas,
    Workload,
    host_port,
    report_cells,
)
from tests.faults.tables import Tables
from tests.helpers import IN_PROCESS_SETTINGS

StartReactor = Callable[..., AbstractAsyncContextManager[Reactor]]

# The mappings whose tables each scenario runs on, from REACTOR_FAULT_MAPPING: "second" runs
# the suite on tests/mappings/second, "reference,second" on both, one after the other. Unset,
# the scenarios marked second_mapping run on both, the rest on the reference: the default
# suite's sample of the second.
_CHOSEN = os.environ.get("REACTOR_FAULT_MAPPING", "")
MAPPINGS: tuple[str, ...] = tuple(n.strip() for n in _CHOSEN.split(",") if n.strip())
for _name in MAPPINGS:
    if _name not in app_tables.BY_NAME:
        raise ValueError(
            f"REACTOR_FAULT_MAPPING names {_name!r}; the mappings are "
            + ", ".join(app_tables.BY_NAME)
        )


# REACTOR_FAULT_SPREAD=1: the job trigger of every scenario notifies each share of the jobs on a
# channel of its own (`reactor migrate --spread`), as a fleet's should.
SPREAD = os.environ.get("REACTOR_FAULT_SPREAD", "") not in ("", "0")
# REACTOR_FAULT_PAIRS=2: every replica serves a second pair beside the scenario's (the other
# mapping's tables, in a reactor schema of their own), driven alongside and judged on its own.
PAIRS = int(os.environ.get("REACTOR_FAULT_PAIRS", "1") or "1")
if PAIRS not in (1, 2):
    raise ValueError(f"REACTOR_FAULT_PAIRS={PAIRS}: 1, or 2 for a companion pair")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "tables" not in metafunc.fixturenames:
        return
    names = MAPPINGS or ("reference",)
    if not MAPPINGS and metafunc.definition.get_closest_marker("second_mapping"):
        names = ("reference", "second")
    metafunc.parametrize("tables", names, indirect=True)


class Templates:
    """The template database of each app's tables on the test server, made on first use."""

    def __init__(self, server: Server, reference: str) -> None:
        self._server = server
        # The suite's own template holds the reference tables alone; with a companion pair,
        # they get one of their own too.
        self._made = {} if PAIRS == 2 else {"reference": (reference, app_tables.REFERENCE)}

    def __getitem__(self, name: str) -> tuple[str, Tables]:
        """(template database, the tables with their mapping typed)."""
        if name not in self._made:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            template = f"reactor_test_{name}_{worker}"
            with psycopg.connect(self._server.admin_dsn, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {template}")
                conn.execute(f"CREATE DATABASE {template}")
            chosen = app_tables.BY_NAME[name]
            if PAIRS == 2:
                chosen = chosen.with_companion()
            installed = chosen.install(self._server.dsn_for(template))
            self._made[name] = (template, installed)
        return self._made[name]


@pytest.fixture(scope="session")
def templates(server: Server, template: str) -> Templates:
    return Templates(server, template)


@pytest.fixture
def tables(request: pytest.FixtureRequest, templates: Templates) -> Tables:
    """The app's tables of this run of the scenario."""
    _, chosen = templates[request.param]
    return chosen


@pytest.fixture
def database_url(server: Server, templates: Templates, tables: Tables) -> Iterator[str]:
    """A fresh database of the scenario's tables, cloned from their template; dropped after."""
    template, _ = templates[tables.name]
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {template}")
    dsn = server.dsn_for(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables.adopt(conn)
    if SPREAD:
        tables.migrate(dsn, spread=True)
    yield dsn
    with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


class Report:
    """Adds this test's rows to the session's table; a scenario on another mapping than the
    reference is named with it."""

    def __init__(self, request: pytest.FixtureRequest, tables: Tables) -> None:
        self._properties = request.node.user_properties
        self._tables = tables

    def __call__(
        self,
        scenario: str,
        cycles: int,
        judgement: Judgement,
        *,
        recovery: float | None = None,
        unhooked: int | None = None,
        note: str = "",
    ) -> None:
        if self._tables.name != "reference":
            scenario = f"{scenario} [{self._tables.name} mapping]"
        cells = report_cells(scenario, cycles, judgement, recovery=recovery, unhooked=unhooked)
        self._properties.append((FAULT_ROW, (cells, note)))


@pytest.fixture
def report(request: pytest.FixtureRequest, tables: Tables) -> Report:
    return Report(request, tables)


@pytest.fixture
def fault_windows(database_url: str) -> FaultWindows:
    """Where the fault fixtures note their outages, for the verdict's lateness."""
    return FaultWindows(database_url)


class _NotedServer:
    """The test server's process; its stops and starts are noted as fault windows."""

    def __init__(self, pg: EmbeddedPostgres, windows: FaultWindows) -> None:
        self._pg = pg
        self._windows = windows

    def stop(self, mode: Literal["smart", "fast", "immediate"] = "fast") -> None:
        self._windows.begin()
        self._pg.stop(mode)

    def start(self) -> None:
        self._pg.start()
        self._windows.end()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pg, name)


@pytest.fixture
def embedded(server: Server, fault_windows: FaultWindows) -> Iterator[EmbeddedPostgres]:
    """The test server's process, for tests that stop, kill or freeze it; it is up after. Its
    stops and starts are fault windows."""
    if server.embedded is None:
        pytest.skip("the test server is not ours to stop or signal")
    yield cast(EmbeddedPostgres, _NotedServer(server.embedded, fault_windows))
    server.embedded.start()


@pytest.fixture
def proxy(database_url: str, fault_windows: FaultWindows) -> Iterator[FaultProxy]:
    """A fault proxy in front of the test database's server; its partitions are fault
    windows."""
    host, port = host_port(database_url)
    fault_proxy = FaultProxy(
        host, port, on_partition=fault_windows.begin, on_heal=fault_windows.end
    ).start()
    try:
        yield fault_proxy
    finally:
        fault_proxy.close()


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[Replicas]:
    """``reactor run`` processes, killed at the end if still running."""
    group = Replicas(tmp_path)
    try:
        yield group
    finally:
        group.close()


@pytest.fixture
def workload(database_url: str, tables: Tables) -> Iterator[Callable[..., Workload]]:
    """``workload(grace=1.0, seed=...)``: the app against the test database."""
    made: list[Workload] = []

    def make(**kwargs: Any) -> Workload:
        app = Workload(database_url, tables, **kwargs)
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()


@pytest.fixture
def reactor_at(tables: Tables) -> StartReactor:
    """``async with reactor_at(dsn, grace=1.0) as r:``: an in-process reactor using ``dsn``.

    Keyword arguments are Settings fields (``listen_dsn``: where the LISTEN session connects).
    Probes are fast (1 s), the drain short (2 s) and the scan interval long (30 s), so recovery
    within seconds proves the reconnect path, not the periodic scan.
    """

    @asynccontextmanager
    async def start(
        dsn: str, listen_dsn: str | None = None, **overrides: Any
    ) -> AsyncIterator[Reactor]:
        fields: dict[str, Any] = {
            "database_url": dsn,
            "grace": 1.0,
            **IN_PROCESS_SETTINGS,
            "drain": 2.0,
            **overrides,
        }
        settings = Settings(**fields)
        served = [Pair.of(tables.mapping, settings)]
        if tables.companion is not None:
            # The second pair runs beside the first in the same replica, on its pool.
            served.append(Pair.of(tables.companion.mapping, replace(settings, channel=None)))
        async with (
            open_replica(settings, served, listen_dsn=listen_dsn) as replica,
            replica.running(),
        ):
            yield replica.reactors[served[0].name]

    return start


@pytest.fixture(params=REPLICAS, ids=lambda n: f"{n}-replica")
def scenario(
    request: pytest.FixtureRequest,
    database_url: str,
    tables: Tables,
    reactor_at: StartReactor,
    workload: Callable[..., Workload],
    report: Report,
) -> Scenario:
    """An in-process scenario's app, replicas and verdict; once per entry of ``REPLICAS``."""
    return Scenario(database_url, tables, reactor_at, workload, report, replicas=request.param)
