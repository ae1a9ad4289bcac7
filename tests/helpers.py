"""Playing the app in tests on the reference tables: the worker, the browser tab (both as
:mod:`tests.faults.tables` plays them, through :class:`reactor.testing.app.App`), and an audit of
every run write."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg.sql import SQL, Identifier

from reactor.install import mapping
from reactor.testing import audit
from tests.faults import tables

# Every write to analysis_runs, with who made it and when (by the database clock), so tests
# check dup / clobbered / early from the database itself.
AUDIT_SQL = audit.ddl(mapping.REFERENCE)

Conn = psycopg.Connection[Any]

ROOT = Path(__file__).resolve().parents[1]


def python_without_otel(
    *args: str, environ: Mapping[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` from the repository, with no OTEL_ variable but those of ``environ``:
    its output as text, whatever its exit code."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, *args],
        env={**env, **environ},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# The Settings an in-process reactor of a test starts from (its database, grace and the test's
# own fields go over them): no HTTP server, a LISTEN session proven every second, and a scan
# far enough away that what recovers within seconds did so by the listener, not by the scan.
IN_PROCESS_SETTINGS: dict[str, Any] = {
    "scan_interval": 30.0,
    "http_addr": None,
    "probe_interval": 1.0,
    "probe_timeout": 1.0,
}


@contextmanager
def python_child(code: str, ready: str) -> Iterator[subprocess.Popen[str]]:
    """``python -c CODE`` from the repository, its stdin and stdout piped to the test, while the
    block runs, from when it prints the line ``ready``; killed if it still runs after."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == f"{ready}\n"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        if not proc.stdin.closed:
            proc.stdin.close()


# public.stamp(text), immutable by its word only: it calls public.touch(), which takes the next
# value of public.ticks and writes a row to public.touched. The planner folds an immutable call
# with constant arguments, so planning an expression that calls it runs it; nextval is never
# rolled back, only a READ ONLY transaction refuses it.
IMMUTABLE_BY_ITS_WORD = (
    "CREATE SEQUENCE public.ticks; CREATE TABLE public.touched (at timestamptz);"
    " CREATE FUNCTION public.touch() RETURNS void LANGUAGE plpgsql AS"
    " $$ BEGIN PERFORM nextval('public.ticks'); INSERT INTO public.touched VALUES"
    " (now()); END $$;"
    " CREATE FUNCTION public.stamp(text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS"
    " $$ BEGIN PERFORM public.touch(); RETURN $1; END $$"
)


def reference_toml(jobs: str, runs: str, *, reactor_schema: str | None = None) -> str:
    """The reference tables' mapping file, with their tables named ``jobs`` and ``runs`` as a
    file may name them (qualified or not), and the reactor's schema if given."""
    head = "" if reactor_schema is None else f'reactor_schema = "{reactor_schema}"\n\n'
    return (
        f'{head}[jobs]\ntable = "{jobs}"\ndeleted_at = "deleted_at"\n'
        'not_null = ["doc_html", "results"]\nnot_empty = ["results"]\n\n'
        f'[runs]\ntable = "{runs}"\n'
    )


def scalar(conn: Conn, query: str, params: Any = None) -> Any:
    """The first column of the first row of ``query``."""
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def scalar_from(url: str, query: str, params: Any = None) -> Any:
    """:func:`scalar` on a connection of its own to ``url``, in autocommit: what the query
    writes is committed when it returns."""
    with psycopg.connect(url, autocommit=True) as conn:
        return scalar(conn, query, params)


def no_function_body_checks(url: str) -> None:
    """The database's owner turns the compile of function bodies off for every later session
    (ALTER DATABASE ... SET check_function_bodies = off), as a restore tool may."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            SQL("ALTER DATABASE {} SET check_function_bodies = off").format(
                Identifier(conn.info.dbname)
            )
        )


def drop_role(admin: Conn, name: str) -> None:
    """End the sessions of the role ``name``, then drop it with what it owns and was granted in
    ``admin``'s database (DROP OWNED revokes its privileges there too)."""
    admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
    )
    admin.execute(f'DROP OWNED BY "{name}"')
    admin.execute(f'DROP ROLE "{name}"')


