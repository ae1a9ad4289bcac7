"""handoffs: how late jobs are while the set of replicas changes, measured from outside.

Every replica is a real ``reactor run`` process with a 2 s grace, logging JSON lines to a file of
its own; the worker (a child process) finishes jobs at a steady rate while tabs save 70% of them
inside the grace. Lateness is the audit row of the reactor's write minus ``updated_at + grace``,
both by the database clock. Three scenarios, each on a fresh database:

- rolling deploys: 3 replicas at 50 jobs/s; three times a new process starts, and once its
  ``/readyz`` says ready the oldest gets SIGTERM and is waited for, as an orchestrator does;
- eager deploys: the same with 1 replica and with 3, but the SIGTERM comes 0.5, 1 and 1.5 s
  after the new process starts (the first well before it can be ready, the last about when it
  is on this box), ready or not, and the app touches 30% of the finished jobs 0.6 grace after
  their finish (their deadline moves, with no notification);
- killed for good: 3 replicas at 50 jobs/s, one SIGKILLed a third of the way in and never
  restarted; the others must take its jobs over within a probe interval (its LISTEN session is
  gone at their next check), so the bound is the probe interval + 1 s;
- a fleet at 333 jobs/s: 1 replica, then 3, then 5, so that what more replicas cost shows as
  lateness and as the replicas' CPU time per 1,000 jobs (read from /proc, with the server's and
  the box's load average, so that a figure says whether the algorithm or the box was slow);
  then 5 again with the trigger installed with ``reactor migrate --spread`` (each replica hears
  only the jobs of the shares it owns, and nobody rings the doorbell).

The job trigger is installed as ``reactor migrate`` installs it: it notifies one channel, so
that every replica hears every job until one of them rings the doorbell, from which on the
replicas poll the queue (docs/how-it-works.md).

Each run is checked as the other benchmarks check theirs: every job that needed a run has
exactly one, none was written before its grace, none clobbered a tab's save, every replica
stopped by SIGTERM exited 0 and took its heartbeat with it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.abc

from bench.conn import Conn, connect, dbname, scalar
from bench.loadgen import play_elsewhere
from bench.processes import cpu_by_process
from bench.result import Context, Result, Table, conditions
from bench.server import Server, open_server
from bench.stats import ms, ratio, safe_div, summarize
from bench.workload import Play, insert_jobs, wait_until_recorded
from reactor.install import REFERENCE_INSTALL
from reactor.testing import Settings, audit

TITLE = "Handoffs: lateness through rolling deploys, a replica killed for good, and a fleet"
GOAL = (
    "rolling deploys: p99 <= 20 ms over the run and over the jobs due within 2 s of a SIGTERM; "
    "eager deploys with touched jobs: p99 <= 20 ms and max <= 1 s; "
    "killed for good: every job due after the kill late by at most the probe interval + 1 s; "
    "333 jobs/s: p99 <= 10 ms at 1, 3 and 5 replicas; the replicas' CPU per 1,000 jobs at 5 "
    "within 1.2x of 1"
)

GRACE = 2.0
RATE = 50.0
FLEET_RATE = 333.0
SAVE_RATIO = 0.7
# Inside the grace, as in bench/replicas.py: a tab's save lands before the reactor's deadline.
TAB_DELAY = (0.1, 1.6)
WINDOW = 2.0  # a job "fell due around" an event when its deadline is within this of it
DEPLOY_GOAL_S = 0.020
FLEET_GOAL_S = 0.010
CPU_GROWTH = 1.2
EAGER_MAX_S = 1.0
# Eager deploys: the SIGTERM this long after the new process's start, whether it is ready or not;
# one deploy each, cycled. A replica takes about a second to be ready on a 2-core box.
EAGER_SIGTERM_AFTER = (0.5, 1.0, 1.5)
# The app moves the deadline of this share of the finished jobs, this share of a grace after
# their finish: the old deadline has not passed, and no notification tells anyone.
TOUCH_RATIO = 0.3
TOUCH_AT = 0.6
READY_TIMEOUT = 30.0
# A stopped replica drains for up to REACTOR_DRAIN_SECONDS (20 s by default), then exits.
EXIT_TIMEOUT = Settings.drain + 10.0
# A job late by more than this in a deploy or the fleet is an anomaly: its log lines are kept.
ANOMALY_S = 1.0

ROOT = Path(__file__).resolve().parent.parent

# Every reactor write, the first per job (a second one is a duplicate, counted by the verdict):
# the job, its deadline (unix time) and how late the write landed past it.
LATENESS = """
SELECT DISTINCT ON (a.job_id) a.job_id::text,
       extract(epoch FROM j.updated_at)::float8 + %(grace)s,
       extract(epoch FROM a.at - (j.updated_at + make_interval(secs => %(grace)s)))::float8
  FROM run_audit a JOIN analysis_jobs j ON j.id = a.job_id
 WHERE a.saved_by = 'worker' AND a.op <> 'DELETE'
 ORDER BY a.job_id, a.seq
