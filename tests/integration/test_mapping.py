"""The reactor on the app's own tables: tests/mappings/second.sql, mapped by second.toml.

Every difference the mapping covers at once: another schema, quoted camelCase names, a bigint
job id and a text run key, an enum status with other terminal values, timestamp(3) without time
zone columns holding UTC, no soft delete, other values for saved_by, and NOT NULL artifact
columns filled by expressions. The database's and the test session's TimeZone are neither UTC,
so a naive timestamp read in the session's zone would be hours off.
"""

from __future__ import annotations

import json
import time
import tomllib
import uuid
from pathlib import Path
from typing import Any

import psycopg
import psycopg.conninfo
import pytest

from docs import generate
from reactor import db, status
from reactor.core.payload import parse_hint
from reactor.install import Install, grants, mapping, mapping_file, sql
from reactor.record.recorder import Recorder
from reactor.runtime.replica import open_replica
from reactor.settings.config import Settings
from reactor.settings.pairs import Pair
from reactor.telemetry.metrics import Metrics
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.helpers import Conn
from tests.integration.support import update_counts
from tests.polling import eventually

pytestmark = pytest.mark.anyio

MAPPINGS = Path(__file__).parent.parent / "mappings"
SECOND_SQL = (MAPPINGS / "second.sql").read_text()
SECOND_TOML = MAPPINGS / "second.toml"
CHANNEL = "second_jobs_terminal"
GRACE = 2.0
OWNER = "7f1c0b4e-2d7a-4d8e-9a51-0c6f3f1a2b3c"


