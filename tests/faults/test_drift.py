"""Drift under faults: jobs and run deletions that go around the triggers, while a replica is
killed with -9 and PostgreSQL restarts. The reconcile must find every one of them, once.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from reactor.demo.embedded import EmbeddedPostgres
from tests.faults.conftest import Report
from tests.faults.scenario import GRACE, settled
from tests.faults.support import Replicas, Workload, connect, listeners, replica_env, scalar
from tests.faults.tables import RESULTS, JobId, Tables
from tests.polling import wait_for


def _bypass(tables: Tables, dsn: str, count: int) -> list[JobId]:
    """Finish jobs and delete recorded runs as a restore or a replication apply worker does."""
    with connect(dsn) as conn, conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        jobs = [
            tables.add_job(conn, finished=True, doc="<p>restored</p>", results=RESULTS)[0]
            for _ in range(count)
        ]
        conn.execute(
            tables.render(
                "DELETE FROM @runs@ WHERE @key@ IN "
                "(SELECT @key@ FROM @runs@ WHERE @saved_by@ = @worker@ LIMIT %s)"
            ),
            (count // 2,),
        )
    return jobs


def _recorded_at(tables: Tables, dsn: str, jobs: list[JobId]) -> bool:
    """Every one of ``jobs`` has its run (False while the server is unreachable)."""
    try:
        with connect(dsn) as conn:
            query = tables.render("SELECT count(*) = %s FROM @runs@ WHERE @job@ = ANY(%s)")
            return bool(scalar(conn, query, (len(jobs), jobs)))
    except psycopg.OperationalError:
        return False


@pytest.mark.second_mapping
def test_drift_with_kill_nine_and_a_postgres_restart(
    database_url: str,
    tables: Tables,
    embedded: EmbeddedPostgres,
    replicas: Replicas,
    workload: Callable[..., Workload],
    report: Report,
) -> None:
    app = workload(grace=GRACE, seed=33)
    env = replica_env(database_url, tables, REACTOR_RECONCILE_INTERVAL_SECONDS="2")
    runs = tables.render("SELECT count(*) FROM @runs@")
    drifted: list[JobId] = []
    with connect(database_url) as conn:
        first = replicas.start(env, "r0")
        replicas.start(env, "r1")
        wait_for(lambda: listeners(conn) >= 2, 30, "two replicas listening")
    with app.running(20.0):
        wait_for(
            lambda: scalar_at(database_url, runs) > 20,
            30,
            "runs recorded before the faults",
        )
        drifted += _bypass(tables, database_url, 10)
        first.kill()
        drifted += _bypass(tables, database_url, 10)
        embedded.restart()
        drifted += _bypass(tables, database_url, 10)
        replicas.start(env, "r2")
    app.quiesce()
    # The last drifted jobs may be younger than the app's last finish: wait for the reconcile
    # to have recorded every one of them, then judge everything.
    wait_for(lambda: _recorded_at(tables, database_url, drifted), 30, "every drifted job recorded")
    judgement, took = settled(database_url, tables)
    report(
        "drift + kill -9 + pg restart",
        1,
        judgement,
        recovery=took,
        note="30 jobs finished and 15 runs deleted with the triggers bypassed; reconcile every 2 s",
    )
    assert judgement.clean, str(judgement)
    # The kill and the restart were survived, so the reconcile ran on the replicas left.
    assert any("reconcile found jobs missing" in m for r in replicas for m in r.messages())


def scalar_at(dsn: str, query: str) -> int:
    """One number from a fresh connection: the server may be restarting under us."""
    try:
        with connect(dsn) as conn:
            return int(scalar(conn, query))
    except psycopg.OperationalError:
        return 0