"""

# The timer's and the scan's claim-and-write statements, as bench/replicas.py counts them: they
# write the runs table, and begin with their CTEs, where the tab's save begins with its INSERT.
RECORD_CALLS = """
SELECT coalesce(sum(s.calls), 0)::bigint
  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
 WHERE d.datname = %s AND s.query LIKE '%%INSERT INTO "public"."analysis_runs" AS r%%'
   AND s.query NOT LIKE 'INSERT%%'
"""


# -- reactor processes ---------------------------------------------------------------------------


@dataclass
class Replica:
    """One ``reactor run`` process: its HTTP port, its log file and what became of it."""

    name: str
    process: anyio.abc.Process
    port: int
    log: Path
    started_at: float  # unix time
    ready_s: float | None = None  # from the spawn to /readyz answering 200
    stop_s: float | None = None  # from SIGTERM to the exit
    signalled: str | None = None

    @property
    def running(self) -> bool:
        """True while the process has not exited."""
        return self.process.returncode is None


@dataclass
class Fleet:
    """The replicas of one scenario, spawned with one environment, oldest first."""

    dsn: str
    logs: Path
    label: str
    level: str
    probe: float
    replicas: list[Replica] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    closed: bool = False

    def _env(self, port: int) -> dict[str, str]:
        # Nothing of the caller's REACTOR_* leaks in: every replica runs with exactly these.
        env = {k: v for k, v in os.environ.items() if not k.startswith("REACTOR_")}
        env.update(
            {
                "DATABASE_URL": self.dsn,
                "REACTOR_GRACE_SECONDS": str(GRACE),
                "REACTOR_HTTP_ADDR": f"127.0.0.1:{port}",
                "REACTOR_DASHBOARD_ADDR": "",
                "REACTOR_LOG_FORMAT": "json",
                "REACTOR_LOG_LEVEL": self.level,
                "REACTOR_PROBE_INTERVAL_SECONDS": str(self.probe),
                "REACTOR_PROBE_TIMEOUT_SECONDS": str(self.probe),
            }
        )
        return env

    async def spawn(self) -> Replica:
        """Start one more replica (not waiting for it to be ready)."""
        name = f"{self.label}-r{len(self.replicas) + 1}"
        port = _free_port()
        log = self.logs / f"{name}.log"
        with log.open("wb") as err:
            process = await anyio.open_process(
                [sys.executable, "-m", "reactor", "run"],
                env=self._env(port),
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        replica = Replica(name, process, port, log, time.time())
        self.replicas.append(replica)
        return replica

    async def ready(self, replica: Replica, session: aiohttp.ClientSession) -> bool:
        """Wait until ``replica``'s /readyz answers 200; False (and a problem) if it never does."""
        url = f"http://127.0.0.1:{replica.port}/readyz"
        with anyio.move_on_after(READY_TIMEOUT):
            while replica.running:
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with session.get(url) as response:
                        if response.status == 200:
                            replica.ready_s = time.time() - replica.started_at
                            return True
                await anyio.sleep(0.05)
        state = "exited" if not replica.running else f"not ready after {READY_TIMEOUT:g} s"
        self.problems.append(f"{replica.name} {state} (log {replica.log.name})")
        return False

    async def start(self, count: int, session: aiohttp.ClientSession) -> None:
        """Spawn ``count`` replicas side by side and wait until each is ready and sees them all.

        Seeing them all (its reactor_replicas_live gauge) means ownership has settled, so the
        load does not start while two replicas still think they own the same jobs.
        """
        started = [await self.spawn() for _ in range(count)]
        async with anyio.create_task_group() as tg:
            for replica in started:
                tg.start_soon(self.ready, replica, session)
        with anyio.move_on_after(READY_TIMEOUT) as scope:
            # The gauge is only scraped, never announced: polling keeps the reactor untouched.
            while [await _live(session, r) for r in started] != [count] * count:  # noqa: ASYNC110
                await anyio.sleep(0.1)
        if scope.cancelled_caught:
            self.problems.append(f"{count} replicas did not all see {count} live")

    async def terminate(self, replica: Replica) -> None:
        """SIGTERM ``replica`` and wait for its drain and exit."""
        sent = time.time()
        replica.signalled = "SIGTERM"
        replica.process.send_signal(signal.SIGTERM)
        with anyio.move_on_after(EXIT_TIMEOUT):
            await replica.process.wait()
        if replica.running:
            self.problems.append(f"{replica.name} still running {EXIT_TIMEOUT:g} s after SIGTERM")
            return
        replica.stop_s = time.time() - sent
        if replica.process.returncode != 0:
            self.problems.append(
                f"{replica.name} exited {replica.process.returncode} after SIGTERM"
            )

    def kill(self, replica: Replica) -> None:
        """SIGKILL ``replica``: no drain, no goodbye."""
        replica.signalled = "SIGKILL"
        replica.process.send_signal(signal.SIGKILL)

    async def close(self) -> None:
        """Stop whatever still runs: SIGTERM, shielded, then SIGKILL for a replica that hangs.

        Idempotent: the measurement closes the fleet before its checks, the cleanup again.
        """
        if self.closed:
            return
        self.closed = True
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for replica in self.replicas:
                    if replica.running:
                        tg.start_soon(self.terminate, replica)
            for replica in self.replicas:
                if replica.running:
                    replica.process.kill()
                    await replica.process.wait()
                await replica.process.aclose()

    def log_problems(self) -> list[str]:
        """Error lines and unfinished drains in the logs, one problem per replica."""
        found = []
        for replica in self.replicas:
            lines = list(_log_lines(replica.log))
            errors = [e for e in lines if e.get("level") in ("error", "critical")]
            cut = [e for e in lines if "drain deadline passed" in str(e.get("message"))]
            if errors:
                found.append(
                    f"{replica.name} logged {len(errors)} error(s), first: "
                    f"{errors[0].get('message')!r}"
                )
            if cut:
                found.append(f"{replica.name}'s drain deadline passed")
        return found


