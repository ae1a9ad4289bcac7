"""What the job trigger does with each kind of update of a job, on the reference tables.

The trigger's WHEN lets through every update of a terminal row and nothing else, and its
function decides: queue the job when it becomes eligible, notify on the transition into a
terminal status and when it becomes eligible, and neither for any other update of a terminal
job. Each case is one committed statement, read back from ``reactor.pending`` and the
notifications this session received; the queue is emptied between cases, as a fired timer does.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from tests.helpers import Conn, scalar

CHANNEL = "analysis_jobs_terminal"
ELIGIBLE = "status = 'complete', results = '{\"verdicts\": 1}'"

# (the job's row before, the update, queued afterwards, notified afterwards)
CASES = {
    "progress of a running job": ("running", "results = '{\"verdicts\": 1}'", False, False),
    "finished with its results": ("running", ELIGIBLE, True, True),
    "finished without results": ("running", "status = 'complete'", False, True),
    "its results arrive after the finish": (
        "complete",
        "results = '{\"verdicts\": 1}'",
        True,
        True,
    ),
    "an eligible job touched": ("eligible", "updated_at = now()", False, False),
    "a terminal job still without results touched": (
        "complete",
        "updated_at = now()",
        False,
        False,
    ),
    # A later finish: its run, if the reactor wrote it, holds the earlier one.
    "an eligible job failed after all": ("eligible", "status = 'failed'", True, True),
    "an eligible job deleted softly": ("eligible", "deleted_at = now()", False, False),
}

BEFORE = {
    "running": "'running', NULL",
    "complete": "'complete', NULL",
    "eligible": "'complete', '{\"verdicts\": 1}'",
}


@pytest.fixture
def conn(database_url: str) -> Iterator[Conn]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        yield conn


def _notified(conn: Conn) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=0, stop_after=None)]


@pytest.mark.parametrize("case", CASES)
def test_the_trigger_queues_and_notifies_only_what_needs_it(conn: Conn, case: str) -> None:
    before, change, queued, notified = CASES[case]
    job = uuid.uuid4()
    conn.execute(
        "INSERT INTO analysis_jobs (id, run_id, status, results, doc_html) "
        f"VALUES (%s, %s, {BEFORE[before]}, '<p>doc</p>')",
        (job, uuid.uuid4()),
    )
    conn.execute("DELETE FROM reactor.pending")
    _notified(conn)

    conn.execute(f"UPDATE analysis_jobs SET {change} WHERE id = %s", (job,))

    assert scalar(conn, "SELECT count(*) FROM reactor.pending WHERE job_id = %s", (job,)) == int(
        queued
    )
    assert [payload.split("@")[0] for payload in _notified(conn)] == (
        [str(job)] if notified else []
    )


def test_an_update_of_a_running_job_never_calls_the_function(conn: Conn) -> None:
    # Counted in the transaction itself (pg_stat_get_xact_function_calls), with function
    # tracking on for it alone.
    job = uuid.uuid4()
    conn.execute(
        "INSERT INTO analysis_jobs (id, run_id, status, doc_html) VALUES (%s, %s, 'running', 'd')",
        (job, uuid.uuid4()),
    )
    calls = "SELECT coalesce(pg_stat_get_xact_function_calls('reactor.job_changed_v1'::regproc), 0)"
    with conn.transaction():
        conn.execute("SET LOCAL track_functions = 'pl'")
        conn.execute("UPDATE analysis_jobs SET results = '{}' WHERE id = %s", (job,))
        assert scalar(conn, calls) == 0
        conn.execute(f"UPDATE analysis_jobs SET {ELIGIBLE} WHERE id = %s", (job,))
        assert scalar(conn, calls) >= 1


# (the doorbell's row: its channel and how long it is still awake; whether the finish notifies)
BELLS: dict[str, tuple[tuple[str, str] | None, bool]] = {
    "no row": (None, True),
    "awake on this channel": ((CHANNEL, "1 minute"), False),
    "fallen silent": ((CHANNEL, "-1 second"), True),
    "awake on another channel": (("analysis_jobs_elsewhere", "1 minute"), True),
}


@pytest.mark.parametrize("bell", BELLS)
def test_the_doorbell_silences_the_notification_and_never_the_queue(conn: Conn, bell: str) -> None:
    row, notified = BELLS[bell]
    if row is not None:
        channel, awake_for = row
        conn.execute(
            "INSERT INTO reactor.doorbell VALUES (%s, now() + %s::interval)", (channel, awake_for)
        )
    job = uuid.uuid4()
    conn.execute(
        "INSERT INTO analysis_jobs (id, run_id, status, doc_html) VALUES (%s, %s, 'running', 'd')",
        (job, uuid.uuid4()),
    )

    conn.execute(f"UPDATE analysis_jobs SET {ELIGIBLE} WHERE id = %s", (job,))

    assert scalar(conn, "SELECT count(*) FROM reactor.pending WHERE job_id = %s", (job,)) == 1
    assert [payload.split("@")[0] for payload in _notified(conn)] == (
        [str(job)] if notified else []
    )
