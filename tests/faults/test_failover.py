"""Failover: the reactor's database turns read-only under it, or its primary dies and a streaming
standby is promoted, while the app keeps finishing jobs.

- An address that leads to a standby (a failover's old primary back as one, behind the name or
  proxy that used to be the primary's): the reactor is not ready while it can only reach the
  standby, drops every pooled connection that turns out read-only, and once the address leads
  to a writable server again records everything, with no link reset to help it.
- A real failover: ``reactor run`` with both servers in DATABASE_URL and
  ``target_session_attrs=read-write``, the primary stopped under load, the standby promoted.
  Replication is synchronous, so every commit the app or the reactor saw acknowledged is on the
  standby when the primary goes, and the new primary's verdict is a fair one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from reactor.demo.embedded import EmbeddedPostgres
from reactor.testing import audit
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.conftest import Server
from tests.faults.conftest import Report
from tests.faults.proxy import FaultProxy
from tests.faults.scenario import GRACE, Scenario, settled
from tests.faults.support import (
    Replicas,
    Workload,
    connect,
    listeners,
    reactor_pids,
    replica_env,
    scalar,
    with_port,
)
from tests.faults.tables import Tables
from tests.polling import eventually, wait_for
from tests.standby import caught_up, embedded_of, multi_host, on, standby_of

pytestmark = pytest.mark.anyio

RATE = 20.0
OUTAGE = 2.0  # from the primary's crash to the standby's promotion


@pytest.fixture(scope="module")
def standby(server: Server) -> Iterator[EmbeddedPostgres]:
    """A hot standby of the test server, shared by the module's tests."""
    with standby_of(embedded_of(server)) as replica:
        yield replica


async def test_an_address_that_turns_to_a_standby_and_back(
    scenario: Scenario, proxy: FaultProxy, standby: EmbeddedPostgres
) -> None:
    app = scenario.app(seed=41)
    dsn = with_port(scenario.database_url, proxy.port)
    standby_dsn = on(standby, scenario.database_url)
    await anyio.to_thread.run_sync(caught_up, scenario.database_url, standby_dsn)
    primary = proxy.upstream
    async with scenario.fleet(dsn) as fleet:
        await eventually(lambda: all(r.health()[1] for r in fleet.reactors), timeout=30)
        await scenario.drive(app, 1.0)
        await scenario.finish(app, 10)  # their deadlines fall while only the standby answers
        # From now on the address leads to the standby; every link is cut, so every connection
        # the replicas make again lands there.
        proxy.upstream = ("127.0.0.1", standby.port)
        proxy.reset_all()
        await eventually(lambda: not any(r.health()[1] for r in fleet.reactors), timeout=15)
        with connect(standby_dsn) as on_standby:
            await eventually(lambda: reactor_pids(on_standby, "pool"), timeout=15)
        await scenario.drive(app, 1.5)  # the app writes on the primary; no replica can
        assert not any(r.health()[1] for r in fleet.reactors)
        # The address leads to the primary again, and nothing cuts the pools' links to the
        # standby: each must be dropped when it turns out read-only, and replaced. (Left in
        # the pool, they fail a call each time their turn comes, for as long as they live.)
        proxy.upstream = primary
        back = time.monotonic()
        with app.running(RATE), connect(standby_dsn) as on_standby:
            await eventually(lambda: all(r.health()[1] for r in fleet.reactors), timeout=30)
            ready_after = time.monotonic() - back
            await eventually(lambda: not reactor_pids(on_standby, "pool"), timeout=20)
            dropped_after = time.monotonic() - back
        judgement, took = await scenario.verdict(app)
    scenario.conclude(
        "pg: the address turns to a standby, then back",
        1,
        judgement,
        recovery=took,
        note=(
            f"ready {ready_after:.1f}s and no pool link left on the standby "
            f"{dropped_after:.1f}s after the address led back to the primary"
        ),
    )


def _bin_dir(server: Server) -> Path | None:
    # The suite's own server build: REACTOR_TEST_PG_BIN=/usr/lib/postgresql/15/bin fails over
    # on PostgreSQL 15 too.
    if server.embedded is not None:
        return server.embedded.bin_dir
    given = os.environ.get("REACTOR_TEST_PG_BIN")
    return Path(given) if given else None


def test_a_promoted_standby_takes_over_under_load_and_loses_nothing(
    server: Server, tables: Tables, replicas: Replicas, report: Report
) -> None:
    started = time.monotonic()
    with EmbeddedPostgres(bin_dir=_bin_dir(server), trust_localhost=True) as primary:
        with connect(primary.dsn) as admin:
            admin.execute("CREATE DATABASE app")
        with standby_of(primary) as standby:
            with connect(primary.dsn) as admin:
                # Synchronous: a commit is acknowledged once the standby has it on disk, and
                # promotion replays all of it. Set on the primary only (after the base backup),
                # so the promoted standby has no standby of its own to wait for.
                admin.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                admin.execute("SELECT pg_reload_conf()")
                wait_for(
                    lambda: scalar(
                        admin, "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
                    ),
                    30,
                    "the standby streaming synchronously",
                )
            both = multi_host(primary.dsn_for("app"), primary.port, standby.port)
            with connect(primary.dsn_for("app")) as conn:
                for pair in tables.each():
                    conn.execute(pair.ddl)
                tables.adopt(conn)
            env = reactor_env(both, **tables.env)
            migrated = run_reactor("migrate", env=env)
            assert migrated.returncode == 0, migrated.stderr
            with connect(primary.dsn_for("app")) as conn:
                for pair in tables.each():
                    conn.execute(audit.ddl(pair.mapping))
            reactor = replicas.start(replica_env(both, tables, REACTOR_GRACE_SECONDS=str(GRACE)))
            app = Workload(both, tables, grace=GRACE, seed=51)
            try:
                with connect(primary.dsn_for("app")) as conn:
                    wait_for(lambda: listeners(conn) == 1, 30, "the reactor listening")
                app.drive(2.0, RATE)
                app.finish(10)  # their deadlines fall during the failover
                before = len(app.finished)
                primary.stop("immediate")  # a crash: no shutdown checkpoint, links just die
                crashed = time.monotonic()
                # What a failover manager takes to decide: the app's writes fail meanwhile,
                # and the deadlines of the last jobs pass with no primary to write on.
                app.drive(OUTAGE, RATE)
                refused = app.failed_writes
                standby.promote()
                promoted = time.monotonic()
                with connect(standby.dsn_for("app")) as conn:
                    wait_for(
                        lambda: listeners(conn) == 1,
                        30,
                        "the reactor on the new primary",
                    )
                listening = time.monotonic() - promoted
                app.drive(3.0, RATE)
                after = len(app.finished) - before
                app.quiesce()
                judgement, took = settled(both, tables)
            finally:
                app.close()
            assert reactor.alive(), reactor.messages()
    elapsed = time.monotonic() - started
    report(
        "pg: primary crashes, streaming standby promoted (reactor run, multi-host DSN)",
        1,
        judgement,
        recovery=took,
        note=(
            f"{before} jobs before, {after} after; promoted {promoted - crashed:.1f}s after "
            f"the crash ({refused} app writes refused meanwhile), listening on the new primary "
            f"{listening:.1f}s after that; {elapsed:.0f}s in all"
        ),
    )
    assert judgement.verdict.lost == 0, str(judgement)
    assert judgement.verdict.dup == 0, str(judgement)
    assert judgement.clean, str(judgement)
    assert before > 0
    assert after > 0  # the app wrote on the new primary