def _free_port() -> int:
    # The kernel picks a port nobody holds; the reactor binds it a moment later.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _live(session: aiohttp.ClientSession, replica: Replica) -> float:
    """The replica's reactor_replicas_live gauge, NaN when it cannot be read."""
    with contextlib.suppress(aiohttp.ClientError, OSError):
        async with session.get(f"http://127.0.0.1:{replica.port}/metrics") as response:
            for line in (await response.text()).splitlines():
                if line.startswith("reactor_replicas_live "):
                    return float(line.split()[1])
    return math.nan


def _log_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON lines of a replica's log; anything else (a traceback) as a message."""
    if not path.exists():
        return
    for line in path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            entry = {"level": "error" if "Traceback" in line else "text", "message": line}
        if isinstance(entry, dict):
            yield entry


# -- measuring -----------------------------------------------------------------------------------


@dataclass
class Usage:
    """CPU seconds spent from :meth:`start` to :meth:`stop` by the fleet's replicas and by the
    server's processes (None when the server is not on this machine), and the box's 1-minute
    load average at the stop."""

    fleet: Fleet
    server_pid: int | None
    replicas_s: float = math.nan
    server_s: float = math.nan
    load_1m: float = math.nan
    _before: dict[int, float] = field(default_factory=dict)

    def _sample(self) -> dict[int, float]:
        found = cpu_by_process([r.process.pid for r in self.fleet.replicas if r.running])
        if self.server_pid is not None:
            found.update(cpu_by_process([self.server_pid], children=True))
        return found

    def start(self) -> None:
        """Begin the stretch: the work from here on is counted."""
        self._before = self._sample()

    def stop(self) -> None:
        """End the stretch (before any replica stops: a stopped process's time is gone)."""
        replicas = {r.process.pid for r in self.fleet.replicas}
        spent = {pid: cpu - self._before.get(pid, 0.0) for pid, cpu in self._sample().items()}
        self.replicas_s = sum(cpu for pid, cpu in spent.items() if pid in replicas)
        if self.server_pid is not None:
            self.server_s = sum(cpu for pid, cpu in spent.items() if pid not in replicas)
        self.load_1m = os.getloadavg()[0]

    def per_thousand(self, jobs: int) -> dict[str, float]:
        """CPU seconds per 1,000 ``jobs``, and the load average."""
        return {
            "replicas_s": safe_div(self.replicas_s * 1000, jobs),
            "server_s": safe_div(self.server_s * 1000, jobs),
            "load_1m": self.load_1m,
        }


@dataclass
class Outcome:
    """What one scenario's database says: lateness per job and every broken invariant."""

    jobs: int
    late: dict[str, tuple[float, float]]  # job -> (deadline, lateness), both in seconds
    verdict: audit.Verdict
    missing: int
    record_calls: int
    play: Play
    problems: list[str]

    def lateness(self) -> list[float]:
        """Lateness of every reactor write."""
        return [late for _, late in self.late.values()]


async def _setup(
    server: Server, label: str, jobs: int, *, spread: bool = False
) -> tuple[str, list[str]]:
    # ``spread``: the trigger notifies each share of the jobs on a channel of its own.
    dsn = await server.app_database(label, with_audit=True, spread=spread)
    async with await connect(dsn, "setup") as conn:
        ids = await insert_jobs(conn, jobs, doc_bytes=2000)
    return dsn, ids


async def _outcome(
    server: Server,
    dsn: str,
    ids: Sequence[str],
    played: Play,
    fleet: Fleet,
    usage: Usage | None = None,
) -> Outcome:
    """Wait for the last runs, stop ``usage`` and the replicas, and read and check what the
    database holds."""
    async with await connect(dsn, "check") as conn:
        missing = await wait_until_recorded(conn, within=GRACE + 30)
        if usage is not None:
            usage.stop()
        await fleet.close()
        verdict = await audit.verdict(conn, REFERENCE_INSTALL.mapping, GRACE)
        rows = await (await conn.execute(LATENESS, {"grace": GRACE})).fetchall()
        # The extension's view lives where it was created: the admin database.
        async with await connect(server.admin_dsn, "count") as admin:
            record_calls = int(await scalar(admin, RECORD_CALLS, (dbname(dsn),)))
        problems = fleet.problems + fleet.log_problems()
        problems += await _invariants(conn, ids, played, verdict, missing, fleet)
    late = {job: (due, lateness) for job, due, lateness in rows}
    return Outcome(len(ids), late, verdict, missing, record_calls, played, problems)


