"""The reactor on a one-to-one artifact: tests/mappings/onetoone.sql, mapped by onetoone.toml.

Django's OneToOneField(primary_key=True): the report is keyed by the export's id, so jobs.run is
the job's id and runs.key and runs.job are one column, written once. The status is a varchar a
CHECK lists the values of, and there is no created_at. Then the other shapes of status the
mapping takes: an integer (Rails' enum), and the terminal values a CHECK decides.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from reactor import db
from reactor.errors import ConfigError
from reactor.install import Install, mapping_file
from reactor.install.mapping import Mapping
from reactor.record.recorder import Recorder
from reactor.settings.config import Settings
from reactor.telemetry.metrics import Metrics
from tests.helpers import Conn
from tests.integration.support import column

pytestmark = pytest.mark.anyio

MAPPINGS = Path(__file__).parent.parent / "mappings"
ONETOONE_SQL = (MAPPINGS / "onetoone.sql").read_text()
ONETOONE = mapping_file.load(str(MAPPINGS / "onetoone.toml"))
GRACE = 2.0


@pytest.fixture
def onetoone_url(empty_database_url: str) -> str:
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(ONETOONE_SQL)
    return empty_database_url


async def migrate(url: str, shape: Mapping) -> db.Migrated:
    async with await db.connect(url, "test") as conn:
        return await db.migrate(conn, shape)


async def drain(install: Install, url: str) -> int:
    async with db.make_pool(url, max_size=2) as pool:
        database = db.Database.pooled(install, pool, settings=Settings(grace=GRACE))
        return (await Recorder(database, Metrics()).drain(100)).recorded


def add(conn: Conn, *, state: str = "done", age: float = 10.0, summary: Any = ("ok",)) -> int:
    """An export as the app writes it, last updated ``age`` seconds ago."""
    row = conn.execute(
        "INSERT INTO app.exports (state, body, summary, owner_id, updated_at)"
        " VALUES (%s, '<p>export</p>', %s::jsonb, 7, now() - make_interval(secs => %s))"
        " RETURNING id",
        (state, json.dumps(summary), age),
    ).fetchone()
    assert row is not None
    return int(row[0])


def client_save(conn: Conn, export: int, summary: str) -> None:
    """The app's own save of a report: the upsert that marks itself as the client."""
    conn.execute(
        "INSERT INTO app.export_reports (export_id, body, summary, owner_id, written_at, saved_by)"
        " VALUES (%s, 'mine', %s::jsonb, 7, now(), 'client')"
        " ON CONFLICT (export_id) DO UPDATE SET body = EXCLUDED.body,"
        " summary = EXCLUDED.summary, saved_by = 'client'",
        (export, summary),
    )


def refinish(conn: Conn, exports: list[int], state: str, summary: Any = ("ok",)) -> None:
    """The exports run again and finish in ``state`` with ``summary``, 5 s ago."""
    conn.execute("UPDATE app.exports SET state = 'running' WHERE id = ANY(%s)", (exports,))
    conn.execute(
        "UPDATE app.exports SET state = %s, summary = %s::jsonb,"
        " updated_at = now() - interval '5 s' WHERE id = ANY(%s)",
        (state, json.dumps(summary), exports),
    )


def reports(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT export_id, saved_by, summary, owner_id FROM app.export_reports ORDER BY export_id"
    ).fetchall()


def walk_indexes(conn: Conn) -> list[str]:
    """The indexes of app.exports, by name."""
    return column(
        conn,
        "SELECT indexname FROM pg_indexes WHERE schemaname = %s AND tablename = %s ORDER BY 1",
        ("app", "exports"),
    )


async def test_each_export_gets_its_report_once_written_by_one_column(onetoone_url: str) -> None:
    assert ONETOONE.one_to_one
    assert ONETOONE.jobs.created_at is None
    install = (await migrate(onetoone_url, ONETOONE)).install
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        due = add(conn)
        fresh = add(conn, age=0.0)
        running = add(conn, state="running")
        empty = add(conn, summary={})
        queued = conn.execute("SELECT job_id FROM reactor.pending ORDER BY job_id").fetchall()
        assert [row[0] for row in queued] == [due, fresh]

    assert await drain(install, onetoone_url) == 1
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        assert reports(conn) == [(due, "worker", ["ok"], 7)]
    # Again: the report stands for the export's finish, and is written once for it.
    assert await drain(install, onetoone_url) == 0
    # The export runs again and finishes with another summary: its report is the last finish's,
    # in the one row the export has.
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        refinish(conn, [due], "done", ["retried"])
    assert await drain(install, onetoone_url) == 1
    assert await drain(install, onetoone_url) == 0
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        assert reports(conn) == [(due, "worker", ["retried"], 7)]
        del running, empty


