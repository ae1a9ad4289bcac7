"""Rows the app rejects, under a fault: every replica is cut off while jobs come due, and when
the database is back, the oldest of the backlog are jobs whose run the app's own constraint on
its runs table refuses. They cost only themselves: each is set aside, and every other job is
recorded as if they did not exist.
"""

from __future__ import annotations

import time

import anyio
import pytest

from reactor.demo.embedded import EmbeddedPostgres
from tests.faults.scenario import Scenario
from tests.faults.support import Judgement, connect, scalar
from tests.faults.tables import JobId, Tables

pytestmark = pytest.mark.anyio

BAD_JOBS = 3


def _add_rejected_jobs(tables: Tables, dsn: str, count: int) -> set[JobId]:
    """Finished jobs whose run the app's constraint refuses; they head the backlog."""
    with connect(dsn) as conn:
        conn.execute(
            tables.render(
                "ALTER TABLE @runs@ ADD CONSTRAINT no_flagged CHECK (NOT @results@ ? 'flagged')"
            )
        )
        flagged = '{"flagged": true}'
        return {
            tables.add_job(conn, finished=True, doc="<p/>", results=flagged)[0]
            for _ in range(count)
        }


def _only_the_rejected_are_owed(judgement: Judgement) -> bool:
    counts = judgement.counts()
    return counts.pop("lost") == BAD_JOBS and not any(counts.values())


async def test_rejected_rows_at_the_head_of_a_backlog_cost_only_themselves(
    scenario: Scenario, embedded: EmbeddedPostgres
) -> None:
    app = scenario.app(seed=21)
    async with scenario.fleet():
        await scenario.drive(app, 1.0)
        bad = _add_rejected_jobs(scenario.tables, scenario.database_url, BAD_JOBS)
        await scenario.finish(app, 40)  # due while every replica is cut off
        await anyio.to_thread.run_sync(embedded.stop, "fast")
        stopped = time.monotonic()
        try:
            await scenario.drive(app, 6.0)
        finally:
            await anyio.to_thread.run_sync(embedded.start)
        started = time.monotonic()
        await scenario.drive(app, 1.0)
        judgement, took = await scenario.verdict(app, until=_only_the_rejected_are_owed)
    with connect(scenario.database_url) as conn:
        held = {row[0] for row in conn.execute("SELECT job_id FROM reactor.set_aside")}
        recorded = scalar(
            conn,
            scenario.tables.render("SELECT count(*) FROM @runs@ WHERE @saved_by@ = @worker@"),
        )
    scenario.report(
        f"pg: downtime 6 s, {BAD_JOBS} rejected rows at the head"
        + ("" if scenario.replicas == 1 else f" ({scenario.replicas} replicas)"),
        1,
        judgement,
        recovery=took,
        note=f"down {started - stopped:.1f}s; {len(held)} set aside, {recorded} worker runs",
    )
    assert _only_the_rejected_are_owed(judgement), str(judgement)
    assert held == bad
    assert recorded > 0