async def _invariants(
    conn: Conn,
    ids: Sequence[str],
    played: Play,
    verdict: audit.Verdict,
    missing: int,
    fleet: Fleet,
) -> list[str]:
    problems = []
    if played.finished != len(ids):
        problems.append(f"the worker finished {played.finished} of {len(ids)} jobs")
    if missing:
        problems.append(f"{missing} job(s) still without a run {GRACE + 30:g} s after the load")
    runs = int(await scalar(conn, "SELECT count(*) FROM analysis_runs"))
    # Every job has a run id of its own: one run per finished job, no more, no fewer.
    if runs != played.finished:
        problems.append(f"{runs} runs for {played.finished} finished jobs")
    for name in ("lost", "dup", "clobbered", "early", "wrong"):
        count = getattr(verdict, name)
        if count:
            problems.append(f"audit: {count} {name}")
    # A clean stop deletes the heartbeat; only a killed replica's may stay behind.
    beats = int(await scalar(conn, "SELECT count(*) FROM reactor.replicas"))
    killed = sum(1 for r in fleet.replicas if r.signalled == "SIGKILL")
    if beats != killed:
        problems.append(f"{beats} heartbeat row(s) left after the stops, not {killed}")
    return problems


def _anomalies(
    outcome: Outcome, fleet: Fleet, slow: Sequence[tuple[str, float]] | None = None
) -> list[str]:
    """Jobs late by seconds (``slow``, as (job, lateness); by default every job late by more
    than ANOMALY_S), with the log line that recorded each of the worst three when the replicas
    logged at info: which replica, and whether its timer or a scan."""
    if slow is None:
        slow = [(job, late) for job, (_, late) in outcome.late.items() if late > ANOMALY_S]
    if not slow:
        return []
    ranked = sorted(slow, key=lambda s: -s[1])
    found = [f"{len(ranked)} job(s) late by seconds, worst {ranked[0][1]:.2f} s"]
    worst = dict(ranked[:3])
    for replica in fleet.replicas:
        for entry in _log_lines(replica.log):
            if entry.get("job_id") in worst and entry.get("message") == "recorded run":
                found.append(
                    f"job {entry['job_id']} ({worst[entry['job_id']]:.2f} s late) recorded by "
                    f"{replica.name} via {entry.get('source')} at {entry.get('time')}"
                )
    return found


# -- the scenarios -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scale:
    """How big each scenario is: the full run's, or --quick's toy one."""

    deploy_replicas: int
    deploy_seconds: float
    deploys: int
    deploy_lead: float  # load before the first deploy
    deploy_gap: float  # load after each deploy, before the next
    kill_replicas: int
    kill_seconds: float
    probe: float
    eager_replicas: tuple[int, ...]
    eager_seconds: float
    fleet_counts: tuple[int, ...]  # the last two are compared by lateness, last and first by CPU
    fleet_seconds: float
    fleet_rate: float
    side_by_side: bool  # the scenarios at once (quick: the figures only show that it runs)


FULL = Scale(
    deploy_replicas=3,
    deploy_seconds=60.0,
    deploys=3,
    deploy_lead=8.0,
    deploy_gap=10.0,
    kill_replicas=3,
    kill_seconds=60.0,
    probe=Settings.probe_interval,
    eager_replicas=(1, 3),
    eager_seconds=55.0,
    fleet_counts=(1, 3, 5),
    fleet_seconds=45.0,
    fleet_rate=FLEET_RATE,
    side_by_side=False,
)
# Quick: every process start costs about a CPU second, so fewer replicas, all scenarios at once,
# and 1 s probes; the kill comes after the victim's second check (see _kill).
QUICK = Scale(
    deploy_replicas=2,
    deploy_seconds=4.0,
    deploys=1,
    deploy_lead=1.0,
    deploy_gap=0.5,
    kill_replicas=2,
    kill_seconds=4.5,
    probe=1.0,
    eager_replicas=(1,),
    eager_seconds=4.0,
    fleet_counts=(1, 2),
    fleet_seconds=2.0,
    fleet_rate=RATE,
    side_by_side=True,
)


async def _load(
    dsn: str, ids: Sequence[str], rate: float, played: list[Play], *, touch: bool = False
) -> None:
    touches = {"touch_ratio": TOUCH_RATIO, "touch_delay": TOUCH_AT * GRACE} if touch else {}
    played.append(
        await play_elsewhere(
            dsn, list(ids), rate=rate, save_ratio=SAVE_RATIO, tab_delay=TAB_DELAY, **touches
        )
    )