async def test_a_client_save_wins_before_and_after_the_worker(onetoone_url: str) -> None:
    install = (await migrate(onetoone_url, ONETOONE)).install
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        saved_first = add(conn)
        client_save(conn, saved_first, '["tab"]')
        saved_later = add(conn)
    assert await drain(install, onetoone_url) == 1
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        client_save(conn, saved_later, '["late tab"]')
        # The export finishes again: nothing may replace the client's report.
        refinish(conn, [saved_first, saved_later], "error")
    assert await drain(install, onetoone_url) == 0
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        assert reports(conn) == [
            (saved_first, "client", ["tab"], 7),
            (saved_later, "client", ["late tab"], 7),
        ]


async def test_the_walk_index_is_the_id_alone_and_never_a_copy(onetoone_url: str) -> None:
    migrated = await migrate(onetoone_url, ONETOONE)
    # The walk's predicate (body IS NOT NULL) makes it an index of its own, on the id alone.
    assert migrated.skipped == []
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        definition = conn.execute(
            "SELECT pg_get_indexdef('app.exports_reactor_run_idx'::regclass)"
        ).fetchone()
        assert definition is not None
        assert "(id) WHERE (body IS NOT NULL)" in definition[0]
        # The app's own index over the same rows does the same: the reactor's goes.
        conn.execute("CREATE INDEX exports_with_body ON app.exports (id) WHERE body IS NOT NULL")
    again = await migrate(onetoone_url, ONETOONE)
    assert again.skipped == [("app.exports_reactor_run_idx", "exports_with_body")]
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        assert walk_indexes(conn) == ["exports_pkey", "exports_with_body"]


async def test_without_a_predicate_the_primary_key_is_the_walk_index(onetoone_url: str) -> None:
    bare = replace(ONETOONE, jobs=replace(ONETOONE.jobs, not_null=(), not_empty=()))
    migrated = await migrate(onetoone_url, bare)
    assert migrated.skipped == [("app.exports_reactor_run_idx", "exports_pkey")]
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        assert walk_indexes(conn) == ["exports_pkey"]
        add(conn)
    assert await drain(migrated.install, onetoone_url) == 1


async def test_a_terminal_value_the_check_refuses_is_named(onetoone_url: str) -> None:
    wrong = replace(ONETOONE, jobs=replace(ONETOONE.jobs, terminal=("done", "failed")))
    with pytest.raises(ConfigError, match=r"jobs.terminal names 'failed', which no row of "):
        await migrate(onetoone_url, wrong)
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        assert conn.execute("SELECT to_regnamespace('reactor')").fetchone() == (None,)


INTEGER_SQL = """
CREATE TABLE tasks (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status      integer NOT NULL DEFAULT 0 CHECK (status >= 0 AND status < 5),
    output      text,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE task_results (
    task_id     bigint PRIMARY KEY REFERENCES tasks (id),
    output      text NOT NULL
);
"""
INTEGER = mapping_file.parse(
    {
        "jobs": {
            "table": "tasks",
            "id": "id",
            "run": "id",
            "status": "status",
            "terminal": [3, 4],
            "updated_at": "updated_at",
            "not_null": ["output"],
        },
        "runs": {
            "table": "task_results",
            "key": "task_id",
            "job": "task_id",
            "columns": {"output": "j.output"},
        },
    },
    source="integer.toml",
)


async def test_an_integer_status_is_compared_as_an_integer(empty_database_url: str) -> None:
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(INTEGER_SQL)
    install = (await migrate(empty_database_url, INTEGER)).install
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        ids = [
            conn.execute(
                "INSERT INTO tasks (status, output, updated_at)"
                " VALUES (%s, 'out', now() - interval '10 s') RETURNING id",
                (status,),
            ).fetchone()
            for status in (1, 3, 4)
        ]
        running, done, failed = (row[0] for row in ids if row is not None)
        # The trigger's WHEN compared the integers: the two finished tasks were queued.
        queued = conn.execute("SELECT job_id FROM reactor.pending ORDER BY job_id").fetchall()
        assert [row[0] for row in queued] == [done, failed]
    assert await drain(install, empty_database_url) == 2
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT task_id, saved_by FROM task_results ORDER BY task_id"
        ).fetchall()
        assert rows == [(done, "worker"), (failed, "worker")]
        # The running one finishes: the update trigger's WHEN fires on the integer too.
        conn.execute(
            "UPDATE tasks SET status = 3, updated_at = now() - interval '10 s' WHERE id = %s",
            (running,),
        )
    assert await drain(install, empty_database_url) == 1


async def test_an_integer_terminal_value_outside_the_check_is_named(
    empty_database_url: str,
) -> None:
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(INTEGER_SQL)
    wrong = replace(INTEGER, jobs=replace(INTEGER.jobs, terminal=(3, 9)))
    with pytest.raises(ConfigError, match=r"jobs.terminal names 9, which no row of tasks"):
        await migrate(empty_database_url, wrong)
