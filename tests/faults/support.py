"""Playing the app under faults, and judging the outcome from the database.

``Workload`` is the worker and the browser tabs: it finishes jobs (some of them re-analyses of
an earlier run), and for ~70% of them a tab saves the run with the client upsert within the
grace window. It survives the database going away: a write that fails is a write the app could
not make, and the tab that could not save simply leaves the run to the reactor.

Some of its jobs are retried: they finish, go back to running and finish again with other
verdicts, so that their artifact must end up holding their last finish.

``judge`` counts every invariant through ``reactor.testing.audit.verdict`` (stale included), and
``settle`` polls it (bounded) until the reactor has caught up.
"""

from __future__ import annotations

import heapq
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import psycopg
import psycopg.conninfo

from reactor.install.mapping import REFERENCE, Mapping
from reactor.testing import audit
from reactor.testing.app import App
from reactor.testing.audit import Verdict
from tests.faults.tables import JobId, RunKey, Tables
from tests.helpers import scalar as scalar  # where the fault tests find it

ROOT = Path(__file__).resolve().parents[2]
# How long the workload's retry waits for a job's row before it leaves that job alone.
RETRY_LOCK_WAIT_MS = 200
Conn = psycopg.Connection[Any]


def connect(dsn: str, **kwargs: Any) -> Conn:
    """An autocommit connection for the test's own reads and writes."""
    return psycopg.connect(dsn, autocommit=True, connect_timeout=5, **kwargs)


def with_port(dsn: str, port: int, host: str = "127.0.0.1") -> str:
    """``dsn`` pointed at another host and port."""
    return psycopg.conninfo.make_conninfo(dsn, host=host, port=str(port))


def host_port(dsn: str) -> tuple[str, int]:
    """Where ``dsn`` connects."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    return str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)


def reactor_pids(conn: Conn, role: str = "%") -> list[int]:
    """Backend pids of this database's reactor sessions (``role``: pool, listener, ...)."""
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name LIKE %s ORDER BY pid",
        (f"reactor-{role}",),
    ).fetchall()
    return [int(pid) for (pid,) in rows]


def listeners(conn: Conn) -> int:
    """How many reactor LISTEN sessions this database has."""
    return len(reactor_pids(conn, "listener"))


# -- fault windows -----------------------------------------------------------------------------


@dataclass
class FaultWindows:
    """The stretches a test cut the server or the network off, written to ``run_audit_excused``
    as each ends, so the verdict's lateness shows what the reactor does outside them: the
    handoffs and the recoveries, not the outage itself. Wall-clock times: the server may be
    down when a stretch begins, and it shares this machine's clock."""

    dsn: str
    began: float | None = None

    def begin(self) -> None:
        """A fault starts now (a second begin before an end keeps the first)."""
        if self.began is None:
            self.began = time.time()

    def end(self) -> None:
        """The fault is over: record its stretch (the server is answering again)."""
        if self.began is None:
            return
        began, self.began = self.began, None
        ended = time.time()
        for _ in range(50):
            try:
                with connect(self.dsn) as conn:
                    conn.execute(
                        "INSERT INTO run_audit_excused (from_at, until_at) "
                        "VALUES (to_timestamp(%s), to_timestamp(%s))",
                        (began, ended),
                    )
            except psycopg.OperationalError:
                time.sleep(0.1)  # the server is still coming back; no event to await here
            else:
                return


# The reference tables, where a caller names no other mapping.
REFERENCE_TABLES = REFERENCE.in_public()

# -- judging -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Judgement:
    """The database's verdict, with the counts a scenario's report shows."""

    verdict: Verdict

    @property
    def stale(self) -> int:
        """Worker rows that do not hold their run's newest job, or that job's last finish."""
        return self.verdict.stale

    def counts(self) -> dict[str, int]:
        v = self.verdict
        return {
            "lost": v.lost,
            "dup": v.dup,
            "clobbered": v.clobbered,
            "early": v.early,
            "wrong": v.wrong,
            "stale": self.stale,
        }

    @property
    def clean(self) -> bool:
        return self.verdict.clean

    def __str__(self) -> str:
        v = self.verdict
        late = "-" if v.lateness_max is None else f"{v.lateness_max:.2f}s"
        return (
            f"jobs={v.jobs} client={v.saved_by_client} worker={v.saved_by_worker} "
            + " ".join(f"{k}={n}" for k, n in self.counts().items())
            + f" worst_lateness={late}"
        )