async def _deploys(
    server: Server, logs: Path, scale: Scale, replicas: int, *, eager: bool = False
) -> dict[str, Any]:
    """Start a replica, SIGTERM the oldest; ``scale.deploys`` times. The SIGTERM waits for the
    new replica's readiness, or, ``eager``, comes EAGER_SIGTERM_AFTER its start while the app
    touches jobs."""
    delays = itertools.cycle(EAGER_SIGTERM_AFTER)
    label = f"eager{replicas}" if eager else "deploy"
    seconds = scale.eager_seconds if eager else scale.deploy_seconds
    dsn, ids = await _setup(server, f"handoffs_{label}", int(seconds * RATE))
    fleet = Fleet(dsn, logs, label, "INFO", scale.probe)
    replaced: list[tuple[Replica, Replica, float]] = []  # (new, oldest, its SIGTERM's time)
    played: list[Play] = []
    async with aiohttp.ClientSession() as session:
        try:
            await fleet.start(replicas, session)
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(_load, dsn, ids, RATE, played, touch=eager))
                await anyio.sleep(scale.deploy_lead)
                for _ in range(scale.deploys):
                    new = await fleet.spawn()
                    oldest = next(r for r in fleet.replicas if r.running and r is not new)
                    if eager:
                        tg.start_soon(fleet.ready, new, session)
                        await anyio.sleep(new.started_at + next(delays) - time.time())
                    else:
                        await fleet.ready(new, session)
                    sigterm_at = time.time()
                    await fleet.terminate(oldest)
                    replaced.append((new, oldest, sigterm_at))
                    await anyio.sleep(scale.deploy_gap)
                if played:
                    fleet.problems.append("the load ended before the last deploy did")
            # Read once the task group is done: an eager deploy's new replica may have become
            # ready after its predecessor's SIGTERM.
            steps: list[dict[str, Any]] = [
                {
                    "new": new.name,
                    "ready_at": new.started_at + (new.ready_s or math.nan),
                    "new_ready_s": new.ready_s,
                    "stopped": oldest.name,
                    "sigterm_at": sigterm_at,
                    "stop_s": oldest.stop_s,
                }
                for new, oldest, sigterm_at in replaced
            ]
            outcome = await _outcome(server, dsn, ids, played[0], fleet)
        finally:
            await fleet.close()
    terms = [s["sigterm_at"] for s in steps]
    return {
        "replicas": replicas,
        "outcome": outcome,
        "steps": steps,
        "all": summarize(outcome.lateness()),
        "around_sigterm": summarize(_around(outcome, terms)),
        "anomalies": _anomalies(outcome, fleet),
    }


def _around(outcome: Outcome, moments: Sequence[float]) -> list[float]:
    """Lateness of the jobs due within WINDOW of any of ``moments`` (each job once)."""
    return [
        late
        for due, late in outcome.late.values()
        if any(abs(due - moment) <= WINDOW for moment in moments)
    ]


async def _kill(server: Server, logs: Path, scale: Scale) -> dict[str, Any]:
    """SIGKILL the oldest replica a third of the way in, never to come back.

    A third of the way in is past the victim's second health check in both scales: only from
    its second check on does its heartbeat name its LISTEN session, which is what lets the
    others drop it at their next check rather than when its heartbeat ages out.
    """
    dsn, ids = await _setup(server, "handoffs_kill", int(scale.kill_seconds * RATE))
    fleet = Fleet(dsn, logs, "kill", "INFO", scale.probe)
    played: list[Play] = []
    async with aiohttp.ClientSession() as session:
        try:
            await fleet.start(scale.kill_replicas, session)
            async with anyio.create_task_group() as tg:
                tg.start_soon(_load, dsn, ids, RATE, played)
                await anyio.sleep(scale.kill_seconds / 3)
                victim = fleet.replicas[0]
                killed_at = time.time()
                fleet.kill(victim)
            outcome = await _outcome(server, dsn, ids, played[0], fleet)
        finally:
            await fleet.close()
    bound = scale.probe + 1.0
    after = {job: (due, late) for job, (due, late) in outcome.late.items() if due > killed_at}
    # Past the bound, or seconds late once the others should long have taken over.
    slow = [
        (job, late)
        for job, (due, late) in after.items()
        if late > bound or (due > killed_at + bound and late > ANOMALY_S)
    ]
    return {
        "outcome": outcome,
        "killed": victim.name,
        "killed_after_s": killed_at - victim.started_at,
        "after_kill": summarize([late for _, late in after.values()]),
        "late_over_half_s": sum(1 for _, late in after.values() if late > 0.5),
        "bound_s": bound,
        "record_statements_per_job": safe_div(outcome.record_calls, outcome.play.finished),
        "anomalies": _anomalies(outcome, fleet, slow),
    }


