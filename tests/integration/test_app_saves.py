"""The app's own save as the app already writes it: ``[runs] app_saves = "plain"``.

On tests/mappings/onetoone.sql (Django's one-to-one report) and on the reference tables (a run
several jobs share). The reactor records a report after the grace; then the app saves it the way
an ORM does, with a plain INSERT (its ``create``) or an upsert that leaves saved_by alone. The
app's row must win, be told apart from the reactor's, and give the ORM the row count and
RETURNING it expects. Without the key (the default) the plain INSERT fails on the key, as it
always did.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace
from typing import Any

import psycopg
import psycopg.errors
import pytest

from reactor.errors import ConfigError
from reactor.install.mapping import REFERENCE, Mapping
from tests.helpers import Conn, finish, new_job
from tests.integration.support import column
from tests.integration.test_onetoone import ONETOONE, ONETOONE_SQL, add, drain, migrate
from tests.polling import wait_for

pytestmark = pytest.mark.anyio


def plain(mapping: Mapping) -> Mapping:
    """``mapping`` with the app saving plainly."""
    return replace(mapping, runs=replace(mapping.runs, app_saves="plain"))


# Django's create of the report (ExportReport.objects.create), as it sends it: no RETURNING,
# since the primary key is the export's; and the same with RETURNING, as Rails and GORM read
# their id back.
CREATE = (
    'INSERT INTO "app"."export_reports" ("export_id", "body", "summary", "owner_id", '
    '"written_at") VALUES (%s, %s, %s::jsonb, %s, now())'
)
CREATE_RETURNING = CREATE + ' RETURNING "app"."export_reports"."export_id"'
# bulk_create(update_conflicts=True) naming the columns it updates, saved_by not among them.
UPSERT = (
    CREATE + ' ON CONFLICT("export_id") DO UPDATE SET "body" = EXCLUDED."body", '
    '"summary" = EXCLUDED."summary"'
)


@pytest.fixture
def onetoone_url(empty_database_url: str) -> str:
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(ONETOONE_SQL)
    return empty_database_url


def report(conn: Conn, export: int) -> tuple[Any, ...] | None:
    return conn.execute(
        "SELECT body, summary, saved_by FROM app.export_reports WHERE export_id = %s", (export,)
    ).fetchone()


async def recorded(url: str, mapping: Mapping) -> int:
    """An export the reactor recorded after its grace, on ``mapping`` migrated."""
    install = (await migrate(url, mapping)).install
    with psycopg.connect(url, autocommit=True) as conn:
        export = add(conn)
    assert await drain(install, url) == 1
    with psycopg.connect(url, autocommit=True) as conn:
        assert report(conn, export) == ("<p>export</p>", ["ok"], "worker")
    return export


async def test_without_the_key_a_plain_create_fails_on_the_reactors_row(onetoone_url: str) -> None:
    export = await recorded(onetoone_url, ONETOONE)
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(CREATE, (export, "mine", '["tab"]', 7))
        assert report(conn, export) == ("<p>export</p>", ["ok"], "worker")


@pytest.mark.parametrize("statement", [CREATE, CREATE_RETURNING, UPSERT])
async def test_the_apps_save_over_the_reactors_row_is_the_apps(
    onetoone_url: str, statement: str
) -> None:
    mapping = plain(ONETOONE)
    export = await recorded(onetoone_url, mapping)
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        cur = conn.execute(statement, (export, "mine", '["tab"]', 7))
        # What the ORM reads back: one row inserted, and the key it asked for.
        assert cur.rowcount == 1
        if "RETURNING" in statement:
            assert cur.fetchall() == [(export,)]
        # The app's model does not know saved_by: NULL, the client's.
        assert report(conn, export) == ("mine", ["tab"], None)
        # The export is retried and finishes again: the client's row stands.
        conn.execute("UPDATE app.exports SET state = 'running' WHERE id = %s", (export,))
        conn.execute(
            "UPDATE app.exports SET state = 'done', updated_at = now() - interval '10 s' "
            "WHERE id = %s",
            (export,),
        )
    install = (await migrate(onetoone_url, mapping)).install
    assert await drain(install, onetoone_url) == 0
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        assert report(conn, export) == ("mine", ["tab"], None)


async def test_a_save_before_the_reactor_writes_is_a_plain_insert(onetoone_url: str) -> None:
    install = (await migrate(onetoone_url, plain(ONETOONE))).install
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        export = add(conn)
        cur = conn.execute(CREATE_RETURNING, (export, "mine", '["tab"]', 7))
        assert (cur.rowcount, cur.fetchall()) == (1, [(export,)])
        # A second create of the same report is the app's own mistake, refused as ever.
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(CREATE, (export, "again", '["tab"]', 7))
    assert await drain(install, onetoone_url) == 0
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        assert report(conn, export) == ("mine", ["tab"], None)


async def test_the_apps_update_of_the_reactors_row_makes_it_the_clients(
    onetoone_url: str,
) -> None:
    export = await recorded(onetoone_url, plain(ONETOONE))
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        # An ORM's save() of the row it loaded writes every column back, saved_by as it read it.
        cur = conn.execute(
            "UPDATE app.export_reports SET body = 'edited', saved_by = 'worker' "
            "WHERE export_id = %s",
            (export,),
        )
        assert cur.rowcount == 1
        assert report(conn, export) == ("edited", ["ok"], "client")


async def test_the_reactors_replacement_of_its_own_row_stays_the_workers(
    database_url: str,
) -> None:
    # A re-analysis on the reference tables: the later job's write replaces the earlier job's
    # worker row through the record statement's ON CONFLICT, an update the app did not make.
    install = (await migrate(database_url, plain(REFERENCE.in_public()))).install
    with psycopg.connect(database_url, autocommit=True) as conn:
        first, run = new_job(conn, created_age=30.0, age=20.0)
        finish(conn, first, age=20.0)
    assert await drain(install, database_url) == 1
    with psycopg.connect(database_url, autocommit=True) as conn:
        later, _ = new_job(conn, run_id=run, created_age=10.0, age=10.0)
        finish(conn, later, age=10.0)
    assert await drain(install, database_url) == 1
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT job_id, saved_by FROM analysis_runs WHERE id = %s", (run,)
        ).fetchone()
    assert row == (later, "worker")


async def test_a_save_waits_for_the_reactors_write_in_flight(onetoone_url: str) -> None:
    await migrate(onetoone_url, plain(ONETOONE))
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        export = add(conn)
    failed: list[BaseException] = []
    saved: list[Any] = []
    with (
        psycopg.connect(onetoone_url) as reactor,
        psycopg.connect(onetoone_url, autocommit=True) as watcher,
    ):
        # The reactor's statement, cut in two: its claim holds the job row, its write is in.
        reactor.execute("SELECT 1 FROM app.exports WHERE id = %s FOR NO KEY UPDATE", (export,))
        reactor.execute(
            "INSERT INTO app.export_reports (export_id, body, summary, owner_id, written_at, "
            "saved_by) VALUES (%s, 'w', '[\"w\"]', 7, now(), 'worker')",
            (export,),
        )

        def save() -> None:
            try:
                with psycopg.connect(onetoone_url, autocommit=True) as tab:
                    cur = tab.execute(CREATE_RETURNING, (export, "mine", '["tab"]', 7))
                    saved.append((cur.rowcount, cur.fetchall()))
            except BaseException as error:  # the thread's outcome, asserted below
                failed.append(error)

        tab = threading.Thread(target=save)
        tab.start()
        wait_for(
            lambda: watcher.execute(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE 'INSERT INTO \"app\".%%'"
            ).fetchone(),
            10,
            "the tab's save waiting for the reactor's write",
        )
        reactor.commit()
        tab.join(10)
    assert failed == []
    assert saved == [(1, [(export,)])]
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        assert report(conn, export) == ("mine", ["tab"], None)


@pytest.mark.parametrize("granted", [True, False])
async def test_the_apps_role_saves_with_the_rights_of_its_own_delete(
    onetoone_url: str, granted: bool
) -> None:
    # The save deletes the reactor's row and locks the job rows as the app's role: it needs
    # DELETE on the artifact table and UPDATE on the job table, as an app's role has; without
    # them the save fails loudly, and the reactor's row stands.
    export = await recorded(onetoone_url, plain(ONETOONE))
    role = f"tab_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(onetoone_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"GRANT USAGE ON SCHEMA app TO {role}")
        admin.execute(f"GRANT SELECT ON app.exports, app.export_reports TO {role}")
        admin.execute(f"GRANT INSERT ON app.export_reports TO {role}")
        if granted:
            admin.execute(f"GRANT UPDATE ON app.exports TO {role}")
            admin.execute(f"GRANT DELETE ON app.export_reports TO {role}")
    try:
        as_tab = psycopg.conninfo.make_conninfo(onetoone_url, user=role)
        with psycopg.connect(as_tab, autocommit=True) as tab:
            if granted:
                assert tab.execute(CREATE, (export, "mine", '["tab"]', 7)).rowcount == 1
            else:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    tab.execute(CREATE, (export, "mine", '["tab"]', 7))
        with psycopg.connect(onetoone_url, autocommit=True) as conn:
            expected = ("mine", ["tab"], None) if granted else ("<p>export</p>", ["ok"], "worker")
            assert report(conn, export) == expected
    finally:
        with psycopg.connect(onetoone_url, autocommit=True) as admin:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


async def test_the_apps_triggers_see_the_delete_as_the_apps(onetoone_url: str) -> None:
    # An app's trigger on the artifact table that names its table unqualified, through the
    # session's search_path, as most do: it fires for the replaced row as for any delete.
    export = await recorded(onetoone_url, plain(ONETOONE))
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        conn.execute(
            """
            CREATE TABLE app.report_log (export_id bigint, op text, who text);
            CREATE FUNCTION app.log_report() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO report_log VALUES (OLD.export_id, TG_OP, current_user);
                RETURN NULL;
            END $$;
            CREATE TRIGGER log_report AFTER DELETE ON app.export_reports
                FOR EACH ROW EXECUTE FUNCTION app.log_report();
            """
        )
        conn.execute("SET search_path = app, public")
        assert conn.execute(CREATE, (export, "mine", '["tab"]', 7)).rowcount == 1
        (me,) = conn.execute("SELECT current_user").fetchone() or (None,)
        logged = conn.execute("SELECT export_id, op, who FROM app.report_log").fetchall()
    assert logged == [(export, "DELETE", me)]


def triggers(conn: Conn) -> list[str]:
    return column(
        conn,
        "SELECT tgname FROM pg_trigger WHERE tgrelid = 'app.export_reports'::regclass "
        "AND tgname LIKE 'reactor%%' ORDER BY tgname",
    )


async def test_migrate_installs_the_triggers_only_while_the_mapping_asks(
    onetoone_url: str,
) -> None:
    await migrate(onetoone_url, plain(ONETOONE))
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        assert {"reactor_app_save", "reactor_app_update", "reactor_worker_save"} <= set(
            triggers(conn)
        )
    await migrate(onetoone_url, ONETOONE)
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        assert triggers(conn) == [
            "reactor_run_delete",
            "reactor_run_update",
            "reactor_runs_truncate",
        ]
        functions = conn.execute(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'reactor'::regnamespace "
            "AND proname IN ('app_save_v1', 'worker_save_v1')"
        ).fetchone()
    assert functions == (0,)


@pytest.mark.parametrize("action", ["CASCADE", "NO ACTION"])
async def test_migrate_refuses_plain_where_a_foreign_key_references_the_artifact(
    onetoone_url: str, action: str
) -> None:
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE app.report_notes (id serial PRIMARY KEY, export_id bigint "
            f"REFERENCES app.export_reports (export_id) ON DELETE {action})"
        )
    with pytest.raises(ConfigError) as refused:
        await migrate(onetoone_url, plain(ONETOONE))
    message = str(refused.value)
    assert 'runs.app_saves = "plain"' in message
    assert f"report_notes_export_id_fkey of app.report_notes references it (ON DELETE {action}" in (
        message
    )
    assert "ON CONFLICT (export_id) DO UPDATE" in message
    # The default stands there, as before.
    await migrate(onetoone_url, ONETOONE)


async def test_the_save_function_acts_for_the_mapped_table_alone(onetoone_url: str) -> None:
    # Hung on another table (EXECUTE handed back to everyone), it leaves the reactor's rows be.
    export = await recorded(onetoone_url, plain(ONETOONE))
    with psycopg.connect(onetoone_url, autocommit=True) as conn:
        conn.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA reactor TO PUBLIC")
        conn.execute("CREATE TEMPORARY TABLE export_reports (export_id bigint, saved_by text)")
        conn.execute(
            "CREATE TRIGGER trap BEFORE INSERT ON pg_temp.export_reports FOR EACH ROW "
            "EXECUTE FUNCTION reactor.app_save_v1()"
        )
        conn.execute("INSERT INTO pg_temp.export_reports VALUES (%s, NULL)", (export,))
        assert report(conn, export) == ("<p>export</p>", ["ok"], "worker")
