"""A range-partitioned analysis_jobs: migrate builds the walk index online, the triggers on the
parent fire for every partition (one created later too), and the reactor records the jobs of
each partition.

The table is the reference one partitioned by range on created_at. Its primary key must then
include created_at: (id, created_at). Nothing in the reactor needs a unique index on id alone:
it looks jobs up by id (the key's leading column, in each partition's index) and keys its own
queue, reactor.pending, by job id; the app keeps ids unique, as uuids are.

Run on PostgreSQL 15 as well: REACTOR_TEST_PG_BIN=/usr/lib/postgresql/15/bin.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from reactor import db
from reactor.install import REFERENCE_INSTALL, sql
from reactor.install.mapping import REFERENCE
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.helpers import AUDIT_SQL, Conn
from tests.integration.support import scalar
from tests.integration.test_schema import JOB_COLUMNS

pytestmark = pytest.mark.anyio

CHANNEL = "analysis_jobs_terminal"
INDEX = "analysis_jobs_reactor_run_idx"

# reference.sql's analysis_jobs, partitioned by quarter; the last quarter is itself partitioned
# (by hash of id), and a default partition takes the rest.
PARTITIONED_JOBS = f"""
CREATE TABLE analysis_jobs (
    id          uuid NOT NULL,{JOB_COLUMNS},
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
CREATE TABLE analysis_jobs_2026q1 PARTITION OF analysis_jobs
    FOR VALUES FROM ('2026-01-01') TO ('2026-04-01');
CREATE TABLE analysis_jobs_2026q2 PARTITION OF analysis_jobs
    FOR VALUES FROM ('2026-04-01') TO ('2026-07-01');
CREATE TABLE analysis_jobs_2026q3 PARTITION OF analysis_jobs
    FOR VALUES FROM ('2026-07-01') TO ('2026-10-01');
CREATE TABLE analysis_jobs_2026q4 PARTITION OF analysis_jobs
    FOR VALUES FROM ('2026-10-01') TO ('2027-01-01') PARTITION BY HASH (id);
CREATE TABLE analysis_jobs_2026q4_h0 PARTITION OF analysis_jobs_2026q4
    FOR VALUES WITH (MODULUS 2, REMAINDER 0);
CREATE TABLE analysis_jobs_2026q4_h1 PARTITION OF analysis_jobs_2026q4
    FOR VALUES WITH (MODULUS 2, REMAINDER 1);
CREATE TABLE analysis_jobs_rest PARTITION OF analysis_jobs DEFAULT;
"""

PLAIN_RUNS = sql.read("reference.sql").split("CREATE TABLE IF NOT EXISTS analysis_runs")[1]

# A date in each leaf partition; the fourth quarter's two leaves split by the hash of id.
DATES = ["2026-02-01", "2026-05-01", "2026-08-01", "2026-11-01", "2026-12-01", "2031-01-01"]
HASHED = {"2026-11-01": 0, "2026-12-01": 1}  # date -> the remainder its job's id must have


def _app_tables(dsn: str, *, partitioned_runs: bool = False) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(PARTITIONED_JOBS)
        if partitioned_runs:
            conn.execute(
                "CREATE TABLE analysis_runs (id uuid NOT NULL, job_id uuid NOT NULL, "
                "doc_html text, results jsonb NOT NULL, saved_by text, "
                "created_at timestamptz NOT NULL DEFAULT now(), "
                "updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (id, created_at)) "
                "PARTITION BY RANGE (created_at)"
            )
        else:
            conn.execute("CREATE TABLE IF NOT EXISTS analysis_runs" + PLAIN_RUNS)
        conn.execute(AUDIT_SQL)


async def _migrate(dsn: str) -> list[int]:
    async with await db.connect(dsn, "test") as conn:
        return (await db.migrate(conn, REFERENCE, channel=CHANNEL)).applied


@pytest.fixture
async def dsn(empty_database_url: str) -> str:
    _app_tables(empty_database_url)
    assert await _migrate(empty_database_url) == [m.version for m in sql.migrations()]
    return empty_database_url


@pytest.fixture
def conn(dsn: str) -> Iterator[Conn]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


def _leaves(conn: Conn) -> list[str]:
    return [
        row[0]
        for row in conn.execute(
            "SELECT relid::text FROM pg_partition_tree('analysis_jobs') WHERE isleaf ORDER BY 1"
        )
    ]


def _walk_index_of(conn: Conn, table: str) -> Any:
    """(index name, valid) of the walk index's partition on ``table``, or None."""
    return conn.execute(
        "SELECT x.indexrelid::regclass::text, x.indisvalid"
        "  FROM pg_partition_tree(%s::regclass) t JOIN pg_index x ON x.indexrelid = t.relid"
        " WHERE x.indrelid = %s::regclass",
        (INDEX, table),
    ).fetchone()


def _job(conn: Conn, created_at: str, *, status: str = "running") -> tuple[uuid.UUID, uuid.UUID]:
    job_id, run_id = uuid.uuid4(), uuid.uuid4()
    if created_at in HASHED:
        # An id that lands in the wanted hash partition.
        while not scalar(
            conn,
            "SELECT satisfies_hash_partition('analysis_jobs_2026q4'::regclass, 2, %s, %s::uuid)",
            (HASHED[created_at], job_id),
        ):
            job_id = uuid.uuid4()
    conn.execute(
        "INSERT INTO analysis_jobs (id, run_id, status, doc_html, created_at, updated_at) "
        "VALUES (%s, %s, %s, '<p>body</p>', %s, now())",
        (job_id, run_id, status, created_at),
    )
    return job_id, run_id


def _finish(conn: Conn, job_id: uuid.UUID) -> None:
    conn.execute(
        "UPDATE analysis_jobs SET status = 'complete', results = %s, updated_at = now() "
        "WHERE id = %s",
        (json.dumps({"verdicts": [1]}), job_id),
    )


def _queued(conn: Conn, job_ids: list[uuid.UUID]) -> int:
    return int(
        scalar(conn, "SELECT count(*) FROM reactor.pending WHERE job_id = ANY(%s)", (job_ids,))
    )


def _recorded(conn: Conn, job_ids: list[uuid.UUID]) -> int:
    return int(
        scalar(
            conn,
            "SELECT count(*) FROM analysis_runs r JOIN analysis_jobs j ON j.run_id = r.id "
            "WHERE j.id = ANY(%s) AND r.job_id = j.id AND r.saved_by = 'worker'",
            (job_ids,),
        )
    )


def _sweep(dsn: str) -> int:
    done = run_reactor("sweep", "--once", env=reactor_env(dsn, REACTOR_GRACE_SECONDS="0"))
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


async def test_migrate_builds_the_walk_index_on_every_partition(dsn: str, conn: Conn) -> None:
    parent = conn.execute(
        "SELECT c.relkind::text, x.indisvalid FROM pg_class c JOIN pg_index x "
        "ON x.indexrelid = c.oid WHERE c.oid = %s::regclass",
        (INDEX,),
    ).fetchone()
    assert parent == ("I", True)
    assert len(_leaves(conn)) == len(DATES)
    for leaf in _leaves(conn):
        found = _walk_index_of(conn, leaf)
        assert found is not None, leaf
        assert found[1], found
    # The sub-partitioned quarter has its own partitioned index, attached in between.
    assert _walk_index_of(conn, "analysis_jobs_2026q4") is not None
    assert scalar(conn, "SELECT to_regclass('analysis_jobs_reactor_walk_idx') IS NULL")
    # Idempotent: a second migrate finds nothing to build.
    assert await _migrate(dsn) == []
    count = scalar(conn, "SELECT count(*) FROM pg_partition_tree(%s::regclass)", (INDEX,))
    assert count == 1 + len(_leaves(conn)) + 1


async def test_an_interrupted_build_resumes(empty_database_url: str) -> None:
    # A migrate cut short after the parent's index and one partition's: the next one attaches
    # the rest and the parent's index turns valid.
    _app_tables(empty_database_url)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(
            f"CREATE INDEX {INDEX} ON ONLY analysis_jobs (run_id, id) "
            "WHERE deleted_at IS NULL AND doc_html IS NOT NULL"
        )
        conn.execute(
            "CREATE INDEX analysis_jobs_2026q1_reactor_run_idx ON analysis_jobs_2026q1 "
            "(run_id, id) WHERE deleted_at IS NULL AND doc_html IS NOT NULL"
        )
        conn.execute(f"ALTER INDEX {INDEX} ATTACH PARTITION analysis_jobs_2026q1_reactor_run_idx")
        assert not scalar(
            conn, "SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass", (INDEX,)
        )
    await _migrate(empty_database_url)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        assert scalar(
            conn, "SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass", (INDEX,)
        )


async def test_jobs_finishing_in_every_partition_are_recorded(dsn: str, conn: Conn) -> None:
    jobs = [_job(conn, created_at)[0] for created_at in DATES]
    partitions = {
        scalar(conn, "SELECT tableoid::regclass::text FROM analysis_jobs WHERE id = %s", (job,))
        for job in jobs
    }
    assert len(partitions) == len(DATES)
    for job in jobs:
        _finish(conn, job)
    # The row triggers on the parent fired in each partition.
    assert _queued(conn, jobs) == len(jobs)
    # And jobs finished around the triggers (a restore) are found by the reconcile's walk.
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        bypassed = [_job(conn, created_at, status="running")[0] for created_at in DATES]
        for job in bypassed:
            _finish(conn, job)
    assert _queued(conn, bypassed) == 0
    assert _sweep(dsn) == 2 * len(DATES)
    assert _recorded(conn, jobs + bypassed) == 2 * len(DATES)


async def test_a_partition_made_after_migrate_gets_the_index_and_the_triggers(
    dsn: str, conn: Conn
) -> None:
    conn.execute("DROP TABLE analysis_jobs_rest")
    conn.execute(
        "CREATE TABLE analysis_jobs_2027q1 PARTITION OF analysis_jobs "
        "FOR VALUES FROM ('2027-01-01') TO ('2027-04-01')"
    )
    conn.execute(
        "CREATE TABLE analysis_jobs_2027q2 (LIKE analysis_jobs INCLUDING DEFAULTS INCLUDING "
        "CONSTRAINTS)"
    )
    conn.execute(
        "ALTER TABLE analysis_jobs ATTACH PARTITION analysis_jobs_2027q2 "
        "FOR VALUES FROM ('2027-04-01') TO ('2027-07-01')"
    )
    for table in ("analysis_jobs_2027q1", "analysis_jobs_2027q2"):
        found = _walk_index_of(conn, table)
        assert found is not None, table
        assert found[1], found
    assert scalar(conn, "SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass", (INDEX,))
    jobs = [_job(conn, "2027-02-01")[0], _job(conn, "2027-05-01")[0]]
    for job in jobs:
        _finish(conn, job)
    assert _queued(conn, jobs) == 2
    assert _sweep(dsn) == 2
    assert _recorded(conn, jobs) == 2


def _reanalysed(dsn: str, conn: Conn) -> tuple[uuid.UUID, uuid.UUID]:
    """A run analysed twice, in two partitions: (earlier job, later job), the later recorded."""
    earlier, run_id = _job(conn, "2026-02-01")
    later = uuid.uuid4()
    conn.execute(
        "INSERT INTO analysis_jobs (id, run_id, status, doc_html, created_at) "
        "VALUES (%s, %s, 'running', '<p>again</p>', '2026-05-01')",
        (later, run_id),
    )
    _finish(conn, earlier)
    _finish(conn, later)
    assert _sweep(dsn) == 1
    return earlier, later


async def test_deleting_a_job_requeues_the_earlier_job_of_its_run(dsn: str, conn: Conn) -> None:
    # The statement-level delete trigger with its transition table sits on the parent: a delete
    # through the parent fires it, with the rows of every partition it touched.
    earlier, later = _reanalysed(dsn, conn)
    assert _recorded(conn, [later]) == 1
    assert _queued(conn, [earlier]) == 0
    conn.execute("DELETE FROM analysis_jobs WHERE id = %s", (later,))
    assert _queued(conn, [earlier]) == 1
    assert _sweep(dsn) == 1
    assert _recorded(conn, [earlier]) == 1


async def test_a_delete_naming_a_partition_is_repaired_by_the_reconcile(
    dsn: str, conn: Conn
) -> None:
    # PostgreSQL fires a partitioned table's statement-level triggers only for statements that
    # name it: a DELETE naming the partition passes the parent's trigger by. The reconcile's
    # walk finds the earlier job that needs its run again.
    earlier, later = _reanalysed(dsn, conn)
    conn.execute("DELETE FROM analysis_jobs_2026q2 WHERE id = %s", (later,))
    assert _queued(conn, [earlier]) == 0
    assert _sweep(dsn) == 1
    assert _recorded(conn, [earlier]) == 1


def test_a_partitioned_runs_table_is_refused(empty_database_url: str) -> None:
    _app_tables(empty_database_url, partitioned_runs=True)
    done = run_reactor("migrate", env=reactor_env(empty_database_url))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "analysis_runs is partitioned" in lines[0]
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        assert scalar(conn, "SELECT to_regnamespace('reactor') IS NULL")


def test_the_printed_script_says_what_to_do_on_a_partitioned_table() -> None:
    script = db.migration_script(REFERENCE_INSTALL, reference_schema=False)
    build = script.index(f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{INDEX}"')
    note = script.rindex(
        "-- On a partitioned job table PostgreSQL refuses the next statement", 0, build
    )
    assert "ATTACH PARTITION" in script[note:build]
