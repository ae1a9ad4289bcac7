"""The app's updates of a job stay HOT with the reactor installed, its progress and its finish,
and the reactor's statements still find their index.

PostgreSQL updates a row in place (a heap-only tuple: no new index entries) only when no column
that an index names changes, the columns of a partial index's predicate included. A worker's
progress updates change results and updated_at while the job keeps status 'running', and its
finish changes status and updated_at; no index of the migrated schema may name any of them.

Counted from the server's own statistics: ``pg_stat_force_next_flush()`` (PostgreSQL 15+) makes
the session flush its counters when it next goes idle, so the following statement reads every
update of the earlier ones in ``pg_stat_user_tables``, with no timing involved.

HOT also needs room for the new version on the row's page. The test does not set a fillfactor:
the reference table is the app's own, created as reference.sql creates it. It inserts a few
jobs, whose 32 KiB documents are TOASTed out of line, so their rows are a few hundred bytes
each and share one 8 kB page with most of it free; each update commits on its own, so the
versions it leaves behind are dead and page pruning reclaims them. Room is then never what
decides, and the only thing the counts measure is whether an index blocks HOT.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from reactor import db
from reactor.install import REFERENCE_INSTALL
from reactor.install.mapping import REFERENCE
from tests.helpers import Conn
from tests.integration.support import scalar, update_counts

JOBS = 12
PROGRESS_UPDATES = 3  # per job

# The walk index as migration 0008 built it: its predicate names results.
OLD_WALK_INDEX = """
CREATE INDEX analysis_jobs_old_walk_idx ON analysis_jobs (run_id, id)
 WHERE status IN ('complete', 'failed') AND deleted_at IS NULL AND doc_html IS NOT NULL
   AND results IS NOT NULL AND results <> '{}'::jsonb
"""

# The walk index as migration 0015 built it: its predicate names status.
FINISHED_WALK_INDEX = """
CREATE INDEX analysis_jobs_reactor_finished_idx ON analysis_jobs (run_id, id)
 WHERE status IN ('complete', 'failed') AND deleted_at IS NULL AND doc_html IS NOT NULL
"""

# 32 KiB of text that pglz cannot shrink below the TOAST threshold: stored out of line.
DOCUMENT = "SELECT left(string_agg(md5(g::text || %s), ''), 32768) FROM generate_series(1, 1100) g"


@pytest.fixture
def conn(database_url: str) -> Iterator[Conn]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


def _update_counts(conn: Conn) -> tuple[int, int]:
    """(n_tup_upd, n_tup_hot_upd) of analysis_jobs, with this session's updates flushed."""
    return update_counts(conn, "analysis_jobs")


def _start_jobs(conn: Conn) -> list[uuid.UUID]:
    """Jobs as the worker inserts them: running, with their document, no results yet."""
    ids = []
    for _ in range(JOBS):
        job_id = uuid.uuid4()
        conn.execute(
            f"INSERT INTO analysis_jobs (id, run_id, status, doc_html) "
            f"VALUES (%s, %s, 'running', ({DOCUMENT}))",
            (job_id, uuid.uuid4(), str(job_id)),
        )
        ids.append(job_id)
    return ids


def _progress(conn: Conn, ids: list[uuid.UUID]) -> tuple[int, int]:
    """The worker's progress updates, each committed on its own; (updates, of them HOT)."""
    before = _update_counts(conn)
    for step in range(PROGRESS_UPDATES):
        for job_id in ids:
            # Workers commonly restate the status; an unchanged value does not block HOT.
            conn.execute(
                "UPDATE analysis_jobs SET status = 'running', updated_at = now(), "
                "results = coalesce(results, '{}'::jsonb) || %s::jsonb WHERE id = %s",
                (json.dumps({f"verdict_{step}": step}), job_id),
            )
    after = _update_counts(conn)
    return after[0] - before[0], after[1] - before[1]


def _finish(conn: Conn, ids: list[uuid.UUID]) -> tuple[int, int]:
    """The worker's finishing updates, each committed on its own; (updates, of them HOT)."""
    before = _update_counts(conn)
    for job_id in ids:
        conn.execute(
            "UPDATE analysis_jobs SET status = 'complete', updated_at = now() WHERE id = %s",
            (job_id,),
        )
    after = _update_counts(conn)
    return after[0] - before[0], after[1] - before[1]


def _one_page(conn: Conn) -> bool:
    """Every job row sits on one heap page: the documents went to the TOAST table."""
    return bool(scalar(conn, "SELECT pg_relation_size('analysis_jobs') = 8192"))


def test_progress_updates_are_hot(conn: Conn) -> None:
    ids = _start_jobs(conn)
    assert _one_page(conn)
    updates, hot = _progress(conn, ids)
    assert updates == JOBS * PROGRESS_UPDATES
    assert hot == updates
    # The finishing update changes status, which no index names: HOT too, and queued.
    assert _finish(conn, ids) == (JOBS, JOBS)
    assert scalar(conn, "SELECT count(*) FROM reactor.pending WHERE job_id = ANY(%s)", (ids,)) == (
        JOBS
    )