async def _fleet(
    server: Server, logs: Path, count: int, scale: Scale, *, spread: bool = False
) -> dict[str, Any]:
    """``count`` replicas under the fleet's rate; ``spread``: the trigger notifies each share on
    a channel of its own (else every replica hears every job)."""
    rate = scale.fleet_rate
    label = f"handoffs_fleet{count}" + ("_spread" if spread else "")
    dsn, ids = await _setup(server, label, int(scale.fleet_seconds * rate), spread=spread)
    # Warning level: at 333 jobs/s an info line per recorded run costs the replicas CPU that
    # the measurement is about; the in-process benchmarks quiet the reactor the same way.
    fleet = Fleet(dsn, logs, label.removeprefix("handoffs_"), "WARNING", scale.probe)
    usage = Usage(fleet, await server.postmaster_pid())
    played: list[Play] = []
    async with aiohttp.ClientSession() as session:
        try:
            await fleet.start(count, session)
            usage.start()
            await _load(dsn, ids, rate, played)
            outcome = await _outcome(server, dsn, ids, played[0], fleet, usage)
        finally:
            await fleet.close()
    return {
        "replicas": count,
        "outcome": outcome,
        "lateness": summarize(outcome.lateness()),
        "cpu_per_1000_jobs": usage.per_thousand(outcome.play.finished),
        "record_statements_per_job": safe_div(outcome.record_calls, outcome.play.finished),
        "anomalies": _anomalies(outcome, fleet),
    }


async def _scenarios(server: Server, logs: Path, scale: Scale) -> dict[str, dict[str, Any]]:
    """Every scenario, one after the other (or side by side), each on a database of its own."""
    jobs: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
        "deploy": partial(_deploys, server, logs, scale, scale.deploy_replicas),
        **{
            f"eager{n}": partial(_deploys, server, logs, scale, n, eager=True)
            for n in scale.eager_replicas
        },
        "kill": partial(_kill, server, logs, scale),
        **{f"fleet{n}": partial(_fleet, server, logs, n, scale) for n in scale.fleet_counts},
        # The largest fleet again with a trigger that spreads: what --spread saves, or costs.
        "spread": partial(_fleet, server, logs, scale.fleet_counts[-1], scale, spread=True),
    }
    found: dict[str, dict[str, Any]] = {}

    async def one(name: str) -> None:
        found[name] = await jobs[name]()

    if scale.side_by_side:
        async with anyio.create_task_group() as tg:
            for name in jobs:
                tg.start_soon(one, name)
    else:
        for name in jobs:
            await one(name)
    return {name: found[name] for name in jobs}


# -- the result ----------------------------------------------------------------------------------


