"""PostgreSQL fails under the reactor: restarts, a crashed backend, downtime, frozen backends
(the listener's, and one holding the row locks of a claim), terminated sessions, and a NOTIFY
queue held back by a frozen listener.

The reactor runs in-process against the test database; the app keeps finishing jobs whenever
the server lets it.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anyio
import psycopg
import pytest

from reactor.demo.embedded import EmbeddedPostgres
from tests.faults.conftest import StartReactor
from tests.faults.scenario import Scenario, short_and_long
from tests.faults.support import Workload, all_recorded, connect, reactor_pids, scalar
from tests.faults.tables import Tables
from tests.integration.support import start_scans_over
from tests.polling import eventually

pytestmark = pytest.mark.anyio


async def server_answers(dsn: str, *, within: float = 60.0) -> None:
    """Poll until the server accepts a connection (after a crash or a start)."""

    def ok() -> bool:
        try:
            with connect(dsn) as conn:
                conn.execute("SELECT 1")
        except psycopg.OperationalError:
            return False
        return True

    async def check() -> bool:
        return await anyio.to_thread.run_sync(ok)

    # Polling with a bound: nothing signals "the server is back".
    with anyio.fail_after(within):
        while not await check():  # noqa: ASYNC110 -- the condition is another process's state
            await anyio.sleep(0.1)


@contextmanager
def frozen(*pids: int) -> Iterator[None]:
    """SIGSTOP backends; SIGCONT them on the way out."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


# -- restarts, crashes, downtime ---------------------------------------------------------------


async def _restarts(
    scenario: Scenario, embedded: EmbeddedPostgres, *, cycles: int, name: str
) -> None:
    app = scenario.app(seed=11)
    async with scenario.fleet() as fleet:
        for _ in range(cycles):
            await scenario.drive(app, 1.0)
            await scenario.finish(app, 10)  # deadlines across the restart
            await anyio.to_thread.run_sync(embedded.restart, "fast")
            await scenario.drive(app, 1.0)
        judgement, took = await scenario.verdict(app)
        reconnects = min(fleet.connections()) - 1
    scenario.conclude(
        name, cycles, judgement, recovery=took, note=f"{reconnects} listener reconnects"
    )
    assert reconnects >= cycles


@short_and_long(
    ("cycles", "name"),
    (1, "pg: fast shutdown + restart"),
    (8, "pg: fast shutdown + restart (long)"),
)
async def test_fast_shutdown_and_restart(
    scenario: Scenario, embedded: EmbeddedPostgres, cycles: int, name: str
) -> None:
    await _restarts(scenario, embedded, cycles=cycles, name=name)


async def _backend_crashes(scenario: Scenario, *, cycles: int, name: str) -> None:
    app = scenario.app(seed=12)
    rng = random.Random(12)
    async with scenario.fleet() as fleet:
        for _ in range(cycles):
            await eventually(lambda: fleet.all_listeners(lambda listener: listener.proven))
            await scenario.drive(app, rng.uniform(0.3, 1.5))
            await scenario.finish(app, 10)
            with connect(scenario.database_url) as conn:
                victims = reactor_pids(conn)
            assert victims
            # One backend dies by SIGKILL: the postmaster resets every connection and recovers.
            os.kill(rng.choice(victims), signal.SIGKILL)
            await server_answers(scenario.database_url)
            await scenario.drive(app, 1.0)
        judgement, took = await scenario.verdict(app)
    scenario.conclude(name, cycles, judgement, recovery=took, note="SIGKILL of one reactor backend")


@short_and_long(
    ("cycles", "name"), (1, "pg: backend SIGKILL (crash)"), (8, "pg: backend SIGKILL (crash, long)")
)
async def test_backend_crash_resets_every_connection(
    scenario: Scenario, embedded: EmbeddedPostgres, cycles: int, name: str
) -> None:
    await _backend_crashes(scenario, cycles=cycles, name=name)


async def _downtime(
    scenario: Scenario, embedded: EmbeddedPostgres, *, seconds: float, name: str
) -> None:
    app = scenario.app(seed=13)
    async with scenario.fleet():
        await scenario.drive(app, 1.0)
        # Finished right before the stop: every one of these comes due while the server is down.
        await scenario.finish(app, 20)
        await anyio.to_thread.run_sync(embedded.stop, "fast")
        stopped = time.monotonic()
        try:
            await scenario.drive(app, seconds)  # the worker cannot write; it keeps trying
        finally:
            await anyio.to_thread.run_sync(embedded.start)
        started = time.monotonic()
        await scenario.drive(app, 1.0)
        judgement, took = await scenario.verdict(app)
        caught_up = started + took
    scenario.conclude(
        name,
        1,
        judgement,
        recovery=took,
        note=f"down {started - stopped:.1f}s; worker writes refused: {app.failed_writes}",
    )
    assert app.failed_writes > 0
    # Recovery is the reconnect (its backoff is capped at 5 s), not the 30 s scan.
    assert judgement.verdict.lateness_max_overall is not None
    assert judgement.verdict.lateness_max_overall < (started - stopped) + 10
    assert caught_up - started < 10