async def judge(dsn: str, grace: float, mapping: Mapping = REFERENCE_TABLES) -> Judgement:
    """Count lost, dup, clobbered, early, wrong and stale (``audit.verdict``), on the tables
    ``mapping`` names."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return Judgement(await audit.verdict(conn, mapping, grace))


def judge_sync(dsn: str, grace: float) -> Judgement:
    """``judge`` from synchronous code."""
    return anyio.run(judge, dsn, grace, backend="asyncio")


def report_cells(
    scenario: str,
    cycles: int,
    judgement: Judgement,
    *,
    recovery: float | None,
    unhooked: int | None,
) -> str:
    """The cells of a scenario's row in the session's table (tests/conftest.py adds the
    outcome and the note)."""
    v = judgement.verdict

    def sec(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    return (
        f"| {scenario} | {cycles} | {v.jobs} | {v.lost} | {v.dup} | {v.clobbered} "
        f"| {v.early} | {v.wrong} | {judgement.stale} | {'-' if unhooked is None else unhooked} "
        f"| {sec(v.lateness_max)} | {sec(v.lateness_p99)} | {sec(recovery)} |"
    )


UNHOOKED_SQL = """
SELECT count(*) FROM @runs@ r
 WHERE @r.saved_by@ = @worker@
   AND NOT EXISTS (SELECT 1 FROM @reactor@.hook_outbox o
                    WHERE o.run_id = @r.key@ AND o.job_id = @r.job@
                      AND o.hook = %s AND o.status = 'done')
"""


def unhooked(conn: Conn, app: App, hook: str = "judge") -> int:
    """Worker-recorded runs of ``app``'s tables whose ``hook`` has not run to completion."""
    return int(scalar(conn, app.render(UNHOOKED_SQL), (hook,)))


async def settle(
    dsn: str,
    grace: float,
    *,
    within: float,
    mapping: Mapping = REFERENCE_TABLES,
    until: Callable[[Judgement], bool] = lambda j: j.clean,
) -> tuple[Judgement, float]:
    """Poll ``judge`` until ``until`` holds (default: nothing lost or stale), at most ``within`` s.

    Returns the last judgement and how long it took. Call it once the app is quiet and the
    last job's grace has passed, so ``lost`` only counts what the reactor still owes.
    """
    start = time.monotonic()
    while True:
        try:
            result = await judge(dsn, grace, mapping)
        except psycopg.OperationalError:
            result = None
        elapsed = time.monotonic() - start
        if result is not None and (until(result) or elapsed > within):
            return result, elapsed
        if elapsed > within + 30:
            raise AssertionError("the database did not answer the verdict")
        await anyio.sleep(0.1)


# -- the app -----------------------------------------------------------------------------------


def unsettled(tables: Tables, dsn: str, jobs: list[JobId]) -> int:
    """How many of ``jobs`` have no run row yet."""
    with connect(dsn) as conn:
        return int(
            scalar(
                conn,
                tables.render(
                    "SELECT count(*) FROM @jobs@ j WHERE @j.id@ = ANY(%s) "
                    "AND NOT EXISTS (SELECT 1 FROM @runs@ r WHERE @r.key@ = @j.run@)"
                ),
                (jobs,),
            )
        )


async def all_recorded(tables: Tables, dsn: str, jobs: list[JobId]) -> bool:
    """Whether every one of ``jobs`` has its run row. Read in a thread: a check that blocked the
    event loop would hold up the replicas it times, which run in this process."""
    return not await anyio.to_thread.run_sync(unsettled, tables, dsn, jobs)


