"""The reactor as real processes (``python -m reactor run``): kill -9 at random moments with
three replicas, a rolling deploy, SIGTERM while a drain outlasts REACTOR_DRAIN_SECONDS, and
replicas whose wall clocks are wrong by a minute and a half.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from tests.faults import support
from tests.faults.conftest import Report
from tests.faults.scenario import GRACE, settled, short_and_long
from tests.faults.support import (
    Conn,
    Replica,
    Replicas,
    Workload,
    connect,
    listeners,
    replica_env,
    scalar,
)
from tests.faults.tables import Tables
from tests.polling import wait_for


def start_listening(replicas: Replicas, conn: Conn, env: dict[str, str], name: str) -> Replica:
    """Start a replica and wait until its LISTEN session is up."""
    before = listeners(conn)
    replica = replicas.start(env, name)
    wait_for(lambda: listeners(conn) > before or not replica.alive(), 30, f"{name} listening")
    assert replica.alive(), replica.log.read_text()
    return replica


def unhooked(tables: Tables, conn: Conn, hook: str = "judge") -> int:
    """Worker-recorded runs whose hook has not run to completion."""
    return support.unhooked(conn, tables.app, hook)


# -- kill -9 -----------------------------------------------------------------------------------


@short_and_long(
    ("cycles", "scenario"), (2, "proc: kill -9 at random"), (40, "proc: kill -9 at random (long)")
)
def test_kill_nine_at_random_moments(
    database_url: str,
    tables: Tables,
    replicas: Replicas,
    workload: Callable[..., Workload],
    report: Report,
    cycles: int,
    scenario: str,
) -> None:
    rng = random.Random(21)
    app = workload(grace=GRACE, seed=21)
    # With a hook: a replica killed mid-hook leaves a lease that another replica takes over.
    env = replica_env(
        database_url,
        tables,
        REACTOR_HOOKS="judge=python:tests.hookmods:count",
        REACTOR_HOOK_TIMEOUT_SECONDS="2",
        REACTOR_HOOK_LEASE_SECONDS="3",
    )
    with connect(database_url) as conn:
        live = [start_listening(replicas, conn, env, f"r{i}") for i in range(3)]
        with app.running(30.0):
            for cycle in range(cycles):
                # Only replicas that are up: killing newborns before they listen leaves the
                # fleet empty (a long run did that for 39 s; the scan then caught up).
                wait_for(
                    lambda: listeners(conn) >= 3,
                    30,
                    "three replicas listening",
                )
                time.sleep(rng.uniform(0.2, 1.5))  # a random moment in the traffic
                victim = live.pop(rng.randrange(len(live)))
                victim.kill()
                live.append(replicas.start(env, f"r{cycle + 3}"))
        wait_for(lambda: listeners(conn) >= 3, 30, "three replicas listening")
        app.quiesce()
        judgement, took = settled(database_url, tables)
        with contextlib.suppress(AssertionError):  # judged below, after the report
            wait_for(lambda: unhooked(tables, conn) == 0, 20, "every recorded run hooked")
        left = unhooked(tables, conn)
    report(
        scenario,
        cycles,
        judgement,
        recovery=took,
        unhooked=left,
        note="3 replicas, 30 jobs/s, a hook with a 3 s lease",
    )
    assert judgement.clean, str(judgement)
    assert left == 0
    # The others had every deadline the victim had: a kill costs no more than a busy retry.
    assert judgement.verdict.lateness_max is not None
    assert judgement.verdict.lateness_max < 5


# -- rolling deploy ----------------------------------------------------------------------------


@short_and_long(
    ("rounds", "scenario"), (1, "proc: rolling deploy"), (8, "proc: rolling deploy (long)")
)
def test_rolling_deploy(
    database_url: str,
    replicas: Replicas,
    workload: Callable[..., Workload],
    report: Report,
    rounds: int,
    scenario: str,
) -> None:
    app = workload(grace=GRACE, seed=22)
    tables = app.tables
    env = replica_env(database_url, tables, REACTOR_DRAIN_SECONDS="5")
    codes: list[int] = []
    with connect(database_url) as conn:
        old = [start_listening(replicas, conn, env, f"v0-{i}") for i in range(2)]
        with app.running(30.0):
            for version in range(1, rounds + 1):
                for i in range(2):
                    new = start_listening(replicas, conn, env, f"v{version}-{i}")
                    retiring = old.pop(0)
                    retiring.terminate()
                    codes.append(retiring.wait(20))
                    assert "stopped" in retiring.messages()
                    old.append(new)
    app.quiesce()
    judgement, took = settled(database_url, tables)
    report(scenario, rounds, judgement, recovery=took, note=f"2 replicas replaced {rounds}x")
    assert codes == [0] * (2 * rounds)
    assert judgement.clean, str(judgement)


# -- SIGTERM while a drain outlasts REACTOR_DRAIN_SECONDS --------------------------------------


def test_sigterm_while_a_record_statement_outlasts_the_drain(
    database_url: str,
    tables: Tables,
    replicas: Replicas,
    workload: Callable[..., Workload],
    report: Report,
) -> None:
    app = workload(grace=GRACE, seed=23, save_ratio=0.0)
    env = replica_env(database_url, tables, REACTOR_DRAIN_SECONDS="1")
    with connect(database_url) as conn, connect(database_url) as tab:
        first = start_listening(replicas, conn, env, "first")
        [job_id] = app.finish(1, save=False)
        # A tab's save that never commits: the reactor's insert of the same run waits on it.
        tab.execute("BEGIN")
        tables.client_save(tab, job_id)
        wait_for(
            lambda: scalar(
                conn,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = 'reactor-pool' AND wait_event_type = 'Lock'",
            ),
            10,
            "a record statement waiting on the tab's row",
        )
        first.terminate()
        signalled = time.monotonic()
        code = first.wait(15)
        stopped_in = time.monotonic() - signalled
        tab.execute("ROLLBACK")  # the tab gave up: the run is the reactor's to write
        start_listening(replicas, conn, env, "second")
        judgement, took = settled(database_url, tables)
    report(
        "proc: SIGTERM, record stuck past the drain",
        1,
        judgement,
        recovery=took,
        note=f"drain 1 s; exited {code} after {stopped_in:.1f}s",
    )
    assert code == 0
    assert stopped_in < 1 + 5
    assert "drain deadline passed; unfinished statements were rolled back" in first.messages()
    assert judgement.clean, str(judgement)
    assert judgement.verdict.saved_by_worker == 1


def blocking_hooks(
    database_url: str, tables: Tables, tmp_path: Path, **variables: str
) -> tuple[dict[str, str], Path, Path]:
    """A replica's environment whose hook (tests.hookmods:block) logs to the returned log and
    runs until the returned release file exists."""
    hook_log, release = tmp_path / "hooks.log", tmp_path / "release"
    hook_log.touch()
    env = replica_env(
        database_url,
        tables,
        REACTOR_HOOKS="judge=python:tests.hookmods:block",
        HOOK_LOG=str(hook_log),
        HOOK_RELEASE=str(release),
        **variables,
    )
    return env, hook_log, release


def test_sigterm_while_a_hook_outlasts_the_drain(
    database_url: str,
    tables: Tables,
    replicas: Replicas,
    workload: Callable[..., Workload],
    report: Report,
    tmp_path: Path,
) -> None:
    app = workload(grace=GRACE, seed=24, save_ratio=0.0)
    env, hook_log, release = blocking_hooks(
        database_url, tables, tmp_path, REACTOR_DRAIN_SECONDS="1"
    )
    with connect(database_url) as conn:
        first = start_listening(replicas, conn, env, "first")
        app.finish(3, save=False)
        wait_for(lambda: "start" in hook_log.read_text(), 10, "a hook running")
        first.terminate()
        code = first.wait(15)
        second = start_listening(replicas, conn, env, "second")
        release.touch()

        wait_for(lambda: unhooked(tables, conn) == 0, 20, "every recorded run judged")
        left = unhooked(tables, conn)
        done_by = {
            line.split()[-1] for line in hook_log.read_text().splitlines() if line[:4] == "done"
        }
        judgement, took = settled(database_url, tables)
    report("proc: SIGTERM, hook stuck past the drain", 1, judgement, recovery=took, unhooked=left)
    assert code == 0
    assert str(second.pid) in done_by
    assert judgement.clean, str(judgement)


def test_kill_nine_while_hooks_run_hands_them_over_within_a_probe_interval(
    database_url: str,
    tables: Tables,
    replicas: Replicas,
    workload: Callable[..., Workload],
    report: Report,
    tmp_path: Path,
) -> None:
    # The lease (the hook timeout plus 30 s) would hold a killed replica's calls for minutes;
    # the others know it is dead once its LISTEN session is gone, and take the calls back then.
    app = workload(grace=GRACE, seed=25, save_ratio=0.0)
    env, hook_log, release = blocking_hooks(database_url, tables, tmp_path)

    def started_by(pid: int) -> set[str]:
        lines = [line.split() for line in hook_log.read_text().splitlines()]
        return {key for kind, key, _, by in lines if kind == "start" and by == str(pid)}

    with connect(database_url) as conn:
        first = start_listening(replicas, conn, env, "first")
        finished = app.finish(4, save=False)
        wait_for(lambda: len(started_by(first.pid)) == len(finished), 20, "4 hooks running")
        second = start_listening(replicas, conn, env, "second")
        first.kill()
        killed = time.monotonic()
        wait_for(
            lambda: started_by(second.pid) >= started_by(first.pid), 30, "the hooks taken over"
        )
        took = time.monotonic() - killed
        release.touch()
        wait_for(lambda: unhooked(tables, conn) == 0, 20, "every recorded run judged")
        judgement, _ = settled(database_url, tables)
    report(
        "proc: kill -9 while hooks run",
        1,
        judgement,
        recovery=took,
        note=f"4 hook calls running on the killed replica, run again {took:.1f}s after the kill",
    )
    assert judgement.clean, str(judgement)
    # A probe interval (1 s here) to see the LISTEN session gone, one more for the heartbeat
    # the new replica may not have written yet, and a loaded machine's share; the lease is 150 s.
    assert took < 5.0, took


# -- clocks ------------------------------------------------------------------------------------

SITECUSTOMIZE = '''
"""Test-only: this process's wall clock is off by FAKE_CLOCK_OFFSET seconds (monotonic is not)."""
import os
import time

