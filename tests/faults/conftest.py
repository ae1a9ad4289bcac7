"""Fixtures of the fault suite: in-process reactors at any DSN, the fault proxy, reactor
processes, the app, and the results table.

Every scenario adds a row with ``report(...)``; at the end of the session the table is printed
and, when ``REACTOR_FAULTS_REPORT`` names a file, written there as Markdown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Literal, cast

import anyio
import pytest

from reactor import db
from reactor.config import Settings
from reactor.embedded import EmbeddedPostgres
from reactor.hooks import open_hooks
from reactor.service import POOL_SIZE, Reactor
from tests.conftest import FAULT_ROW, Server
from tests.faults.proxy import FaultProxy
from tests.faults.scenario import REPLICAS, Scenario
from tests.faults.support import FaultWindows, Judgement, Replicas, Workload, host_port

StartReactor = Callable[..., AbstractAsyncContextManager[Reactor]]


def _cells(scenario: str, cycles: int, judgement: Judgement, recovery: float | None) -> str:
    v = judgement.verdict

    def sec(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    return (
        f"| {scenario} | {cycles} | {v.jobs} | {v.lost} | {v.dup} | {v.clobbered} "
        f"| {v.early} | {v.wrong} | {judgement.stale} | {sec(v.lateness_max)} "
        f"| {sec(v.lateness_p99)} | {sec(recovery)} |"
    )


class Report:
    """Adds this test's rows to the session's table."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._properties = request.node.user_properties

    def __call__(
        self,
        scenario: str,
        cycles: int,
        judgement: Judgement,
        *,
        recovery: float | None = None,
        note: str = "",
    ) -> None:
        cells = _cells(scenario, cycles, judgement, recovery)
        self._properties.append((FAULT_ROW, (cells, note)))


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Report:
    return Report(request)


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
def workload(database_url: str) -> Iterator[Callable[..., Workload]]:
    """``workload(grace=1.0, seed=...)``: the app against the test database."""
    made: list[Workload] = []

    def make(**kwargs: Any) -> Workload:
        app = Workload(database_url, **kwargs)
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()


@pytest.fixture
def reactor_at() -> StartReactor:
    """``async with reactor_at(dsn, grace=1.0) as r:``: an in-process reactor using ``dsn``.

    Keyword arguments are Settings fields (``listen_dsn`` is passed to Reactor). Probes are fast
    (1 s), the drain short (2 s) and the scan interval long (30 s), so recovery within seconds
    proves the reconnect path, not the periodic scan.
    """

    @asynccontextmanager
    async def start(
        dsn: str, listen_dsn: str | None = None, **overrides: Any
    ) -> AsyncIterator[Reactor]:
        fields: dict[str, Any] = {
            "database_url": dsn,
            "grace": 1.0,
            "scan_interval": 30.0,
            "http_addr": None,
            "probe_interval": 1.0,
            "probe_timeout": 1.0,
            "drain": 2.0,
            **overrides,
        }
        settings = Settings(**fields)
        async with (
            db.make_pool(dsn, max_size=POOL_SIZE) as pool,
            open_hooks(settings, pool) as hooks,
        ):
            database = db.Database(pool, grace=settings.grace, hooks=list(hooks))
            reactor = Reactor(settings, database, hooks=hooks, listen_dsn=listen_dsn)
            async with anyio.create_task_group() as tg:
                await tg.start(reactor.run)
                try:
                    yield reactor
                finally:
                    reactor.stop()

    return start


@pytest.fixture(params=REPLICAS, ids=lambda n: f"{n}-replica")
def scenario(
    request: pytest.FixtureRequest,
    database_url: str,
    reactor_at: StartReactor,
    workload: Callable[..., Workload],
    report: Report,
) -> Scenario:
    """An in-process scenario's app, replicas and verdict; once per entry of ``REPLICAS``."""
    return Scenario(database_url, reactor_at, workload, report, replicas=request.param)
