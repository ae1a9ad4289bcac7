"""Rows the app rejects, under a fault: every replica is cut off while jobs come due, and when
the database is back, the oldest of the backlog are jobs whose run the app's own constraint on
analysis_runs refuses. They cost only themselves: each is set aside, and every other job is
recorded as if they did not exist.
"""

from __future__ import annotations

import time
import uuid

import anyio
import pytest

from reactor.embedded import EmbeddedPostgres
from tests.faults.scenario import Scenario
from tests.faults.support import Judgement, connect, scalar

pytestmark = pytest.mark.anyio

BAD_JOBS = 3


def _add_rejected_jobs(dsn: str, count: int) -> set[uuid.UUID]:
    """Finished jobs whose run the app's constraint refuses; they head the backlog."""
    with connect(dsn) as conn:
        conn.execute(
            "ALTER TABLE analysis_runs ADD CONSTRAINT no_flagged CHECK (NOT results ? 'flagged')"
        )
        jobs = {uuid.uuid4() for _ in range(count)}
        for job in jobs:
            conn.execute(
                "INSERT INTO analysis_jobs (id, run_id, status, doc_html, results) "
                "VALUES (%s, %s, 'complete', '<p/>', '{\"flagged\": true}')",
                (job, uuid.uuid4()),
            )
    return jobs


def _only_the_rejected_are_owed(judgement: Judgement) -> bool:
    counts = judgement.counts()
    return counts.pop("lost") == BAD_JOBS and not any(counts.values())


async def test_rejected_rows_at_the_head_of_a_backlog_cost_only_themselves(
    scenario: Scenario, embedded: EmbeddedPostgres
) -> None:
    app = scenario.app(seed=21)
    async with scenario.fleet():
        await scenario.drive(app, 1.0)
        bad = _add_rejected_jobs(scenario.database_url, BAD_JOBS)
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
        recorded = scalar(conn, "SELECT count(*) FROM analysis_runs WHERE saved_by = 'worker'")
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