_offset = float(os.environ.get("FAKE_CLOCK_OFFSET", "0"))
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + _offset
time.time_ns = lambda: _time_ns() + int(_offset * 1_000_000_000)
'''


def _log_clock_offset(replica: Replica) -> float:
    """How far ahead of its start (by our clock) the replica's first log line is stamped; its
    log uses time.time, so this is its clock offset plus the few seconds it took to start."""
    first = json.loads(replica.log.read_text().splitlines()[0])
    stamp = datetime.fromisoformat(first["time"])
    return stamp.timestamp() - replica.started_at


@short_and_long(
    ("seconds", "scenario"),
    (3.0, "proc: clocks +90 s / -90 s"),
    (60.0, "proc: clocks +90 s / -90 s (long)"),
)
def test_replicas_with_skewed_clocks(
    database_url: str,
    replicas: Replicas,
    workload: Callable[..., Workload],
    report: Report,
    tmp_path: Path,
    seconds: float,
    scenario: str,
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    app = workload(grace=GRACE, seed=25)
    tables = app.tables
    started: list[Replica] = []
    with connect(database_url) as conn:
        for offset in ("90", "-90"):
            env = replica_env(database_url, tables, FAKE_CLOCK_OFFSET=offset, PYTHONPATH=str(site))
            started.append(start_listening(replicas, conn, env, f"skew{offset}"))
        with app.running(30.0):
            time.sleep(seconds)
    offsets = [_log_clock_offset(r) for r in started]
    app.quiesce()
    judgement, took = settled(database_url, tables)
    report(
        scenario,
        1,
        judgement,
        recovery=took,
        note="wall clocks " + ", ".join(f"{o:+.0f}s" for o in offsets),
    )
    # The fake clocks took effect (the first log line comes a few seconds after the start).
    assert 90 < offsets[0] < 100
    assert -90 < offsets[1] < -80
    assert judgement.clean, str(judgement)
    assert judgement.verdict.saved_by_worker > 0