@dataclass
class Workload:
    """The worker and the tabs, against ``dsn`` (directly, never through a fault), writing
    ``tables`` as the app does.

    Synchronous: async tests call it through ``anyio.to_thread.run_sync``.
    """

    dsn: str
    tables: Tables
    grace: float
    seed: int = 0
    save_ratio: float = 0.7
    reanalyse_ratio: float = 0.1
    # Of the finishes, how many are a retry of a job that finished more than a grace before
    # and that no tab saved (the first chance always is, so that every scenario has one, and
    # ``quiesce`` makes one in a scenario that had none): it goes back to running and finishes
    # again, with other verdicts, and its artifact must end up holding the last finish.
    retry_ratio: float = 0.05
    doc_bytes: int = 300
    rng: random.Random = field(init=False)
    finished: list[JobId] = field(default_factory=list)
    retried: list[JobId] = field(default_factory=list)
    saved: int = 0
    # The jobs no tab saves, with when each last finished: a retry's candidates.
    _unsaved: dict[JobId, float] = field(default_factory=dict)
    failed_writes: int = 0
    last_finish: float = 0.0
    _runs: list[RunKey] = field(default_factory=list)
    _saves: list[tuple[float, JobId]] = field(default_factory=list)
    _conn: Conn | None = None

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def _connection(self) -> Conn:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = connect(self.dsn)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def finish(self, count: int, *, save: bool = True) -> list[JobId]:
        """Create ``count`` jobs and finish each in its own transaction; queue the tabs' saves.

        Returns the jobs that finished (none while the database is down).
        """
        done: list[JobId] = []
        tables = self.tables
        try:
            conn = self._connection()
            for _ in range(count):
                run: RunKey | None = None
                if self._runs and self.rng.random() < self.reanalyse_ratio:
                    run = self.rng.choice(self._runs)  # a re-analysis: a later job, same run
                doc = "<p>" + "x" * self.doc_bytes + "</p>"
                job_id, run = tables.add_job(conn, run=run, doc=doc)
                failed = self.rng.choice((False, False, True))
                results = json.dumps({"verdicts": [self.rng.randrange(100)]})
                tables.finish(conn, job_id, failed=failed, results=results)
                done.append(job_id)
                self._runs.append(run)
                self._finished(job_id, save=save)
                if not self.retried or self.rng.random() < self.retry_ratio:
                    self._retry_one(conn, save=save)
        except psycopg.OperationalError:
            self.failed_writes += 1
            self._conn = None
        self.finished.extend(done)
        return done

    def _retry_one(self, conn: Conn, *, save: bool) -> bool:
        """Retry a job that finished more than a grace ago with no tab to save it, so that the
        reactor has written its run from that finish; False when there is none yet, or the one
        chosen is held by another transaction."""
        before = time.monotonic() - 1.5 * self.grace
        ready = [job for job, at in self._unsaved.items() if at < before]
        if not ready:
            return False
        job_id = self.rng.choice(ready)
        # The job goes back to running, then finishes again (mostly complete, after a failure),
        # each its own commit, with verdicts its first finish did not have. A job whose row
        # another transaction holds (a scenario's frozen claim) is left alone, not waited for:
        # the workload must go on whatever the fault holds.
        try:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{RETRY_LOCK_WAIT_MS}ms'")
                self.tables.reopen(conn, job_id)
        except psycopg.errors.LockNotAvailable:
            return False
        results = json.dumps({"verdicts": [self.rng.randrange(100, 200)], "retried": True})
        self.tables.finish(conn, job_id, failed=self.rng.random() < 0.2, results=results)
        self.retried.append(job_id)
        self._finished(job_id, save=save)
        return True

    def _finished(self, job_id: JobId, *, save: bool) -> None:
        # A job just finished: the grace counts from here, and a tab may save its run.
        self.last_finish = time.monotonic()
        if save and self.rng.random() < self.save_ratio:
            at = time.monotonic() + self.rng.uniform(0.05, 0.5) * self.grace
            heapq.heappush(self._saves, (at, job_id))
            self._unsaved.pop(job_id, None)
        else:
            self._unsaved[job_id] = self.last_finish

    def save_due(self) -> int:
        """Run the tabs' saves whose time has come; a save the database refuses is given up."""
        count = 0
        now = time.monotonic()
        while self._saves and self._saves[0][0] <= now:
            _, job_id = heapq.heappop(self._saves)
            try:
                self.tables.client_save(self._connection(), job_id)
                count += 1
            except psycopg.OperationalError:
                self.failed_writes += 1
                self._conn = None
        self.saved += count
        return count

    def tick(self, count: int) -> None:
        """One step of the app: due saves, then ``count`` more jobs finish."""
        self.save_due()
        self.finish(count)

    def drive(self, seconds: float, per_second: float, *, step: float = 0.1) -> None:
        """Finish jobs at ``per_second`` for ``seconds``, saving as the tabs do (paced)."""
        end = time.monotonic() + seconds
        owed = 0.0
        while time.monotonic() < end:
            owed += per_second * step
            whole = int(owed)
            owed -= whole
            self.tick(whole)
            time.sleep(step)  # pacing the load, not waiting for anything

    @contextmanager
    def running(self, per_second: float, *, step: float = 0.1) -> Iterator[None]:
        """Keep the app busy in a thread for the duration of the block."""
        stop = threading.Event()

        def loop() -> None:
            owed = 0.0
            while not stop.is_set():
                owed += per_second * step
                whole = int(owed)
                owed -= whole
                self.tick(whole)
                stop.wait(step)

        thread = threading.Thread(target=loop, name="workload", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(60)

    def quiesce(self) -> None:
        """Run the saves still queued (each at its time), retry a job if none was (once the
        reactor had time to write one's run), then wait out the last grace."""
        while self._saves:
            time.sleep(max(0.0, self._saves[0][0] - time.monotonic()))
            self.save_due()
        if not self.retried and self._unsaved:
            first = min(self._unsaved.values())
            time.sleep(max(0.0, first + 1.5 * self.grace + 0.01 - time.monotonic()))
            try:
                self._retry_one(self._connection(), save=False)
            except psycopg.OperationalError:
                self.failed_writes += 1
                self._conn = None
        time.sleep(max(0.0, self.last_finish + self.grace + 0.05 - time.monotonic()))


# -- reactor processes -------------------------------------------------------------------------


def replica_env(dsn: str, tables: Tables, **variables: str) -> dict[str, str]:
    """The environment of a ``reactor run`` subprocess on ``tables`` (their mapping's file as
    REACTOR_CONFIG), fast probes, short grace, no HTTP."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTOR_")}
    env.pop("DATABASE_URL", None)
    env.update(tables.env)
    env.update(
        {
            "DATABASE_URL": dsn,
            "REACTOR_HTTP_ADDR": "",
            "REACTOR_DASHBOARD_ADDR": "",
            "REACTOR_LOG_FORMAT": "json",
            "REACTOR_GRACE_SECONDS": "1",
            "REACTOR_SCAN_INTERVAL_SECONDS": "30",
            "REACTOR_PROBE_INTERVAL_SECONDS": "1",
            "REACTOR_PROBE_TIMEOUT_SECONDS": "1",
            "REACTOR_DRAIN_SECONDS": "5",
            **variables,
        }
    )
    return env


@dataclass
class Replica:
    """One ``python -m reactor run`` process; its output goes to a file, never a pipe."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    started_at: float = field(default_factory=time.time)  # our wall clock

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """kill -9."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def terminate(self) -> None:
        """SIGTERM: the reactor drains and exits."""
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def messages(self) -> list[str]:
        """The ``message`` of every JSON log line so far."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                out.append(str(json.loads(line).get("message")))
            except (ValueError, AttributeError):
                out.append(line)
        return out

    def rss(self) -> int:
        """Resident memory in bytes (Linux /proc)."""
        pages = int(Path(f"/proc/{self.pid}/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")


@dataclass
class Replicas:
    """Starts replicas and makes sure none outlives the test."""

    directory: Path
    started: list[Replica] = field(default_factory=list)

    def start(self, env: dict[str, str], name: str | None = None) -> Replica:
        name = name or f"r{len(self.started)}"
        log = self.directory / f"{name}-{len(self.started)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "reactor", "run"],
                env=env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        replica = Replica(name, proc, log)
        self.started.append(replica)
        return replica

    def alive(self) -> list[Replica]:
        return [r for r in self.started if r.alive()]

    def close(self) -> None:
        for replica in self.started:
            if replica.alive():
                replica.proc.send_signal(signal.SIGKILL)
            replica.proc.wait(30)

    def __iter__(self) -> Iterator[Replica]:
        return iter(self.started)
