"""What a stranger on the channel costs `reactor run`: log bytes for 20,000 garbage payloads and
for 45 s of forged `joined:`, and RSS before and after 200,000 made-up job hints, each sent by a
role with no grants, while real jobs finish; on an embedded PostgreSQL.

    uv run python -m bench.channel [--joined-seconds 45]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

import psycopg
import psycopg.conninfo

from bench.workload import APP
from reactor.demo import EmbeddedPostgres

CHANNEL = "analysis_jobs_terminal"
GRACE_S = 1.0


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def metric(port: int, name: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


def real_job_lateness(conn: psycopg.Connection[tuple[object, ...]]) -> float:
    """Finish one job and wait for its run: seconds from updated_at + grace to its run."""
    job, run = uuid.uuid4(), uuid.uuid4()
    conn.execute(*APP.create([run], jobs=[job], document="x"))
    conn.execute(*APP.finish(job, verdicts='{"a": 1}'))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT extract(epoch FROM r.created_at - j.updated_at)::float8 - %s "
            "FROM analysis_runs r JOIN analysis_jobs j ON j.run_id = r.id WHERE j.id = %s",
            (GRACE_S, job),
        ).fetchone()
        if row is not None:
            return float(row[0])  # type: ignore[arg-type]
        time.sleep(0.05)
    raise RuntimeError("the real job was never recorded")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--joined-seconds", type=float, default=45.0)
    args = parser.parse_args()
    with EmbeddedPostgres(trust_localhost=True) as pg:
        admin = pg.dsn
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE ROLE stranger LOGIN")
        stranger = psycopg.conninfo.make_conninfo(admin, user="stranger")
        env = {
            **os.environ,
            "DATABASE_URL": admin,
            "REACTOR_GRACE_SECONDS": str(GRACE_S),
            "REACTOR_HTTP_ADDR": "127.0.0.1:19387",
            "REACTOR_DASHBOARD_ADDR": "",
        }
        subprocess.run(
            [sys.executable, "-m", "reactor", "migrate", "--reference-schema"], env=env, check=True
        )
        with (
            tempfile.NamedTemporaryFile("w+b", suffix=".log") as log,
            psycopg.connect(admin, autocommit=True) as conn,
        ):
            proc = subprocess.Popen(
                [sys.executable, "-m", "reactor", "run"], env=env, stderr=log, stdout=log
            )
            try:
                time.sleep(5)  # started, LISTEN proven, first heartbeat
                print(f"real job before: {real_job_lateness(conn):+.3f} s after its deadline")
                _abuse(stranger, conn, log.name, proc.pid, args.joined_seconds)
            finally:
                proc.terminate()
                proc.wait(30)


def _abuse(
    stranger: str,
    conn: psycopg.Connection[tuple[object, ...]],
    log_name: str,
    pid: int,
    joined_seconds: float,
) -> None:
    """As another role (``stranger``): garbage payloads, forged joined: messages, then made-up
    hints; how much the reactor (process ``pid``) logged and held, and the real job's
    lateness, after each."""

    def log_bytes() -> int:
        return os.path.getsize(log_name)

    with psycopg.connect(stranger, autocommit=True) as s:
        start = log_bytes()
        s.execute(
            "SELECT count(pg_notify(%s, 'garbage-' || g)) FROM generate_series(1, 20000) g",
            (CHANNEL,),
        )
        lateness = real_job_lateness(conn)
        time.sleep(11)  # the count's line comes at the next interval
        rejected = metric(19387, 'reactor_notifications_total{result="rejected"}')
        print(
            f"20,000 garbage payloads: {log_bytes() - start} bytes of log; "
            f"rejected={rejected:.0f}; real job {lateness:+.3f} s"
        )

        start, sent, until = log_bytes(), 0, time.monotonic() + joined_seconds
        while time.monotonic() < until:
            s.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"joined:fake-{sent}"))
            sent += 1
        lateness = real_job_lateness(conn)
        print(
            f"{joined_seconds:.0f} s of forged joined: ({sent} sent): "
            f"{log_bytes() - start} bytes of log; real job {lateness:+.3f} s"
        )

        before = rss_kb(pid)
        s.execute(
            "SELECT count(pg_notify(%s, gen_random_uuid()::text || '@' || "
            "extract(epoch FROM now())::text)) FROM generate_series(1, 200000)",
            (CHANNEL,),
        )
        lateness = real_job_lateness(conn)
        name = "reactor_notifications_total"
        while (
            metric(19387, name + '{result="unverified"}')
            + metric(19387, name + '{result="dropped"}')
            < 200_000
        ):
            time.sleep(0.2)
        after = rss_kb(pid)
        pending = metric(19387, "reactor_deadlines_pending")
        print(
            f"200,000 made-up hints: RSS {before / 1024:.1f} -> {after / 1024:.1f} MB "
            f"({(after - before) / 1024:+.1f}); deadlines pending {pending:.0f}; "
            f"real job {lateness:+.3f} s"
        )


if __name__ == "__main__":
    main()
