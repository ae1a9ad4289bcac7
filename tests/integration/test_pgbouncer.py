"""Through PgBouncer in transaction mode: the reactor's pool works past many scans, leaves
nothing on the server sessions the app gets next, and its listener tells a pooler from a
direct connection (degraded and polling through the pooler, listening with a direct DSN).

The pooler is Debian's PgBouncer, started by the session fixture ``pgbouncer`` with a pool of
four server sessions per database, so the reactor and the app share them.
"""

from __future__ import annotations

from typing import Any

import anyio
import psycopg
import pytest

from reactor import db
from tests import pgbouncer as bouncer
from tests.helpers import finish, new_job, run_row, worker_writes
from tests.integration.conftest import StartReactor
from tests.integration.support import hints_heard, recorded
from tests.polling import eventually

pytestmark = pytest.mark.anyio

# Parameters PgBouncer itself sets on a server session for each client it links (they follow
# the client, by design); anything else set for the session came from a client and stays.
POOLER_TRACKED = {
    "application_name",
    "client_encoding",
    "datestyle",
    "timezone",
    "standard_conforming_strings",
}


def server_sessions(pooled_dsn: str) -> list[dict[str, Any]]:
    """What each server session of the pool carries, seen from app sessions through the pooler.

    Each app connection holds a transaction open while the next one asks, so together they
    occupy every server session of the pool, each reporting on its own.
    """
    conns = [psycopg.connect(pooled_dsn, prepare_threshold=None) for _ in range(bouncer.POOL_SIZE)]
    try:
        seen = []
        for conn in conns:
            row = conn.execute(
                """
                SELECT pg_backend_pid(),
                       array(SELECT lower(name) || '=' || setting FROM pg_settings
                              WHERE source = 'session' ORDER BY name),
                       current_setting('transaction_isolation'),
                       array(SELECT pg_listening_channels())
                """
            ).fetchone()
            assert row is not None
            pid, settings, isolation, channels = row
            settings = [s for s in settings if s.split("=", 1)[0] not in POOLER_TRACKED]
            seen.append(
                {"pid": pid, "settings": settings, "isolation": isolation, "channels": channels}
            )
        return seen
    finally:
        for conn in conns:
            conn.rollback()
            conn.close()


async def test_poll_mode_through_pgbouncer_records_everything_past_many_polls(
    start_reactor: StartReactor, database_url: str, pgbouncer: bouncer.PgBouncer
) -> None:
    pooled = pgbouncer.dsn_for(database_url)
    jobs = 120
    grace = 0.3
    options: dict[str, Any] = {
        "database_url": pooled, "mode": "poll", "poll_interval": 0.05, "grace": grace,
    }  # fmt: skip
    async with start_reactor(**options) as one, start_reactor(**options) as two:
        # The app goes through the same pooler: its statements and the reactors' interleave
        # on the same four server sessions.
        with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as app:
            for _ in range(jobs):
                job_id, _ = new_job(app)
                finish(app, job_id)
                await anyio.sleep(0.01)
            await eventually(lambda: len(worker_writes(app)) >= jobs, timeout=30)
            # Every statement shape ran many times on every pool connection: prepared
            # statements (psycopg's default after five) would have failed by now.
            await eventually(lambda: one.polls >= 60 and two.polls >= 60, timeout=30)
        errors = [
            r.metrics.registry.get_sample_value("reactor_record_errors_total") for r in (one, two)
        ]
        assert errors == [0.0, 0.0]
        assert recorded(one, "timer") + recorded(two, "timer") > 0

    with psycopg.connect(database_url, autocommit=True) as conn:
        writes = worker_writes(conn)
        assert len(writes) == jobs
        assert len({(run, job) for run, job, _ in writes}) == jobs
    assert "prepared statement" not in pgbouncer.log


