"""The reactor's SQL: the migrations produce triggers/schema.sql, and applying them is idempotent,
safe to run twice at once, upgrades legacy apps, and matches `reactor migrate --print`."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import psycopg
import psycopg.errors
import pytest

from reactor import db
from reactor.db import indexes
from reactor.errors import SchemaMissing
from reactor.install import REFERENCE_INSTALL, sql
from reactor.install.mapping import REFERENCE
from tests.conftest import Server
from tests.polling import eventually

pytestmark = pytest.mark.anyio

CHANNEL = "analysis_jobs_terminal"
SCHEMAS = ["public", "reactor"]
ALL_VERSIONS = [m.version for m in sql.migrations()]

# reference.sql's analysis_jobs after its key (which a partitioned table widens).
JOB_COLUMNS = """
    run_id      uuid NOT NULL,
    status      text NOT NULL,
    doc_html    text,
    results     jsonb,
    deleted_at  timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()"""

# What an app looked like before the reactor: analysis_runs has no saved_by.
LEGACY_SQL = f"""
CREATE TABLE analysis_jobs (
    id          uuid PRIMARY KEY,{JOB_COLUMNS}
);
CREATE TABLE analysis_runs (
    id          uuid PRIMARY KEY,
    job_id      uuid NOT NULL,
    doc_html    text,
    results     jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
"""

# Each query returns rows that describe one kind of catalog object in SCHEMAS; columns are
# compared by name, not position (a column added by ALTER TABLE comes last).
CATALOG: dict[str, str] = {
    "schemas": "SELECT nspname FROM pg_namespace WHERE nspname = ANY(%(s)s) ORDER BY 1",
    "relations": """
        SELECT n.nspname, c.relname, c.relkind, c.relpersistence
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = ANY(%(s)s) ORDER BY 1, 2
    """,
    "columns": """
        SELECT n.nspname, c.relname, a.attname, format_type(a.atttypid, a.atttypmod),
               a.attnotnull, pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated,
               coll.collname
          FROM pg_class c
          JOIN pg_namespace n ON n.oid = c.relnamespace
          JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
          LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
          LEFT JOIN pg_collation coll ON coll.oid = a.attcollation
         WHERE n.nspname = ANY(%(s)s) AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
         ORDER BY 1, 2, 3
    """,
    "indexes": """
        SELECT schemaname, tablename, indexname, indexdef
          FROM pg_indexes WHERE schemaname = ANY(%(s)s) ORDER BY 1, 2, 3
    """,
    "constraints": """
        SELECT n.nspname, c.conrelid::regclass::text, c.conname, c.contype,
               pg_get_constraintdef(c.oid)
          FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
         WHERE n.nspname = ANY(%(s)s) ORDER BY 1, 2, 3
    """,
    "triggers": """
        SELECT t.tgrelid::regclass::text, t.tgname, t.tgenabled, pg_get_triggerdef(t.oid)
          FROM pg_trigger t
          JOIN pg_class c ON c.oid = t.tgrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = ANY(%(s)s) AND NOT t.tgisinternal ORDER BY 1, 2
    """,
    "functions": """
        SELECT n.nspname, p.proname, pg_get_function_identity_arguments(p.oid),
               pg_get_functiondef(p.oid), p.proacl::text[]
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = ANY(%(s)s) AND p.prokind IN ('f', 'p') ORDER BY 1, 2, 3
    """,
}

Catalog = dict[str, list[tuple[Any, ...]]]


def catalog(dsn: str) -> Catalog:
    """A snapshot of every object the reactor or the reference schema could create."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {kind: conn.execute(q, {"s": SCHEMAS}).fetchall() for kind, q in CATALOG.items()}


def versions(dsn: str) -> list[tuple[int, int]]:
    """(version, how many rows) of reactor.schema_version."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [
            (int(v), int(n))
            for v, n in conn.execute(
                "SELECT version, count(*) FROM reactor.schema_version GROUP BY 1 ORDER BY 1"
            ).fetchall()
        ]


def execute(dsn: str, text: str) -> None:
    """Run SQL text the way psql -f would (simple query protocol, autocommit).

    A statement marked as outside any transaction is sent on its own, as psql would send it;
    the rest go in blocks (one simple query runs as one implicit transaction).
    """
    blocks = text.split(db.OUTSIDE_TRANSACTION)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(blocks[0])
        for block in blocks[1:]:
            statement, rest = [*re.split(r";[ \t]*$", block, maxsplit=1, flags=re.M), ""][:2]
            conn.execute(statement)
            if rest.strip():
                conn.execute(rest)


async def migrate(dsn: str, *, reference_schema: bool, channel: str = CHANNEL) -> list[int]:
    async with await db.connect(dsn, "test") as conn:
        migrated = await db.migrate(
            conn, REFERENCE, channel=channel, reference_schema=reference_schema
        )
        return migrated.applied


@pytest.fixture
def make_database(server: Server) -> Iterator[Callable[[], str]]:
    """Creates as many fresh empty databases as a test asks for; drops them afterwards."""
    names: list[str] = []

    def make() -> str:
        name = f"e_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        names.append(name)
        return server.dsn_for(name)

    yield make
    with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def test_migrations_produce_the_current_schema(
    empty_database_url: str, make_database: Callable[[], str]
) -> None:
    migrated = empty_database_url
    execute(migrated, sql.read("reference.sql"))
    assert await migrate(migrated, reference_schema=False) == ALL_VERSIONS

    declared = make_database()
    execute(declared, sql.read("reference.sql"))
    execute(declared, REFERENCE_INSTALL.render(sql.read("schema.sql")))
    execute(declared, REFERENCE_INSTALL.render(sql.read("notify_triggers.sql"), channel=CHANNEL))
    for step in indexes.repeatable(REFERENCE_INSTALL):
        assert isinstance(step, indexes.Index)
        execute(declared, step.create())

    got, want = catalog(migrated), catalog(declared)
    # The snapshot must see what matters, or comparing it proves nothing.
    assert any("pending_since_idx" in row for row in want["indexes"])
    assert any("analysis_jobs_reactor_run_idx" in row for row in want["indexes"])
    assert {row[1] for row in want["triggers"]} == {
        "reactor_job_insert",
        "reactor_job_update",
        "reactor_jobs_delete",
        "reactor_run_delete",
        "reactor_run_update",
        "reactor_runs_truncate",
    }
    assert [row[1] for row in want["functions"]] == [
        "app_table_v1",
        "hint_v1",
        "job_changed_v1",
        "jobs_deleted_v1",
        "outranks_v1",
        "outranks_v2",
        "queue_runs_v2",
        "run_changed_v1",
    ]
    for kind in CATALOG:
        assert got[kind] == want[kind], f"{kind} differ between migrations/ and schema.sql"


async def test_migrate_twice_is_a_no_op(empty_database_url: str) -> None:
    assert await migrate(empty_database_url, reference_schema=True) == ALL_VERSIONS
    first = catalog(empty_database_url)
    assert await migrate(empty_database_url, reference_schema=True) == []
    assert await migrate(empty_database_url, reference_schema=False) == []
    assert catalog(empty_database_url) == first
    assert versions(empty_database_url) == [(v, 1) for v in ALL_VERSIONS]
    async with await db.connect(empty_database_url, "test") as conn:
        await db.require_schema(conn, "reactor")


async def test_concurrent_migrates_both_succeed_once(
    empty_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    dsn = empty_database_url
    lock = re.search(
        r"pg_advisory_xact_lock\((\d+)\)",
        db.migration_script(REFERENCE_INSTALL, reference_schema=True),
    )
    assert lock is not None
    key = int(lock.group(1))
    results: list[list[int]] = []

    async def one() -> None:
        results.append(await migrate(dsn, reference_schema=True))

    def waiting() -> int:
        return sum("another `reactor migrate` is running" in r.getMessage() for r in caplog.records)

    caplog.set_level("INFO", logger="reactor.db")
    with psycopg.connect(dsn, autocommit=True) as holder:
        # Hold the migration lock so that both migrations are surely in flight at once.
        holder.execute("SELECT pg_advisory_lock(%s)", (key,))
        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            tg.start_soon(one)
            await eventually(lambda: waiting() == 2)
            holder.execute("SELECT pg_advisory_unlock(%s)", (key,))
    assert sorted(results) == [[], ALL_VERSIONS]
    assert versions(dsn) == [(v, 1) for v in ALL_VERSIONS]


async def test_legacy_app_gets_saved_by(
    empty_database_url: str, make_database: Callable[[], str]
) -> None:
    legacy = empty_database_url
    execute(legacy, LEGACY_SQL)
    run_id, job_id = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(legacy, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO analysis_runs (id, job_id, results) VALUES (%s, %s, '{}')",
            (run_id, job_id),
        )
    assert await migrate(legacy, reference_schema=False) == ALL_VERSIONS

    with psycopg.connect(legacy, autocommit=True) as conn:
        column = conn.execute(
            "SELECT format_type(atttypid, atttypmod), attnotnull FROM pg_attribute "
            "WHERE attrelid = 'analysis_runs'::regclass AND attname = 'saved_by'"
        ).fetchone()
        assert column == ("text", False)
        checks = conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = 'analysis_runs'::regclass AND contype = 'c'"
        ).fetchall()
        assert len(checks) == 1
        assert "saved_by" in checks[0][0]
        assert "'client'" in checks[0][0]
        assert "'worker'" in checks[0][0]
        # The old row stays a client row (NULL); the constraint holds for new ones.
        row = conn.execute("SELECT saved_by FROM analysis_runs WHERE id = %s", (run_id,))
        assert row.fetchone() == (None,)
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "INSERT INTO analysis_runs (id, job_id, results, saved_by) "
                "VALUES (gen_random_uuid(), gen_random_uuid(), '{}', 'robot')"
            )
        for who in ("client", "worker"):
            conn.execute(
                "INSERT INTO analysis_runs (id, job_id, results, saved_by) "
                "VALUES (gen_random_uuid(), gen_random_uuid(), '{}', %s)",
                (who,),
            )

    # Apart from where the new column sits, it now looks like a new install.
    fresh = make_database()
    execute(fresh, sql.read("reference.sql"))
    await migrate(fresh, reference_schema=False)
    assert catalog(legacy) == catalog(fresh)


async def test_printed_script_gives_the_migrated_schema(
    empty_database_url: str, make_database: Callable[[], str]
) -> None:
    script = db.migration_script(REFERENCE_INSTALL, reference_schema=True)
    printed = empty_database_url
    execute(printed, script)

    migrated = make_database()
    assert await migrate(migrated, reference_schema=True) == ALL_VERSIONS

    assert catalog(printed) == catalog(migrated)
    assert versions(printed) == versions(migrated) == [(v, 1) for v in ALL_VERSIONS]
    # The printed script is idempotent too, and `reactor migrate` sees nothing left to do.
    execute(printed, script)
    assert catalog(printed) == catalog(migrated)
    assert await migrate(printed, reference_schema=False) == []
    assert versions(printed) == [(v, 1) for v in ALL_VERSIONS]


async def test_migrate_without_the_app_tables_raises_schema_missing(
    empty_database_url: str,
) -> None:
    with pytest.raises(SchemaMissing, match="analysis_jobs"):
        await migrate(empty_database_url, reference_schema=False)
    # Nothing was left half-done.
    assert catalog(empty_database_url)["schemas"] == [("public",)]
    assert catalog(empty_database_url)["relations"] == []


async def test_migrate_repoints_the_triggers_at_a_new_channel(empty_database_url: str) -> None:
    await migrate(empty_database_url, reference_schema=True)
    assert await migrate(empty_database_url, reference_schema=False, channel="other_chan") == []
    triggers = catalog(empty_database_url)["triggers"]
    assert len(triggers) == 6
    assert all("'other_chan'" in row[3] and CHANNEL not in row[3] for row in triggers)


# notify_triggers.sql as releases with migrations 3 to 5 shipped it; 0006 replaced both.
_TERMINAL_TRIGGERS = """
CREATE OR REPLACE TRIGGER reactor_terminal_insert AFTER INSERT ON analysis_jobs FOR EACH ROW
    WHEN (NEW.status IN ('complete', 'failed'))
    EXECUTE FUNCTION reactor.notify_terminal_v1(@channel@);
CREATE OR REPLACE TRIGGER reactor_terminal_update AFTER UPDATE OF status ON analysis_jobs
    FOR EACH ROW
    WHEN (NEW.status IN ('complete', 'failed') AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION reactor.notify_terminal_v1(@channel@);
"""


@pytest.mark.parametrize("installed", range(sql.latest_version()))
async def test_upgrade_from_every_older_version(
    installed: int, empty_database_url: str, make_database: Callable[[], str]
) -> None:
    # An install of an older release: its migrations and their version rows, nothing newer.
    old = empty_database_url
    execute(old, sql.read("reference.sql"))
    for migration in sql.migrations()[:installed]:
        execute(old, REFERENCE_INSTALL.render(migration.text, channel=CHANNEL))
        with psycopg.connect(old, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO reactor.schema_version (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
    if 3 <= installed < 6:  # releases with migrations 3-5 installed these triggers
        execute(old, REFERENCE_INSTALL.render(_TERMINAL_TRIGGERS, channel=CHANNEL))
    assert await migrate(old, reference_schema=False) == ALL_VERSIONS[installed:]

    # The printed upgrade script from that version does the same.
    scripted = make_database()
    execute(scripted, sql.read("reference.sql"))
    for migration in sql.migrations()[:installed]:
        execute(scripted, REFERENCE_INSTALL.render(migration.text, channel=CHANNEL))
    execute(
        scripted, db.migration_script(REFERENCE_INSTALL, reference_schema=False, applied=installed)
    )

    fresh = make_database()
    execute(fresh, sql.read("reference.sql"))
    await migrate(fresh, reference_schema=False)
    assert catalog(old) == catalog(fresh)
    assert catalog(scripted) == catalog(fresh)
    assert versions(old) == [(v, 1) for v in ALL_VERSIONS]


async def test_an_install_at_version_12_upgrades_in_place_with_its_work_in_flight(
    empty_database_url: str,
) -> None:
    # A release at schema version 12, running: jobs queued, one set aside for nothing (0013
    # adds that table), hook rows open and parked. The upgrade keeps every one of them.
    old = empty_database_url
    execute(old, sql.read("reference.sql"))
    for migration in sql.migrations()[:12]:
        execute(old, REFERENCE_INSTALL.render(migration.text, channel=CHANNEL))
        with psycopg.connect(old, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO reactor.schema_version (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
    queued, hooked = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(old, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO analysis_jobs (id, run_id, status, doc_html, results)"
            " VALUES (%s, gen_random_uuid(), 'complete', '<p/>', '{\"a\": 1}')",
            (queued,),
        )
        # What that release's trigger queued (its repeatable script is not part of this test).
        conn.execute("INSERT INTO reactor.pending (job_id) VALUES (%s)", (queued,))
        conn.execute(
            "INSERT INTO reactor.hook_outbox (run_id, job_id, hook, status, attempts, last_error)"
            " VALUES (gen_random_uuid(), %s, 'judge', 'pending', 0, NULL),"
            "        (gen_random_uuid(), %s, 'judge', 'failed', 40, 'boom')",
            (hooked, hooked),
        )
        before = conn.execute(
            "SELECT run_id, job_id, hook, status, attempts, last_error FROM reactor.hook_outbox"
            " ORDER BY status"
        ).fetchall()

    assert await migrate(old, reference_schema=False) == ALL_VERSIONS[12:]

    with psycopg.connect(old, autocommit=True) as conn:
        assert conn.execute("SELECT job_id FROM reactor.pending").fetchall() == [(queued,)]
        after = conn.execute(
            "SELECT run_id, job_id, hook, status, attempts, last_error FROM reactor.hook_outbox"
            " ORDER BY status"
        ).fetchall()
        assert after == before
        # And the upgraded triggers queue the next job as before.
        conn.execute(
            "INSERT INTO analysis_jobs (id, run_id, status, doc_html, results)"
            " VALUES (gen_random_uuid(), gen_random_uuid(), 'complete', '<p/>', '{\"b\": 2}')"
        )
        assert conn.execute("SELECT count(*) FROM reactor.pending").fetchone() == (2,)