@short_and_long(("seconds", "name"), (5.0, "pg: downtime 5 s"), (30.0, "pg: downtime 30 s"))
async def test_downtime(
    scenario: Scenario, embedded: EmbeddedPostgres, seconds: float, name: str
) -> None:
    await _downtime(scenario, embedded, seconds=seconds, name=name)


# A poll waiting on a lock of the doorbell's, which the test holds: the poll's statement alone
# writes it, so that only the poll is cut off (the health check only reads it).
CUT_WAITING_POLLS = """
SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
 WHERE wait_event_type = 'Lock' AND query LIKE '%told AS (%' AND pid <> pg_backend_pid()
"""


async def test_deadlines_that_pass_while_polls_fail_are_not_left_to_the_periodic_scan(
    reactor_at: StartReactor,
    workload: Callable[..., Workload],
    tables: Tables,
    database_url: str,
) -> None:
    # Polling (as a replica does while its LISTEN session is down): a poll reads the deadlines
    # as they near, and the next after a failure starts a fresh window.
    async with reactor_at(database_url, mode="poll") as reactor:
        await start_scans_over(reactor)
        polls = reactor.cadence.duties["poll"]
        app = workload(grace=1.0, seed=29, reanalyse_ratio=0.0)
        with connect(database_url) as holder, connect(database_url) as cutter:
            holder.execute("BEGIN")
            holder.execute(tables.render("LOCK TABLE @reactor@.doorbell IN EXCLUSIVE MODE"))
            backlog = await anyio.to_thread.run_sync(lambda: app.finish(10, save=False))
            failed_from = polls.failures
            until = time.monotonic() + 2.5  # past every deadline, and a poll's window behind it
            while time.monotonic() < until:
                await anyio.to_thread.run_sync(scalar, cutter, CUT_WAITING_POLLS)
                await anyio.sleep(0.05)
            assert polls.failures > failed_from
            holder.execute("ROLLBACK")

        # Soon after they came due, not at the periodic scan, 30 s on.
        await eventually(lambda: all_recorded(tables, database_url, backlog), timeout=3)


# -- frozen backends ---------------------------------------------------------------------------


async def test_frozen_listener_backend_holds_the_queue_and_is_replaced(
    scenario: Scenario, embedded: EmbeddedPostgres
) -> None:
    # The NOTIFY queue holds 8 GB by default: filling it takes far too long for a test. What we
    # can check quickly is that a frozen LISTENer holds the queue's tail and that the reactor's
    # queue_usage gauge shows it, while the reactor replaces the frozen session and goes on.
    app = scenario.app(seed=14)
    async with scenario.fleet() as fleet:
        await eventually(lambda: fleet.all_listeners(lambda listener: listener.proven))
        with connect(scenario.database_url) as conn:
            pids = reactor_pids(conn, "listener")
            # One LISTEN session per replica, whatever the pairs it serves.
            assert len(pids) == len(fleet.reactors)

            def usage() -> float:
                values = [
                    r.metrics.registry.get_sample_value("reactor_notification_queue_usage")
                    for r in fleet.reactors
                ]
                return max(value or 0.0 for value in values)

            with frozen(*pids):
                await scenario.finish(app, 10)
                # Traffic on another channel: ~100 kB, a dozen queue pages behind the tail.
                for _ in range(200):
                    conn.execute("SELECT pg_notify('fault_noise', repeat('n', 500))")
                await eventually(lambda: usage() > 0, timeout=5)
                seen = usage()
                await eventually(
                    lambda: fleet.all_listeners(lambda listener: listener.connections >= 2),
                    timeout=10,
                )
                await scenario.drive(app, 1.0)
            # Resumed, the old sessions meet the pg_terminate_backend their reactor sent them.
            await eventually(
                lambda: not set(pids) & set(reactor_pids(conn, "listener")), timeout=10
            )
            await scenario.drive(app, 1.0)
        judgement, took = await scenario.verdict(app)
    scenario.conclude(
        "pg: frozen LISTEN backend",
        1,
        judgement,
        recovery=took,
        note=f"queue usage seen {seen:.2e} (>0) while frozen; queue-full itself not reproduced",
    )
    assert seen > 0


