"""Each named query is written once and runs the same through either connector.

A ``Pooled`` connector runs a query as a pinned call on a pool connection, a ``Dedicated`` one
as a bare statement on a connection of the caller's own. Reading the same state both ways proves
the two agree, and every row type decoding by column name proves that its fields and its
query's aliases still match: a renamed alias fails here instead of filling the wrong field.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest

from reactor import db
from tests.helpers import Conn
from tests.integration.support import add_job

pytestmark = pytest.mark.anyio

GRACE = 60.0
HOOK = "judge"

Connectors = tuple[db.Connector, db.Connector]


@pytest.fixture
async def connectors(database_url: str) -> AsyncIterator[Connectors]:
    """(pooled, dedicated), on the same database."""
    async with (
        db.make_pool(database_url, max_size=1) as pool,
        await db.connect(database_url, "test") as conn,
    ):
        yield db.Pooled(pool), db.Dedicated(conn)


@pytest.fixture
def conn(database_url: str) -> Iterator[Conn]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


def parked_hook_row(conn: Conn) -> int:
    """A failed hook outbox row of a run that holds its job; its id."""
    job_id, run_id = add_job(conn, status="complete", results={"verdicts": [1]})
    conn.execute(
        "INSERT INTO analysis_runs (id, job_id, doc_html, results, saved_by) "
        "VALUES (%s, %s, '<p>body</p>', '{\"verdicts\": [1]}', 'worker')",
        (run_id, job_id),
    )
    row = conn.execute(
        "INSERT INTO reactor.hook_outbox (run_id, job_id, hook, status, attempts, last_error) "
        "VALUES (%s, %s, %s, 'failed', 2, 'HTTP 503') RETURNING id",
        (run_id, job_id, HOOK),
    ).fetchone()
    assert row is not None
    return int(row[0])


async def test_reads_agree_through_the_pool_and_on_a_dedicated_connection(
    conn: Conn, connectors: Connectors
) -> None:
    waiting, _ = add_job(conn, status="complete", results={"verdicts": [1]}, age=5)
    overdue, _ = add_job(conn, status="complete", results={"verdicts": [1]}, age=2 * GRACE)
    hook_row = parked_hook_row(conn)
    check = db.HealthCheck("replica-a", 15.0, 86400.0, "test_channel")

    seen: list[dict[str, Any]] = []
    for on in connectors:
        upcoming = await db.upcoming(on, 10, grace=GRACE)
        polled, high = await db.poll_queue(on, None, grace=GRACE, ahead=2 * GRACE, limit=10)
        hooks, total, failed = await db.list_hooks(on, failed_only=True, limit=10)
        health = await db.health(on, check, grace=GRACE)
        seen.append(
            {
                "upcoming": [job_id for job_id, _ in upcoming],
                "oldest_queued": await db.oldest_queued(on, 10, grace=GRACE),
                "polled": sorted(job.job_id for job in polled),
                "window_end": type(high),
                "hooks": (hooks, total, failed),
                "next_hook_in": await db.next_hook_in(on, hooks=[HOOK]),
                "reconcile": await db.last_reconcile_pass(on),
                "job_trigger": await db.job_trigger(on),
                "live": (health.live_replicas, health.hook_failed, health.trigger_channel),
            }
        )
    pooled, dedicated = seen
    assert pooled == dedicated
    assert pooled["upcoming"] == [str(waiting)]
    assert pooled["oldest_queued"] == [str(overdue)]
    assert set(pooled["polled"]) >= {str(waiting), str(overdue)}
    [hook] = pooled["hooks"][0]
    assert (hook.id, hook.hook, hook.status, hook.attempts) == (hook_row, HOOK, "failed", 2)
    assert pooled["hooks"][1:] == (1, 1)
    assert pooled["next_hook_in"] is None  # a parked row is not claimable
    assert pooled["job_trigger"] == ("analysis_jobs_terminal", True)
    assert pooled["live"] == (["replica-a"], 1, "analysis_jobs_terminal")


async def test_the_reconcile_step_decodes_the_same_either_way(
    conn: Conn, connectors: Connectors
) -> None:
    add_job(conn, status="complete", results={"verdicts": [1]}, age=5)
    conn.execute("DELETE FROM reactor.pending")  # gone around the triggers: drift
    pooled, dedicated = connectors
    first = await db.reconcile_step(pooled, owner="a", interval=60, grace=GRACE, force=True)
    second = await db.reconcile_step(dedicated, owner="b", interval=60, grace=GRACE, force=True)
    assert (first.outcome, second.outcome) == ("completed", "completed")
    assert second.pass_number == first.pass_number + 1
    assert len(first.found) == 1
    assert second.found == []
    assert (first.pass_found, second.pass_found) == (1, 0)
    last = await db.last_reconcile_pass(dedicated)
    assert (last.number, last.found, last.owner) == (second.pass_number, 0, "b")


async def test_hook_changes_and_claims_decode_by_name(conn: Conn, connectors: Connectors) -> None:
    pooled, dedicated = connectors
    hook_row = parked_hook_row(conn)
    missing = 999_999
    refused = await db.cancel_hooks(dedicated, [hook_row, missing])
    assert refused == [
        db.HookChange(hook_row, "failed", False),
        db.HookChange(missing, None, False),
    ]
    assert await db.retry_hooks(pooled, [hook_row]) == [db.HookChange(hook_row, "failed", True)]
    [claim] = await db.claim_hooks(pooled, 10, 60.0, hooks=[HOOK])
    assert (claim.id, claim.hook, claim.attempt, claim.retry_base) == (hook_row, HOOK, 3, 2)
    assert not claim.superseded
    assert not claim.parked
    assert claim.scheduled_attempt == 1
    await db.release_hook(dedicated, claim)
    assert await db.next_hook_in(dedicated, hooks=[HOOK]) is not None