@pytest.fixture
def second_url(empty_database_url: str) -> str:
    """A database holding only the second schema, whose default TimeZone is Asia/Tokyo."""
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(SECOND_SQL)
        conn.execute(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET timezone = ''Asia/Tokyo''', "
            "current_database()); END $$"
        )
    return empty_database_url


@pytest.fixture
async def second(second_url: str) -> Install:
    """The second mapping installed by `reactor migrate`, typed by the catalog."""
    async with await db.connect(second_url, "test") as conn:
        migrated = await db.migrate(conn, mapping_file.load(str(SECOND_TOML)), channel=CHANNEL)
    return migrated.install


def app(url: str) -> psycopg.Connection[Any]:
    """The app's session, in a third time zone."""
    return psycopg.connect(url, autocommit=True, options="-c timezone=America/New_York")


def add(
    conn: Conn,
    key: str,
    *,
    state: str = "done",
    age: float = 10.0,
    html: str | None = "<p>report</p>",
    verdicts: Any = ("ok",),
    title: str | None = None,
) -> int:
    """A job as the app writes it: its times are UTC wall-clock, ``age`` seconds ago."""
    row = conn.execute(
        'INSERT INTO app."Job" ("reportKey", state, html, verdicts, "ownerId", title,'
        ' "createdAt", "updatedAt")'
        " VALUES (%s, %s, %s, %s::jsonb, %s, %s, now() AT TIME ZONE 'UTC',"
        "         (now() - make_interval(secs => %s)) AT TIME ZONE 'UTC')"
        ' RETURNING "jobId"',
        (key, state, html, None if verdicts is None else json.dumps(verdicts), OWNER, title, age),
    ).fetchone()
    assert row is not None
    return int(row[0])


def report(conn: Conn, key: str) -> tuple[Any, ...] | None:
    return conn.execute(
        'SELECT origin, "fromJob", verdicts, "ownerId"::text, title'
        ' FROM app."Report" WHERE key = %s',
        (key,),
    ).fetchone()


async def drain(install: Install, url: str) -> int:
    async with db.make_pool(url, max_size=2) as pool:
        database = db.Database.pooled(install, pool, settings=Settings(grace=GRACE))
        return (await Recorder(database, Metrics()).drain(100)).recorded


async def test_migrate_types_the_reactor_tables_by_the_app_columns(
    second: Install, second_url: str
) -> None:
    assert second.id_type == "bigint"
    assert second.mapping.jobs.run_type == "text"
    assert second.mapping.jobs.table == ("app", "Job")
    with app(second_url) as conn:
        types = dict(
            conn.execute(
                "SELECT c.relname || '.' || a.attname, format_type(a.atttypid, a.atttypmod)"
                "  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
                "  JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = 'reactor' AND a.attname IN ('job_id', 'run_id', 'cursor_run')"
            ).fetchall()
        )
        assert types["pending.job_id"] == "bigint"
        assert types["hook_outbox.run_id"] == "text"
        assert types["reconcile.cursor_run"] == "text"
        # The walk index is on the app's table, by its own names.
        assert conn.execute(
            "SELECT count(*) FROM pg_indexes WHERE schemaname = 'app' AND tablename = 'Job'"
            " AND indexname = 'Job_reactor_run_idx'"
        ).fetchone() == (1,)


def test_migrate_print_against_the_catalog_is_what_the_docs_show(second_url: str) -> None:
    # docs/mapping.md shows the SQL docs/generate.py renders with the types it says the catalog
    # gives second.sql's columns: the command itself, on that catalog, prints exactly that.
    printed = run_reactor(
        "migrate",
        "--print",
        env=reactor_env(second_url, REACTOR_CONFIG=str(SECOND_TOML)),
    )
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == generate.second_script()


async def test_due_jobs_are_recorded_from_utc_wall_clock_times(
    second: Install, second_url: str
) -> None:
    with app(second_url) as conn:
        due = add(conn, "due", title=None)
        fresh = add(conn, "fresh", age=0.0)  # inside its grace, whatever the session's zone
        running = add(conn, "running", state="running")
        empty = add(conn, "empty", verdicts={})
        bare = add(conn, "bare", html=None)
        saved = add(conn, "saved")
        conn.execute(
            'INSERT INTO app."Report" (key, "fromJob", origin, verdicts, "ownerId", title)'
            " VALUES ('saved', %s, 'user', '[\"mine\"]', %s, 'Tab')",
            (saved, OWNER),
        )
        legacy = add(conn, "legacy")
        conn.execute(
            'INSERT INTO app."Report" (key, "fromJob", origin, verdicts, "ownerId", title)'
            " VALUES ('legacy', %s, NULL, '[\"old\"]', %s, 'Old')",
            (legacy, OWNER),
        )
        queued = conn.execute("SELECT job_id FROM reactor.pending ORDER BY job_id").fetchall()
        assert [row[0] for row in queued] == sorted([due, fresh, saved, legacy])

    assert await drain(second, second_url) == 1

    with app(second_url) as conn:
        assert report(conn, "due") == ("system", due, ["ok"], OWNER, "Untitled")
        assert report(conn, "fresh") is None
        assert report(conn, "running") is None
        assert report(conn, "empty") is None
        assert report(conn, "bare") is None
        assert report(conn, "saved") == ("user", saved, ["mine"], OWNER, "Tab")
        assert report(conn, "legacy") == (None, legacy, ["old"], OWNER, "Old")
        del running, empty, bare


async def test_a_later_job_of_the_run_replaces_the_worker_row(
    second: Install, second_url: str
) -> None:
    with app(second_url) as conn:
        first = add(conn, "again", verdicts=["first"])
    assert await drain(second, second_url) == 1
    with app(second_url) as conn:
        later = add(conn, "again", verdicts=["later"])
        assert (
            conn.execute("SELECT count(*) FROM reactor.pending WHERE job_id = %s", (later,))
        ).fetchone() == (1,)
    assert await drain(second, second_url) == 1
    with app(second_url) as conn:
        assert report(conn, "again") == ("system", later, ["later"], OWNER, "Untitled")
        assert first < later


async def test_the_trigger_hints_with_the_bigint_id_and_the_utc_instant(
    second: Install, second_url: str
) -> None:
    with app(second_url) as listener, app(second_url) as conn:
        listener.execute(f"LISTEN {CHANNEL}")
        job = add(conn, "hinted", age=3.0)
        hints = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert len(hints) == 1
    parsed = parse_hint(hints[0], second.id_type)
    assert parsed is not None
    job_id, at = parsed
    assert job_id == str(job)
    assert at is not None
    assert abs(time.time() - 3.0 - at) < 2.0


async def test_the_reconcile_finds_a_job_that_went_around_the_trigger(
    second: Install, second_url: str
) -> None:
    with app(second_url) as conn:
        conn.execute("SET session_replication_role = replica")
        restored = add(conn, "restored")
        conn.execute("SET session_replication_role = origin")
        assert conn.execute("SELECT count(*) FROM reactor.pending").fetchone() == (0,)
    async with await db.connect(second_url, "test") as conn:
        found = await db.Database.dedicated(
            second, conn, settings=Settings(grace=GRACE)
        ).reconcile_pass("test")
    assert found.found == 1
    assert found.example == str(restored)
    assert await drain(second, second_url) == 1


async def test_status_reads_the_mapped_tables(second: Install, second_url: str) -> None:
    with app(second_url) as conn:
        add(conn, "late")
        add(conn, "early", age=0.0)
    settings = Settings(database_url=second_url, grace=GRACE)
    async with await db.connect(second_url, "status", configure_session=False) as conn:
        report = await status.collect(conn, second, settings)
    document = status.as_json(report)
    assert document["jobs"]["due"] == 1
    assert document["jobs"]["in_grace"] == 1


async def test_a_role_with_the_printed_grants_records_on_the_mapped_tables(
    second: Install, second_url: str
) -> None:
    name = f"reactor_rt_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(second_url, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{name}" LOGIN')
        try:
            admin.execute(grants.grant_script(name, second.mapping).encode())
            printed = grants.grant_script(name, second.mapping)
            assert f'GRANT USAGE ON SCHEMA app TO "{name}";' in printed
            assert f'GRANT UPDATE ("updatedAt") ON app."Job" TO "{name}";' in printed
            assert "outranks_v2(bigint, bigint, text)" in printed
            with app(second_url) as conn:
                add(conn, "as-role")
            as_role = psycopg.conninfo.make_conninfo(second_url, user=name)
            async with await db.connect(as_role, "test", configure_session=False) as conn:
                await db.Database.dedicated(second, conn).require_privileges()
            assert await drain(second, as_role) == 1
            with app(second_url) as conn:
                assert report(conn, "as-role") is not None
        finally:
            admin.execute(f'DROP OWNED BY "{name}"')
            admin.execute(f'DROP ROLE "{name}"')


async def test_two_sidecars_share_a_database_through_two_reactor_schemas(
    second_url: str, tmp_path: Path
) -> None:
    # The reference pair and the second pair in one database, each with a reactor of its own:
    # its own schema, queue, channel and triggers. Neither sees the other's jobs.
    with psycopg.connect(second_url, autocommit=True) as conn:
        conn.execute(sql.read("reference.sql"))
    own = tmp_path / "second.toml"
    own.write_text('reactor_schema = "second_reactor"\n' + SECOND_TOML.read_text())
    env = reactor_env(second_url, REACTOR_GRACE_SECONDS=str(GRACE))
    assert run_reactor("migrate", env=env).returncode == 0
    second_env = {**env, "REACTOR_CONFIG": str(own)}
    migrated = run_reactor("migrate", env=second_env)
    assert migrated.returncode == 0, migrated.stderr

    with app(second_url) as conn:
        add(conn, "theirs")
        conn.execute(
            "INSERT INTO analysis_jobs (id, run_id, status, doc_html, results, updated_at)"
            " VALUES (gen_random_uuid(), gen_random_uuid(), 'complete', '<p/>', '{\"a\": 1}',"
            " now() - interval '10 seconds')"
        )
        assert conn.execute("SELECT count(*) FROM reactor.pending").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM second_reactor.pending").fetchone() == (1,)
        triggers = {
            row[0]
            for row in conn.execute(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = 'app.\"Job\"'::regclass"
            )
        }
        assert triggers == {
            "second_reactor_job_insert",
            "second_reactor_job_update",
            "second_reactor_jobs_delete",
        }

    swept = run_reactor("sweep", "--once", env=second_env)
    assert swept.returncode == 0, swept.stderr
    assert swept.stdout.strip() == "1"
    with app(second_url) as conn:
        assert report(conn, "theirs") is not None
        assert conn.execute("SELECT count(*) FROM analysis_runs").fetchone() == (0,)
    swept = run_reactor("sweep", "--once", env=env)
    assert swept.stdout.strip() == "1"
    with app(second_url) as conn:
        assert conn.execute("SELECT count(*) FROM analysis_runs").fetchone() == (1,)
        assert conn.execute('SELECT count(*) FROM app."Report"').fetchone() == (1,)
    # Each status reads its own schema.
    status_of_second = run_reactor("status", "--json", env=second_env)
    assert json.loads(status_of_second.stdout)["jobs"]["due"] == 0


async def test_two_installs_live_side_by_side_in_one_process(second_url: str) -> None:
    # The install is a value: two of them, on two mappings and two reactor schemas, each with a
    # running replica in this one process, and neither reads the other's statements or jobs.
    with psycopg.connect(second_url, autocommit=True) as conn:
        conn.execute(sql.read("reference.sql"))
    second_shape = mapping_file.parse(
        {"reactor_schema": "second_reactor", **tomllib.loads(SECOND_TOML.read_text())},
        source=str(SECOND_TOML),
    )
    async with await db.connect(second_url, "test") as migrating:
        reference = (await db.migrate(migrating, mapping.REFERENCE)).install
        second = (await db.migrate(migrating, second_shape)).install
    assert (reference.channel, second.channel) == (
        "analysis_jobs_terminal",
        "second_reactor_jobs_terminal",
    )
    assert reference.query("record_jobs") != second.query("record_jobs")

    settings = Settings(database_url=second_url, grace=GRACE, http_addr=None)
    async with (
        open_replica(settings, [Pair(reference, settings)]) as first_process,
        open_replica(settings, [Pair(second, settings)]) as second_process,
        first_process.running(),
        second_process.running(),
    ):
        with app(second_url) as conn:
            add(conn, "theirs", age=0.0)
            conn.execute(
                "INSERT INTO analysis_jobs (id, run_id, status, doc_html, results)"
                " VALUES (gen_random_uuid(), gen_random_uuid(), 'complete', '<p/>',"
                " '{\"a\": 1}')"
            )

            def both_recorded() -> bool:
                runs = conn.execute("SELECT count(*) FROM analysis_runs").fetchone()
                reports = conn.execute('SELECT count(*) FROM app."Report"').fetchone()
                return runs == (1,) and reports == (1,)

            await eventually(both_recorded, timeout=10 * GRACE)
            assert report(conn, "theirs") is not None
    assert first_process.reactors[reference.schema].database.install is reference
    assert second_process.reactors[second.schema].database.install is second
    # Each pair's queries read its settings, not a copy of its grace.
    assert first_process.reactors[reference.schema].database.settings is settings


async def test_the_apps_progress_updates_stay_hot_on_the_mapped_table(
    second: Install, second_url: str
) -> None:
    with app(second_url) as conn:
        jobs = [add(conn, f"running-{i}", state="running", verdicts=None) for i in range(5)]
        before = update_counts(conn, 'app."Job"')
        for step in range(3):
            conn.execute(
                "UPDATE app.\"Job\" SET verdicts = coalesce(verdicts, '[]'::jsonb) || %s::jsonb,"
                ' "updatedAt" = now() AT TIME ZONE \'UTC\' WHERE "jobId" = ANY(%s)',
                (json.dumps([step]), jobs),
            )
        after = update_counts(conn, 'app."Job"')
    assert after[0] - before[0] == 15
    assert after[1] - before[1] == 15
