"""Rows held by open transactions in a backlog, under a fault: every replica is cut off while
jobs come due, and as the database comes back three tabs begin saving three of the backlog's
runs and keep their transactions open. Each held row costs only itself: the rest of the backlog
is recorded while they stay open, and each held job is settled once its tab commits.

The replicas reach the database through the fault proxy, which holds their connections back
until the tabs have locked their rows: otherwise a replica that reconnects first may record a
held job before its tab begins, and the scenario would test nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import anyio
import pytest

from reactor.demo.embedded import EmbeddedPostgres
from tests.faults.proxy import FaultProxy
from tests.faults.scenario import Scenario
from tests.faults.support import Conn, all_recorded, connect, unsettled, with_port
from tests.faults.tables import JobId, Tables
from tests.polling import eventually

pytestmark = pytest.mark.anyio

HELD = 3


@contextlib.contextmanager
def tabs_saving(tables: Tables, dsn: str, jobs: list[JobId]) -> Iterator[list[Conn]]:
    """A tab per job saving its run in a transaction left open until the block ends, which
    commits them (the tabs' saves win)."""
    with contextlib.ExitStack() as stack:
        tabs = [stack.enter_context(connect(dsn)) for _ in jobs]
        for tab, job in zip(tabs, jobs, strict=True):
            tab.execute("BEGIN")
            tables.client_save(tab, job)
        yield tabs
        for tab in tabs:
            tab.execute("COMMIT")


async def test_rows_held_in_a_backlog_hold_up_only_themselves(
    scenario: Scenario, embedded: EmbeddedPostgres, proxy: FaultProxy
) -> None:
    app = scenario.app(seed=23, reanalyse_ratio=0.0)
    async with scenario.fleet(with_port(scenario.database_url, proxy.port)):
        await scenario.drive(app, 1.0)
        backlog = await anyio.to_thread.run_sync(lambda: app.finish(40, save=False))
        await anyio.to_thread.run_sync(embedded.stop, "fast")
        try:
            await scenario.drive(app, 6.0)
        finally:
            # No replica reaches the server until the tabs hold their rows.
            proxy.partition()
            await anyio.to_thread.run_sync(embedded.start)
        back = time.monotonic()
        held, rest = backlog[:HELD], backlog[HELD:]
        tables, dsn = scenario.tables, scenario.database_url
        with tabs_saving(tables, dsn, held):
            proxy.heal()

            await eventually(lambda: all_recorded(tables, dsn, rest), timeout=30)
            drained = time.monotonic() - back
            # The held rows are still the tabs' to write: nothing wrote them meanwhile.
            assert unsettled(tables, dsn, held) == HELD
        await scenario.drive(app, 1.0)
        judgement, took = await scenario.verdict(app)
    scenario.conclude(
        f"pg: downtime 6 s, {HELD} rows held by open transactions",
        1,
        judgement,
        recovery=took,
        note=f"the rest of the backlog ({len(rest)} jobs) recorded {drained:.2f}s after the "
        "database was back, the held rows still open",
    )