def grant_audit(conn: Conn, role: str) -> None:
    """Let ``role`` write runs: the audit's trigger writes run_audit as whoever writes a run."""
    conn.execute(f'GRANT INSERT ON run_audit TO "{role}"')
    conn.execute(f'GRANT USAGE ON SEQUENCE run_audit_seq_seq TO "{role}"')


# The reference tables, and the app that writes them, which every test here plays.
TABLES = tables.REFERENCE
APP = TABLES.app
# What a job starts with, and what the worker finishes it with, unless a test says otherwise.
DOC_HTML = "<p>body</p>"
RESULTS = {"verdicts": [1, 2]}


def _verdicts(results: Any) -> str | None:
    return None if results is None else json.dumps(results)


def _failed(status: str) -> bool:
    """Whether the terminal ``status`` is the failed one (the reference's two: complete,
    failed)."""
    if status not in APP.mapping.jobs.terminal:
        raise ValueError(f"{status!r} is not a terminal status of the reference tables")
    return status == APP.status(failed=True)


def new_job(
    conn: Conn,
    *,
    status: str = "running",
    run_id: uuid.UUID | None = None,
    job_id: uuid.UUID | None = None,
    doc_html: str | None = DOC_HTML,
    results: Any = None,
    created_age: float = 0.0,
    age: float = 0.0,
) -> tuple[uuid.UUID, uuid.UUID]:
    """Insert a job in ``status`` (terminal or not), created ``created_age`` and last updated
    ``age`` seconds ago (a job can be past its grace without the test waiting for it); returns
    (job id, run id). ``results`` is stored as JSON unless it is None (NULL)."""
    finished = status in APP.mapping.jobs.terminal
    job, run = TABLES.add_job(
        conn,
        job=job_id,
        run=run_id,
        finished=finished,
        failed=finished and _failed(status),
        running=None if finished else status,
        doc=doc_html,
        results=_verdicts(results),
        created_age=created_age,
        updated_age=age,
    )
    assert isinstance(job, uuid.UUID)
    assert isinstance(run, uuid.UUID)
    return job, run


def finish(
    conn: Conn, job_id: uuid.UUID, *, status: str = "complete", results: Any = None, age: float = 0
) -> None:
    """The worker: mark a job terminal with its verdicts, ``age`` seconds ago."""
    verdicts = json.dumps(RESULTS if results is None else results)
    TABLES.finish(conn, job_id, failed=_failed(status), results=verdicts, age=age)


def reopen(conn: Conn, job_id: uuid.UUID, *, age: float = 0) -> None:
    """The worker takes a finished job up again (a retry): it is running, ``age`` seconds
    ago."""
    TABLES.reopen(conn, job_id, age=age)


def client_save(conn: Conn, job_id: uuid.UUID, *, legacy: bool = False) -> None:
    """The browser tab: the upsert that always wins (``legacy``: a row of the days before
    saved_by, NULL)."""
    TABLES.client_save(conn, job_id, legacy=legacy)


def run_row(conn: Conn, run_id: uuid.UUID) -> tuple[Any, ...] | None:
    """(job_id, saved_by) of a run, or None."""
    return TABLES.run_row(conn, run_id)


def worker_writes(conn: Conn) -> list[tuple[Any, ...]]:
    """Every worker write as (run_id, job_id, op)."""
    return conn.execute(
        "SELECT run_id, job_id, op FROM run_audit WHERE saved_by = 'worker' ORDER BY seq"
    ).fetchall()


def early_writes(conn: Conn, grace: float) -> int:
    """Worker writes that landed before their job's updated_at + grace: the updated_at the
    write was made from (a retried job finishes more than once)."""
    row = conn.execute(
        """
        SELECT count(*) FROM run_audit a JOIN analysis_jobs j ON j.id = a.job_id
         WHERE a.saved_by = 'worker'
           AND a.at < coalesce(a.job_updated_at, j.updated_at) + make_interval(secs => %s)
        """,
        (grace,),
    ).fetchone()
    assert row is not None
    return int(row[0])