AGAIN = '{"verdicts": [9]}'
GATE_SQL = """
CREATE TABLE IF NOT EXISTS fault_gate (closed boolean NOT NULL);
INSERT INTO fault_gate VALUES (true);
CREATE OR REPLACE FUNCTION fault_gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- While the gate is closed, a worker write waits for the test's advisory lock: the
    -- record statement sits there holding the row locks of the jobs it claimed.
    IF @NEW.saved_by@ = @worker@ AND (SELECT closed FROM fault_gate) THEN
        PERFORM pg_advisory_xact_lock_shared(4242);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER fault_gate BEFORE INSERT ON @runs@
    FOR EACH ROW EXECUTE FUNCTION fault_gate();
"""


async def _frozen_claim(scenario: Scenario, *, seconds: float, reanalyse: bool, name: str) -> None:
    """Two replicas or more; the backend of the one that claimed job J is frozen mid-statement."""
    app = scenario.app(seed=15, reanalyse_ratio=0.0)
    database_url, tables = scenario.database_url, scenario.tables
    with connect(database_url) as gate, connect(database_url) as conn:
        gate.execute(tables.render(GATE_SQL))
        gate.execute("SELECT pg_advisory_lock(4242)")
        async with scenario.fleet(at_least=2) as fleet:
            [held] = await anyio.to_thread.run_sync(lambda: app.finish(1, save=False))
            run = tables.run_of(conn, held)

            def blocked() -> list[int]:
                rows = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name = 'reactor-pool' AND wait_event = 'advisory'"
                ).fetchall()
                return [int(r[0]) for r in rows]

            # One replica's record statement claimed J (row lock held) and waits at the gate;
            # the others found J locked and skipped it.
            [victim] = await eventually(blocked, timeout=10)
            with frozen(victim):
                conn.execute("UPDATE fault_gate SET closed = false")
                gate.execute("SELECT pg_advisory_unlock(4242)")
                later = None
                if reanalyse:
                    # A re-analysis of J's run finishes and is recorded while J's claim sleeps.
                    later, _ = tables.add_job(
                        conn, run=run, finished=True, doc="<p>again</p>", results=AGAIN
                    )
                    await eventually(
                        lambda: tables.run_row(conn, run) == (later, tables.worker), timeout=10
                    )
                await scenario.drive(app, seconds)
                # Everything but the frozen claim is recorded, by whichever replica.
                during, _ = await scenario.verdict(
                    app, within=10, until=lambda j: j.verdict.lost <= 1
                )
            resumed = time.monotonic()
            judgement, _ = await scenario.verdict(app, within=4)
            final = tables.run_row(conn, run)
    scenario.conclude(
        name,
        1,
        judgement,
        recovery=time.monotonic() - resumed,
        note=f"{len(fleet.reactors)} replicas; a backend holding job J's claim frozen "
        f"{seconds:g}s+" + ("; J's run re-analysed meanwhile" if reanalyse else ""),
    )
    assert during.verdict.lost == (0 if reanalyse else 1), str(during)
    assert final == ((later, tables.worker) if reanalyse else (held, tables.worker))


@short_and_long(
    ("seconds", "name"),
    (2.0, "pg: frozen backend holding a claim"),
    (20.0, "pg: frozen backend holding a claim (long)"),
)
async def test_frozen_backend_holding_a_claim(
    scenario: Scenario, embedded: EmbeddedPostgres, seconds: float, name: str
) -> None:
    await _frozen_claim(scenario, reanalyse=False, seconds=seconds, name=name)


async def test_frozen_claim_resumed_after_a_reanalysis_keeps_the_later_job(
    scenario: Scenario, embedded: EmbeddedPostgres
) -> None:
    if scenario.tables.loaded().one_to_one:
        pytest.skip("each job is its own run in a one-to-one mapping: no run is re-analysed")
    await _frozen_claim(
        scenario, seconds=1.0, reanalyse=True, name="pg: frozen claim + re-analysis meanwhile"
    )


# -- terminated sessions -----------------------------------------------------------------------


async def _terminations(scenario: Scenario, *, cycles: int, name: str) -> None:
    app = scenario.app(seed=16)
    rng = random.Random(16)
    ended = 0
    async with scenario.fleet():
        with connect(scenario.database_url) as conn:
            for _ in range(cycles):
                await scenario.drive(app, rng.uniform(0.1, 1.2))
                pids = reactor_pids(conn)
                chosen = rng.sample(pids, rng.randint(1, len(pids))) if pids else []
                for pid in chosen:
                    ended += bool(scalar(conn, "SELECT pg_terminate_backend(%s)", (pid,)))
        await scenario.drive(app, 1.0)
        judgement, took = await scenario.verdict(app)
    scenario.conclude(name, cycles, judgement, recovery=took, note=f"{ended} sessions terminated")
    assert ended >= cycles


@short_and_long(
    ("cycles", "name"),
    (4, "pg: pg_terminate_backend at random"),
    (60, "pg: pg_terminate_backend at random (long)"),
)
async def test_terminated_reactor_sessions(scenario: Scenario, cycles: int, name: str) -> None:
    await _terminations(scenario, cycles=cycles, name=name)
