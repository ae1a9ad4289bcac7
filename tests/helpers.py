"""Playing the app in tests: the worker, the browser tab, and an audit of every run write."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg

from reactor import audit, mapping

# Every write to analysis_runs, with who made it and when (by the database clock), so tests
# check dup / clobbered / early from the database itself.
AUDIT_SQL = audit.ddl(mapping.REFERENCE)

Conn = psycopg.Connection[Any]


def grant_audit(conn: Conn, role: str) -> None:
    """Let ``role`` write runs: the audit's trigger writes run_audit as whoever writes a run."""
    conn.execute(f'GRANT INSERT ON run_audit TO "{role}"')
    conn.execute(f'GRANT USAGE ON SEQUENCE run_audit_seq_seq TO "{role}"')


def new_job(
    conn: Conn,
    *,
    status: str = "running",
    run_id: uuid.UUID | None = None,
    doc_html: str | None = "<p>body</p>",
    results: Any = None,
) -> tuple[uuid.UUID, uuid.UUID]:
    """Insert a job; returns (job id, run id)."""
    job_id = uuid.uuid4()
    run_id = run_id or uuid.uuid4()
    conn.execute(
        "INSERT INTO analysis_jobs (id, run_id, status, doc_html, results) "
        "VALUES (%s, %s, %s, %s, %s)",
        (job_id, run_id, status, doc_html, None if results is None else json.dumps(results)),
    )
    return job_id, run_id


def finish(conn: Conn, job_id: uuid.UUID, *, status: str = "complete", results: Any = None) -> None:
    """The worker: mark a job terminal with its verdicts."""
    conn.execute(
        "UPDATE analysis_jobs SET status = %s, results = %s, updated_at = now() WHERE id = %s",
        (status, json.dumps(results if results is not None else {"verdicts": [1, 2]}), job_id),
    )


def client_save(conn: Conn, job_id: uuid.UUID) -> None:
    """The browser tab: the upsert that always wins."""
    conn.execute(
        """
        INSERT INTO analysis_runs (id, job_id, doc_html, results, saved_by)
        SELECT run_id, id, doc_html, results, 'client' FROM analysis_jobs WHERE id = %s
        ON CONFLICT (id) DO UPDATE SET job_id = EXCLUDED.job_id, doc_html = EXCLUDED.doc_html,
            results = EXCLUDED.results, saved_by = 'client', updated_at = now()
        """,
        (job_id,),
    )


def run_row(conn: Conn, run_id: uuid.UUID) -> tuple[Any, ...] | None:
    """(job_id, saved_by) of a run, or None."""
    return conn.execute(
        "SELECT job_id, saved_by FROM analysis_runs WHERE id = %s", (run_id,)
    ).fetchone()


def worker_writes(conn: Conn) -> list[tuple[Any, ...]]:
    """Every worker write as (run_id, job_id, op)."""
    return conn.execute(
        "SELECT run_id, job_id, op FROM run_audit WHERE saved_by = 'worker' ORDER BY seq"
    ).fetchall()


def early_writes(conn: Conn, grace: float) -> int:
    """Worker writes that landed before their job's updated_at + grace."""
    row = conn.execute(
        """
        SELECT count(*) FROM run_audit a JOIN analysis_jobs j ON j.id = a.job_id
         WHERE a.saved_by = 'worker' AND a.at < j.updated_at + make_interval(secs => %s)
        """,
        (grace,),
    ).fetchone()
    assert row is not None
    return int(row[0])
