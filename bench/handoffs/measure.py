"""What a handoffs scenario measures: the replicas' and the server's CPU, and, from the
database once the load is done, each job's lateness and every broken invariant."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.conn import Conn, connect, dbname, scalar
from bench.handoffs.fleet import Fleet, log_lines
from bench.handoffs.scale import ANOMALY_S, GRACE_S
from bench.processes import cpu_by_process
from bench.server import Server
from bench.stats import safe_div
from bench.workload import Play, insert_jobs, wait_until_recorded
from reactor.install import REFERENCE_INSTALL
from reactor.testing import audit

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


async def setup(
    server: Server, label: str, jobs: int, *, spread: bool = False
) -> tuple[str, list[str]]:
    # ``spread``: the trigger notifies each share of the jobs on a channel of its own.
    dsn = await server.app_database(label, with_audit=True, spread=spread)
    async with await connect(dsn, "setup") as conn:
        ids = await insert_jobs(conn, jobs, doc_bytes=2000)
    return dsn, ids


async def read_outcome(
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
        missing = await wait_until_recorded(conn, within=GRACE_S + 30)
        if usage is not None:
            usage.stop()
        await fleet.close()
        verdict = await audit.verdict(conn, REFERENCE_INSTALL.mapping, GRACE_S)
        rows = await (await conn.execute(LATENESS, {"grace": GRACE_S})).fetchall()
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
        problems.append(f"{missing} job(s) still without a run {GRACE_S + 30:g} s after the load")
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


def anomalies_of(
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
        for entry in log_lines(replica.log):
            if entry.get("job_id") in worst and entry.get("message") == "recorded run":
                found.append(
                    f"job {entry['job_id']} ({worst[entry['job_id']]:.2f} s late) recorded by "
                    f"{replica.name} via {entry.get('source')} at {entry.get('time')}"
                )
    return found