async def test_nothing_the_reactor_sets_reaches_an_app_session(
    start_reactor: StartReactor, database_url: str, pgbouncer: bouncer.PgBouncer
) -> None:
    pooled = pgbouncer.dsn_for(database_url)
    before = server_sessions(pooled)
    # Poll mode through the pooler, and listen mode pointed at it by mistake: the listener
    # must not configure a session it cannot prove is its own.
    async with (
        start_reactor(database_url=pooled, mode="poll", scan_interval=0.05, grace=0.2),
        start_reactor(database_url=pooled, scan_interval=0.05, probe_interval=0.3),
    ):
        with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as app:
            job_id, run_id = new_job(app)
            finish(app, job_id)
            await eventually(lambda: run_row(app, run_id), timeout=15)
    after = server_sessions(pooled)
    assert len({s["pid"] for s in after}) == bouncer.POOL_SIZE
    for session in after:
        assert session["settings"] == [], session
        assert session["isolation"] == "read committed"
    # The control: the same query saw the sessions as clean before the reactors ran.
    assert all(s["settings"] == [] for s in before)


async def test_listen_mode_at_the_pooler_is_degraded_and_polls(
    start_reactor: StartReactor, database_url: str, pgbouncer: bouncer.PgBouncer
) -> None:
    pooled = pgbouncer.dsn_for(database_url)
    async with start_reactor(
        database_url=pooled, scan_interval=0.2, probe_interval=0.3, probe_timeout=0.3
    ) as reactor:
        listener = reactor.listener
        assert listener is not None
        await eventually(lambda: listener.state == "degraded", timeout=10)
        assert reactor.polling
        assert reactor.health()[1:] == (
            False,
            "probe notifications do not arrive (pooler?); polling",
        )
        with psycopg.connect(database_url, autocommit=True) as app:
            job_id, run_id = new_job(app)
            finish(app, job_id)
            await eventually(lambda: run_row(app, run_id), timeout=10)
            assert run_row(app, run_id) == (job_id, "worker")
        assert not listener.proven


async def test_a_direct_listen_dsn_listens_while_the_pool_goes_through_the_pooler(
    start_reactor: StartReactor, database_url: str, pgbouncer: bouncer.PgBouncer
) -> None:
    pooled = pgbouncer.dsn_for(database_url)
    async with start_reactor(
        database_url=pooled,
        listen_database_url=database_url,
        probe_interval=0.3,
        probe_timeout=1.0,
        grace=0.3,
    ) as reactor:
        listener = reactor.listener
        assert listener is not None
        await eventually(lambda: listener.proven, timeout=10)
        # Proven by the pool's first probe, which may come back before the first check has.
        await eventually(lambda: reactor.health()[1:] == (True, "ok"), timeout=10)
        with psycopg.connect(database_url, autocommit=True) as app:
            job_ids = [new_job(app)[0] for _ in range(5)]
            for job_id in job_ids:
                finish(app, job_id)
            await eventually(lambda: len(worker_writes(app)) == 5, timeout=10)
        # Every job's notification came over the direct session. Which road then records a
        # job (its timer, or a scan a slow check asked for meanwhile) is not this test's point.
        assert hints_heard(reactor) == 5
        assert listener.state == "listening"


def test_a_session_setting_through_the_pooler_reaches_other_clients(
    database_url: str, pgbouncer: bouncer.PgBouncer
) -> None:
    # The control for the test above: what the reactor used to do (set_config(..., false) on
    # its pool connections) is seen from the app's sessions, by the same check.
    pooled = pgbouncer.dsn_for(database_url)
    with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as client:
        client.execute("SELECT set_config('lock_timeout', '4321ms', false)")
    leaked = [s for s in server_sessions(pooled) if "lock_timeout=4321" in s["settings"]]
    assert len(leaked) == 1


async def test_the_pool_tells_a_session_of_its_own_from_a_pooler(
    database_url: str, pgbouncer: bouncer.PgBouncer
) -> None:
    settings = (
        "SELECT current_setting('transaction_isolation'), current_setting('statement_timeout')"
    )
    for dsn, own in ((database_url, True), (pgbouncer.dsn_for(database_url), False)):
        async with db.make_pool(dsn, max_size=1) as pool, pool.connection() as conn:
            assert db.is_own_session(conn) is own
            # Prepared statements only where the next statement meets the same server session.
            assert (conn.prepare_threshold is None) is not own
            # Either way the statement runs with the reactor's isolation and bounds.
            assert await db.call(conn, settings) == [("read committed", "30s")]
