"""One reactor schema, one install: `reactor migrate` with a mapping of other tables into a
schema installed on tables that still carry its triggers is refused before it changes anything
(a second app's mapping that forgot its own ``reactor_schema`` would otherwise move the install
off the first app, whose finishing commits the triggers would then refuse). Off tables that no
longer carry them the install moves, onto keys of the types it was made for."""

from __future__ import annotations

from dataclasses import replace

import psycopg
import pytest

from reactor import db
from reactor.errors import ConfigError
from reactor.install import mapping_file
from reactor.install.mapping import REFERENCE, Mapping
from tests.helpers import finish, new_job
from tests.integration.test_mapping import SECOND_SQL, SECOND_TOML

pytestmark = pytest.mark.anyio

# The reactor's triggers on a table, by the schema of the function they call.
TRIGGERS = """
SELECT g.tgname::text FROM pg_trigger g JOIN pg_proc p ON p.oid = g.tgfoid
 WHERE g.tgrelid = %s::regclass AND p.pronamespace = 'reactor'::regnamespace
 ORDER BY 1
"""


def triggers_on(conn: psycopg.Connection, table: str) -> list[str]:
    return [name for (name,) in conn.execute(TRIGGERS, (table,))]


def queued(conn: psycopg.Connection, job_id: object) -> bool:
    row = conn.execute("SELECT count(*) FROM reactor.pending WHERE job_id = %s", (job_id,))
    return row.fetchone() == (1,)


async def migrate(url: str, mapping: Mapping) -> None:
    async with await db.connect(url, "test") as conn:
        await db.migrate(conn, mapping)


def renamed(suffix: str) -> Mapping:
    """The reference mapping on copies of its tables, named with ``suffix``."""
    return replace(
        REFERENCE,
        jobs=replace(REFERENCE.jobs, table=("public", f"analysis_jobs{suffix}")),
        runs=replace(REFERENCE.runs, table=("public", f"analysis_runs{suffix}")),
    )


async def test_a_second_apps_mapping_is_refused_the_first_apps_schema_and_changes_nothing(
    database_url: str,
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(SECOND_SQL)
        before = triggers_on(conn, "analysis_jobs")
        assert before
    with pytest.raises(ConfigError) as refused:
        await migrate(database_url, mapping_file.load(str(SECOND_TOML)))
    message = str(refused.value)
    assert "installed on analysis_jobs and analysis_runs" in message
    assert "reactor_schema of its own" in message
    assert "\n" not in message
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert triggers_on(conn, "analysis_jobs") == before
        assert triggers_on(conn, 'app."Job"') == []
        # The first app's finishing commit still works, and still queues its job.
        job_id, _ = new_job(conn)
        finish(conn, job_id)
        assert queued(conn, job_id)


async def test_an_install_moves_once_its_old_tables_carry_no_triggers(database_url: str) -> None:
    moved = renamed("_v2")
    with psycopg.connect(database_url, autocommit=True) as conn:
        for table in ("jobs", "runs"):
            conn.execute(f"CREATE TABLE analysis_{table}_v2 (LIKE analysis_{table} INCLUDING ALL)")
    with pytest.raises(ConfigError, match="drop the triggers named reactor_"):
        await migrate(database_url, moved)
    with psycopg.connect(database_url, autocommit=True) as conn:
        for table in ("analysis_jobs", "analysis_runs"):
            for name in triggers_on(conn, table):
                conn.execute(f'DROP TRIGGER "{name}" ON {table}')
    await migrate(database_url, moved)
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert triggers_on(conn, "analysis_jobs_v2")
        job_id = conn.execute(
            "INSERT INTO analysis_jobs_v2 (id, run_id, status, doc_html)"
            " VALUES (gen_random_uuid(), gen_random_uuid(), 'running', '<p>x</p>') RETURNING id"
        ).fetchone()
        assert job_id is not None
        conn.execute(
            "UPDATE analysis_jobs_v2 SET status = 'complete', results = '{\"v\": 1}',"
            " updated_at = now() WHERE id = %s",
            job_id,
        )
        assert queued(conn, job_id[0])


async def test_keys_of_other_types_than_the_install_was_made_for_are_refused(
    database_url: str,
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DROP TABLE analysis_runs, analysis_jobs CASCADE")
        conn.execute(SECOND_SQL)
    with pytest.raises(ConfigError) as refused:
        await migrate(database_url, mapping_file.load(str(SECOND_TOML)))
    message = str(refused.value)
    assert "job ids of type uuid and run keys of type uuid" in message
    assert "app.Job has bigint and text" in message
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert triggers_on(conn, 'app."Job"') == []
