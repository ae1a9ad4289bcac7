"""A stranger on the channel, against the real `reactor run`: PostgreSQL has no privilege on
NOTIFY, so a role with no grants at all may send anything there. Garbage, forged membership and
made-up job hints cost the reactor a count and a few log lines, and a real job finished
meanwhile is recorded on time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import psycopg.conninfo

from tests.acceptance.conftest import reactor_env
from tests.conftest import NewRole
from tests.helpers import finish, new_job, run_row
from tests.integration.support import worker_lateness
from tests.polling import wait_for
from tests.ports import free_port, http_get

CHANNEL = "analysis_jobs_terminal"
GRACE = 1.0
GARBAGE = 20_000
FORGED_JOINS = 2_000
MADE_UP_HINTS = 50_000
# The bound for 20,000 garbage payloads and 45 s of forged joins together; one line
# each, as before, was 4.4 MB for the garbage alone.
LOG_BOUND = 100 * 1024
# On time: recorded within this of its deadline, flood or not (a loaded machine's share).
ON_TIME = 1.0


def ready(port: int) -> bool:
    try:
        return http_get(port, "/readyz")[0] == 200
    except OSError:  # not serving yet
        return False


def counted(port: int, result: str) -> float:
    _, body = http_get(port, "/metrics")
    prefix = f'reactor_notifications_total{{result="{result}"}} '
    return sum(float(line[len(prefix) :]) for line in body.splitlines() if line.startswith(prefix))


def test_a_stranger_on_the_channel_costs_a_few_lines_and_no_lateness(
    database_url: str, new_login_role: NewRole, tmp_path: Path
) -> None:
    stranger = new_login_role("stranger")
    port = free_port()
    env = reactor_env(
        database_url, REACTOR_GRACE_SECONDS=str(GRACE), REACTOR_HTTP_ADDR=f"127.0.0.1:{port}"
    )
    log_path = tmp_path / "reactor.log"
    with log_path.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reactor", "run"], env=env, stdout=log, stderr=log
        )
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            wait_for(lambda: proc.poll() is not None or ready(port), what="ready")
            assert proc.poll() is None, log_path.read_text(encoding="utf-8")
            before = log_path.stat().st_size
            as_stranger = psycopg.conninfo.make_conninfo(database_url, user=stranger)
            with psycopg.connect(as_stranger, autocommit=True) as rogue:
                job_id, run_id = new_job(conn)
                finish(conn, job_id)
                rogue.execute(
                    "SELECT count(pg_notify(%s, 'garbage-' || g)) FROM generate_series(1, %s) g",
                    (CHANNEL, GARBAGE),
                )
                for n in range(FORGED_JOINS):
                    rogue.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"joined:fake-{n}"))
                rogue.execute(
                    "SELECT count(pg_notify(%s, gen_random_uuid()::text || '@' ||"
                    " extract(epoch FROM now())::text)) FROM generate_series(1, %s)",
                    (CHANNEL, MADE_UP_HINTS),
                )
            assert wait_for(lambda: run_row(conn, run_id), what="the real job") == (
                job_id,
                "worker",
            )
            wait_for(
                lambda: (
                    counted(port, "rejected") == GARBAGE
                    and counted(port, "unverified") + counted(port, "dropped")
                    >= FORGED_JOINS + MADE_UP_HINTS
                ),
                timeout=60,
                what="every notification counted",
            )
            [lateness] = worker_lateness(conn, GRACE)
            assert lateness < ON_TIME
            # Nothing was armed by the made-up hints: the heap holds no deadline.
            _, metrics = http_get(port, "/metrics")
            assert "reactor_deadlines_pending 0.0" in metrics
        said = log_path.read_text(encoding="utf-8")[before:]
        assert len(said.encode()) < LOG_BOUND, said[-2000:]
        # Membership comes from the heartbeats: the forged joins changed nothing.
        assert '"replicas changed"' not in said
    finally:
        proc.terminate()
        assert proc.wait(30) == 0, log_path.read_text(encoding="utf-8")[-4000:]
