"""Each named query is written once and runs the same through either connector.

A Database on a ``Pooled`` connector runs a query as a pinned call on a pool connection, one on
a ``Dedicated`` connector as a bare statement on a connection of the caller's own. Reading the
same state both ways proves the two agree, and every row type decoding by column name proves
that its fields and its query's aliases still match: a renamed alias fails here instead of
filling the wrong field.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest

from reactor import db
from reactor.core.ownership import share_of
from reactor.install import REFERENCE_INSTALL
from reactor.settings.config import Settings
from tests.helpers import Conn
from tests.integration.support import add_job

pytestmark = pytest.mark.anyio

GRACE = 60.0
HOOK = "judge"

Connectors = tuple[db.Database, db.Database]


@pytest.fixture
async def connectors(database_url: str) -> AsyncIterator[Connectors]:
    """The queries (pooled, dedicated), on the same database."""
    async with (
        db.make_pool(database_url, max_size=1) as pool,
        await db.connect(database_url, "test") as conn,
    ):
        pooled = db.Database.pooled(
            REFERENCE_INSTALL, pool, settings=Settings(grace=GRACE), hooks=[HOOK]
        )
        yield pooled, pooled.using(conn)


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
    check = db.HealthCheck("replica-a", 15.0, 86400.0)

    seen: list[dict[str, Any]] = []
    for on in connectors:
        upcoming = await on.upcoming(10)
        polled = await on.poll_queue(None, ahead=2 * GRACE, limit=10)
        hooks, total, failed = await on.list_hooks(failed_only=True, limit=10)
        health = await on.health(check)
        seen.append(
            {
                "upcoming": [job_id for job_id, _ in upcoming],
                "oldest_queued": await on.oldest_queued(10),
                "polled": sorted(job.job_id for job in polled.jobs),
                "window_end": type(polled.high),
                "hooks": (hooks, total, failed),
                "next_hook_in": await on.next_hook_in(),
                "reconcile": await on.last_reconcile_pass(),
                "job_trigger": await on.job_trigger(),
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
    assert pooled["job_trigger"] == db.JobTrigger(
        "analysis_jobs_terminal", spread=False, enabled=True
    )
    assert pooled["live"] == (["replica-a"], 1, "analysis_jobs_terminal")


async def test_the_reconcile_step_decodes_the_same_either_way(
    conn: Conn, connectors: Connectors
) -> None:
    add_job(conn, status="complete", results={"verdicts": [1]}, age=5)
    conn.execute("DELETE FROM reactor.pending")  # gone around the triggers: drift
    pooled, dedicated = connectors
    first = await pooled.reconcile_step(owner="a", interval=60, force=True)
    second = await dedicated.reconcile_step(owner="b", interval=60, force=True)
    assert (first.outcome, second.outcome) == ("completed", "completed")
    assert second.pass_number == first.pass_number + 1
    assert len(first.found) == 1
    assert second.found == []
    assert (first.pass_found, second.pass_found) == (1, 0)
    last = await dedicated.last_reconcile_pass()
    assert (last.number, last.found, last.owner) == (second.pass_number, 0, "b")


async def test_hook_changes_and_claims_decode_by_name(conn: Conn, connectors: Connectors) -> None:
    pooled, dedicated = connectors
    hook_row = parked_hook_row(conn)
    missing = 999_999
    refused = await dedicated.cancel_hooks([hook_row, missing])
    assert refused == [
        db.HookChange(hook_row, "failed", False),
        db.HookChange(missing, None, False),
    ]
    assert await pooled.retry_hooks([hook_row]) == [db.HookChange(hook_row, "failed", True)]
    [claim] = await pooled.claim_hooks(10, 60.0)
    assert (claim.id, claim.hook, claim.attempt, claim.retry_base) == (hook_row, HOOK, 3, 2)
    assert not claim.superseded
    assert not claim.parked
    assert claim.scheduled_attempt == 1
    await dedicated.release_hook(claim)
    assert await dedicated.next_hook_in() is not None


async def test_a_dead_replicas_running_hook_rows_are_taken_back_at_the_next_check(
    conn: Conn, connectors: Connectors
) -> None:
    pooled, dedicated = connectors
    hook_row = parked_hook_row(conn)
    await pooled.retry_hooks([hook_row])
    # The dead replica claimed the row under a long lease, and its LISTEN session is gone: its
    # heartbeat row names a session no longer there.
    [leased] = await pooled.claim_hooks(10, 3600.0, replica="dead")
    assert leased.id == hook_row
    conn.execute(
        "INSERT INTO reactor.replicas (id, session_pid) VALUES ('dead', 2147483647), "
        "('frozen', NULL)"
    )
    assert await pooled.claim_hooks(10, 3600.0, replica="alive") == []

    check = db.HealthCheck(replica="alive", liveness=30.0, retention=3600.0)
    health = await dedicated.health(check)
    assert health.hooks_orphaned == 1
    assert "dead" not in health.live_replicas
    # Due at once: the next claim takes it as a lease that ran out, and counts the attempt.
    [again] = await pooled.claim_hooks(10, 60.0, replica="alive")
    assert (again.id, again.attempt) == (hook_row, leased.attempt + 1)
    error = conn.execute(
        "SELECT last_error, leased_by FROM reactor.hook_outbox WHERE id = %s", (hook_row,)
    ).fetchone()
    assert error is not None
    assert "its replica died" in error[0]
    assert error[1] == "alive"

    # A live replica's rows, and a replica's before its first heartbeat, stay under their lease.
    conn.execute("UPDATE reactor.hook_outbox SET leased_by = 'frozen' WHERE id = %s", (hook_row,))
    assert (await dedicated.health(check)).hooks_orphaned == 0
    conn.execute("UPDATE reactor.hook_outbox SET leased_by = 'unborn' WHERE id = %s", (hook_row,))
    assert (await dedicated.health(check)).hooks_orphaned == 0
    assert await pooled.claim_hooks(10, 60.0, replica="alive") == []


async def test_a_poll_reads_only_the_shares_it_is_given(conn: Conn, connectors: Connectors) -> None:
    jobs = [
        str(add_job(conn, status="complete", results={"verdicts": [1]}, age=5)[0])
        for _ in range(12)
    ]
    mine = {share_of(jobs[0]), share_of(jobs[1])}
    for on in connectors:
        everyone = await on.poll_queue(None, ahead=2 * GRACE, limit=100)
        assert {job.job_id for job in everyone.jobs} == set(jobs)
        polled = await on.poll_queue(None, ahead=2 * GRACE, limit=100, shares=mine)
        assert {job.job_id for job in polled.jobs} == {j for j in jobs if share_of(j) in mine}
        assert 2 <= len(polled.jobs) < len(jobs)