def test_an_index_naming_status_makes_the_finish_cold(conn: Conn) -> None:
    # The walk index of migration 0015 back: its predicate names status, so each finish writes
    # index entries. Proof that the count above sees what an index does to the finish.
    conn.execute(FINISHED_WALK_INDEX)
    ids = _start_jobs(conn)
    _progress(conn, ids)
    assert _finish(conn, ids) == (JOBS, 0)


def test_an_index_naming_results_makes_them_cold(conn: Conn) -> None:
    # The same workload with the walk index of migration 0008 back: proof that the counts above
    # see what an index does to HOT, not something the workload happens to do.
    conn.execute(OLD_WALK_INDEX)
    updates, hot = _progress(conn, _start_jobs(conn))
    assert updates == JOBS * PROGRESS_UPDATES
    assert hot == 0


def test_no_reactor_index_on_the_job_table_names_a_progress_column(conn: Conn) -> None:
    # Every index on analysis_jobs but the app's primary key is the reactor's; none may name
    # results, status or updated_at, in its key or in its predicate.
    rows = conn.execute(
        "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid), "
        "       coalesce(pg_get_expr(indpred, indrelid), '') "
        "  FROM pg_index WHERE indrelid = 'analysis_jobs'::regclass AND NOT indisprimary"
    ).fetchall()
    assert [name for name, _, _ in rows] == ["analysis_jobs_reactor_run_idx"]
    for _, definition, predicate in rows:
        for column in ("results", "status", "updated_at"):
            assert column not in definition, definition
            assert column not in predicate, predicate


def _plan(conn: Conn, query: str, params: Any) -> str:
    rows = conn.execute(f"EXPLAIN {query}", params).fetchall()
    return "\n".join(row[0] for row in rows)


def test_the_walk_and_the_run_to_jobs_road_use_the_index(conn: Conn) -> None:
    # Many finished jobs, and many more that are running: a sequential scan would read them all.
    conn.execute(
        "INSERT INTO analysis_jobs (id, run_id, status, doc_html, results) "
        "SELECT gen_random_uuid(), gen_random_uuid(), "
        "       CASE WHEN g % 10 = 0 THEN 'complete' ELSE 'running' END, '<p>x</p>', "
        "       '{\"v\": 1}' FROM generate_series(1, 50000) g"
    )
    conn.execute("VACUUM ANALYZE analysis_jobs")
    params = {
        "owner": "test",
        "interval": 60.0,
        "grace": 0.0,
        "force": True,
        "limit": 1000,
        "lease": 30.0,
    }
    walk = _plan(conn, REFERENCE_INSTALL.query("reconcile_step"), params)
    assert "Index Only Scan using analysis_jobs_reactor_run_idx" in walk, walk
    # reactor.queue_runs_v2's statement: the jobs of some runs, eligible in the row.
    runs = [row[0] for row in conn.execute("SELECT run_id FROM analysis_jobs LIMIT 5")]
    road = _plan(
        conn,
        "SELECT j.id FROM analysis_jobs j WHERE j.run_id = ANY(%s) "
        "AND j.status IN ('complete', 'failed') AND j.deleted_at IS NULL "
        "AND j.doc_html IS NOT NULL AND j.results IS NOT NULL AND j.results <> '{}'::jsonb",
        (runs,),
    )
    assert "analysis_jobs_reactor_run_idx" in road, road
    assert "results" in road, road  # checked in the row, as a filter
    assert "status" in road, road


@pytest.mark.anyio
async def test_an_upgrade_replaces_the_old_walk_index(database_url: str, conn: Conn) -> None:
    # A database migrated by an earlier release: version 14, with 0008's walk index built.
    conn.execute("DROP INDEX analysis_jobs_reactor_run_idx")
    conn.execute(
        OLD_WALK_INDEX.replace("analysis_jobs_old_walk_idx", "analysis_jobs_reactor_walk_idx")
    )
    conn.execute("DELETE FROM reactor.schema_version WHERE version >= 15")
    async with await db.connect(database_url, "test") as aconn:
        assert (await db.migrate(aconn, REFERENCE)).applied[:2] == [15, 16]
    assert _reactor_indexes(conn) == ["analysis_jobs_reactor_run_idx"]


@pytest.mark.anyio
async def test_an_upgrade_replaces_the_finished_index(database_url: str, conn: Conn) -> None:
    # A database migrated by the release before this one: version 15, with its walk index.
    conn.execute("DROP INDEX analysis_jobs_reactor_run_idx")
    conn.execute(FINISHED_WALK_INDEX)
    conn.execute("DELETE FROM reactor.schema_version WHERE version >= 16")
    async with await db.connect(database_url, "test") as aconn:
        assert (await db.migrate(aconn, REFERENCE)).applied[:1] == [16]
    assert _reactor_indexes(conn) == ["analysis_jobs_reactor_run_idx"]


def _reactor_indexes(conn: Conn) -> list[str]:
    return [
        row[0]
        for row in conn.execute(
            "SELECT indexrelid::regclass::text FROM pg_index "
            "WHERE indrelid = 'analysis_jobs'::regclass AND NOT indisprimary AND indisvalid"
        )
    ]