async def run(ctx: Context) -> Result:
    """The three scenarios, each on a fresh database of one server."""
    scale = QUICK if ctx.quick else FULL
    first, small, large = scale.fleet_counts[0], *scale.fleet_counts[-2:]
    settings: dict[str, Any] = {
        "grace_s": GRACE,
        "tab_save_ratio": SAVE_RATIO,
        "tab_delay_s": list(TAB_DELAY),
        "window_s": WINDOW,
        **asdict(scale),
        "jobs_per_s": RATE,
    }
    logs = Path(tempfile.mkdtemp(prefix="bench-handoffs-"))
    async with open_server({"shared_preload_libraries": "pg_stat_statements"}) as server:
        cond = await conditions(server, quick=ctx.quick)
        async with await connect(server.admin_dsn, "setup") as admin:
            await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        scenarios = await _scenarios(server, logs, scale)
    deploy, kill = scenarios["deploy"], scenarios["kill"]
    eagers = [scenarios[f"eager{n}"] for n in scale.eager_replicas]
    fleets = [scenarios[f"fleet{n}"] for n in scale.fleet_counts]
    by_count = {f["replicas"]: f for f in fleets}
    spread = scenarios["spread"]
    spread_cpu = spread["cpu_per_1000_jobs"]

    problems = [f"{name}: {p}" for name, s in scenarios.items() for p in s["outcome"].problems]
    anomalies = [f"{name}: {a}" for name, s in scenarios.items() for a in s["anomalies"]]
    if problems or anomalies:
        logs_note = f"The replicas' logs are kept in {logs} for the problems and anomalies."
    else:
        shutil.rmtree(logs, ignore_errors=True)
        logs_note = "No problem and no job late by seconds: the replicas' logs were deleted."

    deploy_ok = (
        deploy["all"]["p99"] <= DEPLOY_GOAL_S and deploy["around_sigterm"]["p99"] <= DEPLOY_GOAL_S
    )
    eager_ok = all(
        e["all"]["p99"] <= DEPLOY_GOAL_S and e["all"]["max"] <= EAGER_MAX_S for e in eagers
    )
    kill_ok = not kill["after_kill"]["max"] > kill["bound_s"]  # NaN (none due) is no miss
    p99_small, p99_large = (by_count[n]["lateness"]["p99"] for n in (small, large))
    growth = safe_div(p99_large, p99_small)
    p99_worst = max(f["lateness"]["p99"] for f in fleets)
    cpu = {n: f["cpu_per_1000_jobs"] for n, f in by_count.items()}
    cpu_growth = safe_div(cpu[large]["replicas_s"], cpu[first]["replicas_s"])
    fleet_ok = p99_worst <= FLEET_GOAL_S and cpu_growth <= CPU_GROWTH
    met = deploy_ok and eager_ok and kill_ok and fleet_ok and not problems

    table = Table(["scenario", "reactor-written runs", "p50", "p99", "max", "goal"])

    def row(label: str, s: dict[str, float], goal: str) -> None:
        table.add(label, s["n"], ms(s["p50"]), ms(s["p99"]), ms(s["max"]), goal)

    row("rolling deploys: whole run", deploy["all"], _mark(deploy["all"]["p99"], DEPLOY_GOAL_S))
    row(
        f"rolling deploys: due within {WINDOW:g} s of a SIGTERM",
        deploy["around_sigterm"],
        _mark(deploy["around_sigterm"]["p99"], DEPLOY_GOAL_S),
    )
    for e in eagers:
        held = "met" if e["all"]["max"] <= EAGER_MAX_S else "missed"
        row(
            f"eager deploys, touched jobs, {_replicas(e['replicas'])}",
            e["all"],
            _mark(e["all"]["p99"], DEPLOY_GOAL_S) + f"; max <= {EAGER_MAX_S:g} s: {held}",
        )
    row(
        "killed for good: due after the kill",
        kill["after_kill"],
        f"max <= {kill['bound_s']:g} s: {'met' if kill_ok else 'missed'}",
    )
    for f in fleets:
        row(
            f"{scale.fleet_rate:g} jobs/s, {_replicas(f['replicas'])}",
            f["lateness"],
            _mark(f["lateness"]["p99"], FLEET_GOAL_S)
            + (f"; {ratio(growth)} of {small}'s" if f["replicas"] == large else ""),
        )
    row(
        f"{scale.fleet_rate:g} jobs/s, {_replicas(large)}, trigger spread (--spread)",
        spread["lateness"],
        "-",
    )

    steps = deploy["steps"]
    probe_source = (
        "the default" if scale.probe == Settings.probe_interval else "shortened for --quick"
    )
    ready_s = ", ".join(f"{s['new_ready_s']:.2f} s" for s in steps if s["new_ready_s"])
    stop_s = ", ".join(f"{s['stop_s']:.2f} s" for s in steps if s["stop_s"])
    behind = ", ".join(
        f"{s['outcome'].play.behind_s * 1000:.0f} ms ({n})" for n, s in scenarios.items()
    )
    notes = [
        f"Every replica is a `reactor run` process with a {GRACE:g} s grace; the worker runs in "
        f"a process of its own, and tabs save {SAVE_RATIO:.0%} of the jobs "
        f"{TAB_DELAY[0]:g}-{TAB_DELAY[1]:g} s after they finish (inside the grace), so the "
        "reactor writes the other 30% and lateness is measured on those: the audit row of the "
        "reactor's write minus updated_at + grace, by the database clock.",
        f"Rolling deploys: {scale.deploy_replicas} replicas at {RATE:g} jobs/s for "
        f"{scale.deploy_seconds:g} s; {_times(scale.deploys)}, a new process started, waited "
        f"for until its /readyz answered 200 ({ready_s} after its start), then the oldest got "
        f"SIGTERM and was waited for (exited after {stop_s}). A job counts as around a SIGTERM "
        f"when its deadline is within {WINDOW:g} s of it; the SIGTERM follows the new "
        "replica's readiness within a millisecond, so the window covers its joining too. "
        "Replicas log at info.",
        f"Eager deploys: {', '.join(_replicas(e['replicas']) for e in eagers)} at {RATE:g} "
        f"jobs/s for {scale.eager_seconds:g} s, each on a fresh database; "
        f"{_times(scale.deploys)}, a new process started and the oldest got SIGTERM "
        + ", ".join(f"{d:g}" for d in EAGER_SIGTERM_AFTER[: scale.deploys])
        + " s later, ready or not (new replicas were ready after "
        + "; ".join(
            ", ".join(f"{s['new_ready_s']:.2f} s" for s in e["steps"] if s["new_ready_s"])
            for e in eagers
        )
        + f"; {sum(s['sigterm_at'] < s['ready_at'] for e in eagers for s in e['steps'])} of "
        f"{sum(len(e['steps']) for e in eagers)} SIGTERMs came before the new replica was "
        f"ready). The app touched {TOUCH_RATIO:.0%} of the finished jobs {TOUCH_AT:g} grace after "
        "their finish ("
        + ", ".join(str(e["outcome"].play.touched) for e in eagers)
        + " jobs): a touch moves the deadline and sends no notification. Replicas log at info.",
        f"Killed for good: {scale.kill_replicas} replicas at {RATE:g} jobs/s for "
        f"{scale.kill_seconds:g} s, {kill['killed']} SIGKILLed {kill['killed_after_s']:.1f} s "
        f"after its start ({scale.kill_seconds / 3:g} s into the load) and never restarted; "
        f"probe interval {scale.probe:g} s ({probe_source}), so the bound is "
        f"{kill['bound_s']:g} s. {kill['late_over_half_s']} job(s) due after the kill were "
        "recorded more than 0.5 s late (the killed replica's share, until the others' next "
        "check). Record statements per finished job: "
        f"{kill['record_statements_per_job']:.3f} (pg_stat_statements: the timer's and the "
        "scan's claim-and-write statements). Replicas log at info.",
        f"Fleet: {scale.fleet_seconds:g} s at {scale.fleet_rate:g} jobs/s with "
        + ", then ".join(_replicas(n) for n in scale.fleet_counts)
        + ", each on a fresh database, the load started once every replica saw them all live. "
        "The trigger is installed as `reactor migrate` installs it (one channel: each replica "
        "hears every job until the doorbell rings, then polls the queue), in every scenario "
        "but the last row's, where it spreads the jobs over a channel per share (`reactor "
        f"migrate --spread`: each of the {large} replicas hears its shares' jobs, and nobody "
        "rings the doorbell). "
        "Record statements per finished job: "
        + ", ".join(f"{f['record_statements_per_job']:.3f} at {f['replicas']}" for f in fleets)
        + ". Replicas log at warning.",
        "CPU per 1,000 finished jobs, from the load's start until every run was written, read "
        "from /proc: all replicas together "
        + ", ".join(f"{c['replicas_s']:.3f} s at {n}" for n, c in cpu.items())
        + f" ({ratio(cpu_growth)} at {large} of {first}'s; goal {CPU_GROWTH:g}x), and "
        f"{spread_cpu['replicas_s']:.3f} s at {large} with the trigger spread "
        f"({ratio(safe_div(spread_cpu['replicas_s'], cpu[first]['replicas_s']))}); the server's "
        "processes "
        + ", ".join(f"{c['server_s']:.3f} s at {n}" for n, c in cpu.items())
        + "; the 1-minute load average at the end "
        + ", ".join(f"{c['load_1m']:.2f} at {n}" for n, c in cpu.items())
        + f" ({os.cpu_count()} CPUs; the worker, the tabs and this harness run beside them).",
        f"The worker fell behind its schedule by at most {behind}; a lagging worker offers less "
        "than the stated rate.",
        "Checked in every scenario: every finished job has exactly one run; the audit finds no "
        "lost, duplicate, clobbering, early or wrong write; every replica stopped with SIGTERM "
        "exited 0 within its drain and deleted its heartbeat; no replica logged an error. "
        + ("Problems: " + "; ".join(problems) + "." if problems else "No problem found."),
        ("Jobs late by seconds: " + "; ".join(anomalies) + ". " if anomalies else "") + logs_note,
    ]
    if ctx.quick:
        notes.insert(
            0,
            "--quick: toy scale, every scenario side by side on 2 cores, so the figures only "
            "show that the benchmark runs.",
        )
    headline = (
        f"deploys p99 {ms(deploy['all']['p99'])} (around a SIGTERM "
        f"{ms(deploy['around_sigterm']['p99'])}); after a kill at most "
        f"{kill['after_kill']['max']:.2f} s late (bound {kill['bound_s']:g} s)"
        + "; eager deploys max "
        + ", ".join(f"{e['all']['max']:.2f} s at {e['replicas']}" for e in eagers)
        + f"; {scale.fleet_rate:g}/s p99 "
        + ", ".join(f"{ms(f['lateness']['p99'])} at {f['replicas']}" for f in fleets)
        + f"; replicas' CPU per 1,000 jobs {ratio(cpu_growth)} at {large} of "
        f"{first}'s" + (f"; {len(problems)} problem(s)" if problems else "")
    )
    figures = {
        "deploy": {k: deploy[k] for k in ("all", "around_sigterm", "steps")},
        "eager": {
            str(e["replicas"]): {
                "all": e["all"],
                "steps": e["steps"],
                "touched": e["outcome"].play.touched,
            }
            for e in eagers
        },
        "kill": {
            k: kill[k]
            for k in (
                "after_kill",
                "bound_s",
                "killed_after_s",
                "late_over_half_s",
                "record_statements_per_job",
            )
        },
        "fleet": {
            str(f["replicas"]): {
                "lateness": f["lateness"],
                "record_statements_per_job": f["record_statements_per_job"],
                "cpu_per_1000_jobs": f["cpu_per_1000_jobs"],
            }
            for f in fleets
        },
        "spread": {
            "lateness": spread["lateness"],
            "record_statements_per_job": spread["record_statements_per_job"],
            "cpu_per_1000_jobs": spread_cpu,
        },
        "fleet_p99_ratio": growth,
        "fleet_cpu_ratio": cpu_growth,
        "verdicts": {n: s["outcome"].verdict.as_dict() for n, s in scenarios.items()},
        "worker_behind_s": {n: s["outcome"].play.behind_s for n, s in scenarios.items()},
        "problems": problems,
        "anomalies": anomalies,
        "logs": str(logs) if problems or anomalies else None,
    }
    return Result(
        met=met,
        headline=headline,
        table=table,
        figures=figures,
        settings=settings,
        conditions=cond,
        notes=notes,
    )


def _mark(value: float, goal: float) -> str:
    verdict = "met" if value <= goal else "missed"
    return f"p99 <= {ms(goal)}: {verdict}"


def _replicas(count: int) -> str:
    return f"{count} replica" + ("" if count == 1 else "s")


def _times(count: int) -> str:
    return {1: "once", 2: "twice", 3: "three times"}.get(count, f"{count} times")
