"""Hooks under operation, on a real PostgreSQL: superseded runs, blocking hooks, leases that ran
out, re-driving parked rows, retention, and periodic queries that never read the settled rows."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import psycopg
import psycopg.conninfo
import pytest

from reactor import db
from reactor.install import REFERENCE_INSTALL
from reactor.insurance.retention import HookRetention
from reactor.settings.config import Settings
from reactor.status.model import collect
from reactor.status.risks import risks
from tests import hookmods
from tests import pgbouncer as bouncer
from tests.conftest import NewRole
from tests.helpers import finish, new_job, run_row
from tests.integration.conftest import StartReactor
from tests.integration.support import add_job, worker_lateness
from tests.polling import eventually

pytestmark = pytest.mark.anyio

RESULTS = {"verdicts": [1]}


@pytest.fixture(autouse=True)
def _reset_hooks() -> None:
    hookmods.reset()


@pytest.fixture
def conn(database_url: str) -> Any:
    with psycopg.connect(database_url, autocommit=True) as connection:
        yield connection


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[db.Database]:
    async with db.make_pool(database_url, max_size=2) as pool:
        yield db.Database.pooled(REFERENCE_INSTALL, pool, hooks=["judge"])


def rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """(job_id, status, attempts) of every outbox row, by job creation."""
    return conn.execute(
        "SELECT o.job_id, o.status, o.attempts FROM reactor.hook_outbox o "
        "JOIN analysis_jobs j ON j.id = o.job_id ORDER BY j.created_at"
    ).fetchall()


def statuses(conn: psycopg.Connection[Any]) -> list[str]:
    return [status for _, status, _ in rows(conn)]


# -- superseded ----------------------------------------------------------------------------------


async def test_a_replaced_runs_hook_is_superseded_and_never_called(
    conn: psycopg.Connection[Any], database: db.Database, start_reactor: StartReactor
) -> None:
    run_id = uuid.uuid4()
    first, _ = add_job(
        conn, run_id=run_id, status="complete", results=RESULTS, created_age=60, age=10
    )
    await database.record_jobs([str(first)])
    # A re-analysis of the same run finishes and replaces the run before the hook ran.
    second, _ = add_job(conn, run_id=run_id, status="complete", results=RESULTS, age=5)
    await database.record_jobs([str(second)])
    assert run_row(conn, run_id) == (second, "worker")
    assert statuses(conn) == ["pending", "pending"]

    async with start_reactor(grace=0.0, hooks="judge=python:tests.hookmods:count") as reactor:
        await eventually(lambda: statuses(conn) == ["superseded", "done"])
        superseded = reactor.metrics.hook_outcomes.labels("judge", "superseded")._value.get()
        assert superseded == 1
    assert rows(conn) == [(first, "superseded", 0), (second, "done", 1)]
    # Only the job the run holds was judged, under the key the receiver deduplicates on.
    assert [key for key, _, _ in hookmods.calls] == [f"{run_id}:{second}:judge"]


# -- blocking hooks ------------------------------------------------------------------------------


async def test_a_blocking_hook_no_longer_delays_a_due_record(
    conn: psycopg.Connection[Any], start_reactor: StartReactor
) -> None:
    grace = 0.2
    async with start_reactor(grace=grace, hooks="judge=python:tests.hookmods:blocking"):
        finish(conn, new_job(conn)[0])
        await eventually(hookmods.started.is_set)  # the hook now blocks its thread
        second, second_run = new_job(conn)
        finish(conn, second)
        # On the event loop, the hook would hold everything until its 10 s wait ran out.
        await eventually(lambda: run_row(conn, second_run))
        assert not hookmods.release.is_set()
        hookmods.release.set()
        await eventually(lambda: statuses(conn) == ["done", "done"])
    _, second_lateness = worker_lateness(conn, grace)
    assert 0 <= second_lateness < 1.0, second_lateness
    assert len(hookmods.done) == 2


def blocked(caplog: pytest.LogCaptureFixture, *, at_least_ms: int) -> list[str]:
    """The hooks named by "a hook blocked the event loop" records of at least that long (a
    shorter stall from the loaded test machine may come along; it is not what is tested)."""
    return [
        r.__dict__["hook"]
        for r in caplog.records
        if r.getMessage() == "a hook blocked the event loop"
        and r.__dict__["blocked_ms"] >= at_least_ms
    ]


@pytest.mark.parametrize(
    ("hook", "at_least_ms", "hint"),
    [("hogs_the_loop", 250, "async def"), ("holds_the_gil", 150, "GIL")],
    ids=["an async hook that blocks the loop", "a threaded hook holding the GIL"],
)
async def test_a_hook_that_blocks_the_loop_is_named(
    conn: psycopg.Connection[Any],
    start_reactor: StartReactor,
    caplog: pytest.LogCaptureFixture,
    hook: str,
    at_least_ms: int,
    hint: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="reactor.hooks")
    async with start_reactor(grace=0.1, hooks=f"judge=python:tests.hookmods:{hook}"):
        finish(conn, new_job(conn)[0])
        await eventually(lambda: statuses(conn) == ["done"])
    assert blocked(caplog, at_least_ms=at_least_ms) == ["judge"]
    assert all(hint in r.__dict__["hint"] for r in caplog.records if "hint" in r.__dict__)


# -- leases that ran out -------------------------------------------------------------------------


def held_run(conn: psycopg.Connection[Any]) -> tuple[uuid.UUID, uuid.UUID]:
    """A run that holds its job, as after the reactor recorded it: (run id, job id)."""
    job_id, run_id = new_job(conn)
    conn.execute(
        "INSERT INTO analysis_runs (id, job_id, doc_html, results, saved_by) "
        "VALUES (%s, %s, '<p>body</p>', '{\"verdicts\": [1]}', 'worker')",
        (run_id, job_id),
    )
    return run_id, job_id


def lease_ran_out(
    conn: psycopg.Connection[Any],
    run: tuple[uuid.UUID, uuid.UUID],
    hook: str,
    *,
    attempts: int,
    retry_base: int = 0,
) -> None:
    """An outbox row whose replica died running attempt ``attempts``: running, lease over."""
    conn.execute(
        "INSERT INTO reactor.hook_outbox (run_id, job_id, hook, status, attempts, retry_base, "
        "last_error, available_at, leased_until) VALUES (%s, %s, %s, 'running', %s, %s, "
        "'HTTP 503 from https://judge.internal/hook', now() - interval '1 second', "
        "now() - interval '1 second')",
        (*run, hook, attempts, retry_base),
    )


def by_hook(conn: psycopg.Connection[Any]) -> dict[str, tuple[Any, ...]]:
    """hook: (status, attempts, last_error) of every outbox row."""
    found = conn.execute("SELECT hook, status, attempts, last_error FROM reactor.hook_outbox")
    return {hook: tuple(rest) for hook, *rest in found.fetchall()}


@pytest.mark.parametrize("via", ["direct", "pgbouncer"])
async def test_a_lease_that_ran_out_on_the_last_attempt_is_parked_not_leased_again(
    conn: psycopg.Connection[Any],
    database_url: str,
    start_reactor: StartReactor,
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
    via: str,
) -> None:
    # A hook that kills its process (os._exit, a segfault in a C extension) ends each attempt
    # with its replica: the row stays running until the lease runs out. Leased again, it would
    # take down replica after replica for ever.
    run = held_run(conn)
    lease_ran_out(conn, run, "judge", attempts=3)  # the last of REACTOR_HOOK_MAX_ATTEMPTS=3
    lease_ran_out(conn, run, "ops", attempts=2)  # one attempt left
    # `reactor hooks retry` gave this one a fresh schedule after 3 attempts: 2 of 3 made.
    lease_ran_out(conn, run, "audit", attempts=5, retry_base=3)
    hooks = ",".join(f"{h}=python:tests.hookmods:count" for h in ("judge", "ops", "audit"))
    caplog.set_level(logging.ERROR, logger="reactor.hooks")
    # Behind a transaction pooler the claim sets the maximum for its own transaction too.
    options: dict[str, Any] = {}
    if via == "pgbouncer":
        pooler: bouncer.PgBouncer = request.getfixturevalue("pgbouncer")
        options = {"database_url": pooler.dsn_for(database_url), "mode": "poll"}
    async with start_reactor(grace=0.0, hooks=hooks, hook_max_attempts=3, **options) as reactor:
        await eventually(
            lambda: (
                {h: row[0] for h, row in by_hook(conn).items()}
                == {"judge": "failed", "ops": "done", "audit": "done"}
            )
        )
        failed = reactor.metrics.hook_outcomes.labels("judge", "failed")._value.get()
    rows = by_hook(conn)
    assert rows["judge"] == (
        "failed",
        3,  # the claim counted the attempt that ran out; it made no new one
        "the lease of attempt 3 ran out before it settled: its replica died or stalled while "
        "running it (the last attempt: parked)",
    )
    assert rows["ops"] == ("done", 3, None)
    assert rows["audit"] == ("done", 6, None)
    assert sorted(key.rsplit(":", 1)[1] for key, _, _ in hookmods.calls) == ["audit", "ops"]
    assert failed == 1
    (record,) = [r for r in caplog.records if r.__dict__.get("hook") == "judge"]
    assert "lease of its last attempt ran out" in record.getMessage()
    assert "reactor hooks retry" in record.__dict__["hint"]


def test_the_claim_counts_a_lease_that_ran_out_as_an_attempt(
    conn: psycopg.Connection[Any],
) -> None:
    run = held_run(conn)
    lease_ran_out(conn, run, "judge", attempts=3)
    lease_ran_out(conn, run, "ops", attempts=1)
    params = {"hooks": ["judge", "ops"], "limit": 10, "lease": 60.0, "replica": "test"}

    def claim(max_attempts: int | None) -> dict[str, tuple[Any, ...]]:
        found = conn.execute(
            REFERENCE_INSTALL.query("claim_hooks"), {**params, "max_attempts": max_attempts}
        ).fetchall()
        return {row[3]: (row[4], row[6]) for row in found}  # hook: (attempts, superseded)

    # Parked rows come back with superseded NULL; the other row is leased for its last attempt,
    # its last error saying what became of the one before.
    assert claim(3) == {"judge": (3, None), "ops": (2, False)}
    rows = by_hook(conn)
    assert rows["judge"][:2] == ("failed", 3)
    assert rows["ops"] == (
        "running",
        2,
        "the lease of attempt 1 ran out before it settled: its replica died or stalled while "
        "running it",
    )
    # Without a maximum, a row is leased again whatever its attempts.
    lease_ran_out(conn, held_run(conn), "judge", attempts=40)
    assert claim(None) == {"judge": (41, False)}


# -- re-driving ----------------------------------------------------------------------------------


async def test_retry_gives_a_parked_row_a_fresh_schedule(
    conn: psycopg.Connection[Any], database_url: str, start_reactor: StartReactor
) -> None:
    async with start_reactor(
        grace=0.1,
        scan_interval=0.3,  # how soon the runner looks for rows re-queued by someone else
        hooks="judge=python:tests.hookmods:always_fail",
        hook_backoff=0.02,
        hook_max_attempts=2,
    ):
        finish(conn, new_job(conn)[0])
        await eventually(lambda: [s for _, s, _ in rows(conn)] == ["failed"])
        row_id = conn.execute("SELECT id FROM reactor.hook_outbox").fetchone()[0]  # type: ignore[index]
        async with await db.connect(database_url, "test") as admin:
            (change,) = await db.Database.dedicated(REFERENCE_INSTALL, admin).retry_hooks([row_id])
        assert change == db.HookChange(row_id, "failed", True)
        # The whole budget again: two more attempts, then parked once more.
        await eventually(lambda: [(s, a) for _, s, a in rows(conn)] == [("failed", 4)])
    assert [attempt for _, attempt, _ in hookmods.calls] == [1, 2, 3, 4]


async def test_retry_and_cancel_are_all_or_nothing(
    conn: psycopg.Connection[Any], database_url: str
) -> None:
    ids = {}
    for status in ("failed", "pending", "running", "done"):
        ids[status] = conn.execute(
            "INSERT INTO reactor.hook_outbox (run_id, job_id, hook, status, attempts) "
            "VALUES (%s, %s, 'judge', %s, 3) RETURNING id",
            (uuid.uuid4(), uuid.uuid4(), status),
        ).fetchone()[0]  # type: ignore[index]

    def status_of(row_id: int) -> str:
        return str(conn.execute("SELECT status FROM reactor.hook_outbox WHERE id = %s", (row_id,))
                   .fetchone()[0])  # type: ignore[index]  # fmt: skip

    async with await db.connect(database_url, "test") as conn_of_admin:
        admin = db.Database.dedicated(REFERENCE_INSTALL, conn_of_admin)
        unknown = await admin.retry_hooks([ids["failed"], 999_999])
        assert unknown == [
            db.HookChange(ids["failed"], "failed", False),
            db.HookChange(999_999, None, False),
        ]
        assert status_of(ids["failed"]) == "failed"
        refused = await admin.cancel_hooks([ids["pending"], ids["running"]])
        assert [c.changed for c in refused] == [False, False]
        assert status_of(ids["pending"]) == "pending"
        done = await admin.cancel_hooks([ids["pending"], ids["failed"]])
        assert [c.changed for c in done] == [True, True]
        assert (status_of(ids["pending"]), status_of(ids["failed"])) == ("cancelled", "cancelled")
        back = await admin.retry_hooks([ids["failed"]])
        assert back == [db.HookChange(ids["failed"], "cancelled", True)]
        assert status_of(ids["failed"]) == "pending"
        retry_base = conn.execute(
            "SELECT retry_base, attempts FROM reactor.hook_outbox WHERE id = %s", (ids["failed"],)
        ).fetchone()
        assert retry_base == (3, 3)


# -- retention -----------------------------------------------------------------------------------


def add_rows(conn: psycopg.Connection[Any], count: int, status: str, age_s: float) -> None:
    conn.execute(
        "INSERT INTO reactor.hook_outbox (run_id, job_id, hook, status, updated_at) "
        "SELECT gen_random_uuid(), gen_random_uuid(), 'judge', %s, "
        "       now() - make_interval(secs => %s) "
        "  FROM generate_series(1, %s)",
        (status, age_s, count),
    )


def counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    found = conn.execute(
        "SELECT status, count(*) FROM reactor.hook_outbox GROUP BY 1 ORDER BY 1"
    ).fetchall()
    return {status: int(n) for status, n in found}


async def test_retention_deletes_old_settled_rows_in_batches(
    conn: psycopg.Connection[Any], database: db.Database
) -> None:
    day = 86400.0
    add_rows(conn, 2300, "done", 2 * day)
    add_rows(conn, 10, "superseded", 2 * day)
    add_rows(conn, 10, "cancelled", 2 * day)
    add_rows(conn, 5, "done", 0.5 * day)  # inside the retention: kept
    add_rows(conn, 5, "failed", 30 * day)  # needs a person: never deleted
    add_rows(conn, 5, "pending", 30 * day)
    batches = []
    while (deleted := await database.purge_hooks(day, 1000)) != 0:
        batches.append(deleted)
    assert batches == [1000, 1000, 320]
    assert counts(conn) == {"done": 5, "failed": 5, "pending": 5}


# The advisory key the purge took turns by until it took none.
OLD_PURGE_LOCK = 0x7265_6170


async def test_retention_runs_whatever_advisory_key_a_stranger_holds(
    conn: psycopg.Connection[Any],
    database: db.Database,
    database_url: str,
    new_login_role: NewRole,
) -> None:
    add_rows(conn, 30, "done", 100)
    retention = HookRetention(Settings(hook_retention=10), database, stopping=anyio.Event())
    stranger = new_login_role("stranger")
    dsn = psycopg.conninfo.make_conninfo(database_url, user=stranger)
    with psycopg.connect(dsn, autocommit=True) as other:
        # A role with nothing but CONNECT holds the key the purge once took turns by.
        other.execute("SELECT pg_advisory_lock(%s)", (OLD_PURGE_LOCK,))
        assert await retention.purge(batch=7) == 30
    assert counts(conn) == {}


async def test_two_purges_at_once_share_the_rows(
    conn: psycopg.Connection[Any], database: db.Database, database_url: str
) -> None:
    add_rows(conn, 30, "done", 100)
    with psycopg.connect(database_url) as other_replica:
        # Another replica's purge is in its transaction, its batch locked.
        [(held,)] = other_replica.execute(
            REFERENCE_INSTALL.query("purge_hooks", "hooks.sql"), {"retention": 10, "batch": 12}
        ).fetchall()
        assert held == 12
        assert await database.purge_hooks(10, 1000) == 18
        other_replica.commit()
    assert counts(conn) == {}


async def test_a_replica_and_status_say_so_when_the_retention_does_not_run(
    conn: psycopg.Connection[Any],
    database_url: str,
    start_reactor: StartReactor,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="reactor.hooks")
    add_rows(conn, 5, "done", 3600)
    settings = Settings(database_url=database_url, hook_retention=60)
    with psycopg.connect(database_url) as other_replica:
        # Another session holds every settled row (a purge stuck in its transaction): this
        # replica's purge skips them, and they stay past their retention.
        other_replica.execute("SELECT id FROM reactor.hook_outbox FOR UPDATE").fetchall()
        async with start_reactor(hook_retention=60, probe_interval=0.2) as reactor:
            await eventually(lambda: reactor.hook_retention.late, timeout=10)
            async with await db.connect(database_url, "test") as reading:
                found = risks(await collect(reading, REFERENCE_INSTALL, settings))
            assert [r for r in found if "hook retention has not run" in r], found
            other_replica.rollback()
            await eventually(lambda: counts(conn) == {}, timeout=10)
            await eventually(lambda: not reactor.hook_retention.late, timeout=10)
    said = [r.getMessage() for r in caplog.records if r.name == "reactor.hooks"]
    late = [m for m in said if m.startswith("hook retention has not run")]
    assert len(late) == 1, said
    # An hour old, a minute's retention: some 3540 s past it, whatever the start took.
    assert re.search(r"RETENTION_SECONDS by 35[4-9]\ds", late[0]), late[0]
    assert "hook retention caught up" in said
    async with await db.connect(database_url, "test") as reading:
        assert not risks(await collect(reading, REFERENCE_INSTALL, settings))


async def test_a_running_reactor_applies_the_retention(
    conn: psycopg.Connection[Any], start_reactor: StartReactor
) -> None:
    async with start_reactor(
        grace=0.1, hooks="judge=python:tests.hookmods:count", hook_retention=0.5
    ):
        finish(conn, new_job(conn)[0])
        await eventually(lambda: hookmods.done)
        await eventually(lambda: counts(conn) == {})


# -- flat periodic queries -----------------------------------------------------------------------


def plan(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> str:
    found = conn.execute("EXPLAIN " + query, params).fetchall()
    return "\n".join(line for (line,) in found)


def test_periodic_queries_never_read_the_settled_rows(conn: psycopg.Connection[Any]) -> None:
    add_rows(conn, 50_000, "done", 3600)
    add_rows(conn, 3, "pending", 0)
    add_rows(conn, 2, "failed", 0)
    conn.execute("VACUUM ANALYZE reactor.hook_outbox")
    params: dict[str, Any] = {
        **db.health_params(REFERENCE_INSTALL, 1.0, db.HealthCheck("test", 15.0, 86400.0)),
        "hooks": ["judge"], "limit": 4, "lease": 60.0, "max_attempts": 40, "batch": 1000,
        "failed_only": False,
    }  # fmt: skip
    plans = {
        "health": plan(conn, REFERENCE_INSTALL.query("health"), params),
        "status_hooks": plan(conn, REFERENCE_INSTALL.query("status_hooks", "status.sql"), params),
        "claim_hooks": plan(conn, REFERENCE_INSTALL.query("claim_hooks"), params),
        "next_hook_in": plan(conn, REFERENCE_INSTALL.query("next_hook_in"), params),
        "list_hooks": plan(conn, REFERENCE_INSTALL.query("list_hooks", "hooks.sql"), params),
        "purge_hooks": plan(conn, REFERENCE_INSTALL.query("purge_hooks", "hooks.sql"), params),
    }
    for name, text in plans.items():
        assert "Seq Scan on hook_outbox" not in text, f"{name}:\n{text}"
    for name in ("health", "status_hooks"):
        assert "Index Only Scan using hook_outbox_open_idx" in plans[name], plans[name]
        assert "Index Only Scan using hook_outbox_failed_idx" in plans[name], plans[name]
    assert "hook_outbox_open_idx" in plans["claim_hooks"]
    assert "hook_outbox_settled_idx" in plans["purge_hooks"]
