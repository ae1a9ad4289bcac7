"""Names are resolved, never searched, through the real CLI.

A neighbour with CREATE on the database makes a schema named after the role that runs the
reactor and puts look-alikes of the app's tables in it: the first schema of that role's default
search_path (``"$user", public``). A mapping that names the tables unqualified means public's,
so `reactor migrate` installs on those and every command reads those; a mapped relation that
is not a table, or not the migrate role's, is refused; and a name that finds another table than
the one migrate recorded stops `run` and `sweep`.
"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from reactor.install import sql
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.acceptance.test_trust import as_role, is_superuser, may_create, neighbour, one_line
from tests.conftest import NewRole
from tests.helpers import finish, grant_audit, new_job, reference_toml, run_row
from tests.integration.test_privileges import dsn_as, grant_all

__all__ = ["neighbour"]  # the fixture, used here by name

# The reference mapping, with the tables named as an app's file may name them: unqualified.
UNQUALIFIED = reference_toml("analysis_jobs", "analysis_runs")


@pytest.fixture
def login_role(new_login_role: NewRole) -> str:
    """A fresh LOGIN role, never a superuser."""
    return new_login_role("reactor_rt")


def unqualified_mapping(tmp_path: Path) -> str:
    path = tmp_path / "reactor.toml"
    path.write_text(UNQUALIFIED)
    return str(path)


def reference_app(url: str) -> str:
    """The reference tables made in public by the admin: the admin's name, their owner."""
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(sql.read("reference.sql"))
        row = admin.execute("SELECT current_user::text").fetchone()
    assert row is not None
    return str(row[0])


def runtime_beside_a_neighbour(url: str, runtime: str, neighbour: str) -> None:
    """``runtime`` granted what the reactor needs (writing run_audit too), and ``neighbour``
    free to create schemas, one of them named after ``runtime``."""
    grant_all(url, runtime)
    may_create(url, neighbour)
    with psycopg.connect(url, autocommit=True) as admin:
        grant_audit(admin, runtime)


@pytest.fixture
def runtime(database_url: str, login_role: str, neighbour: str) -> str:
    """The runtime role, beside a neighbour free to create a schema named after it."""
    runtime_beside_a_neighbour(database_url, login_role, neighbour)
    return login_role


def sweep_records_the_one_due_job_as(url: str, role: str) -> None:
    env = reactor_env(dsn_as(url, role), REACTOR_GRACE_SECONDS="0")
    sweep = run_reactor("sweep", "--once", env=env)
    assert sweep.returncode == 0, sweep.stderr
    assert sweep.stdout.strip() == "1"


def triggers_on(conn: psycopg.Connection[tuple[object, ...]], table: str) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal",
        (table,),
    ).fetchone()
    assert row is not None
    return int(str(row[0]))


def test_migrate_installs_on_public_not_on_a_schema_named_after_its_role(
    empty_database_url: str, neighbour: str, tmp_path: Path
) -> None:
    url = empty_database_url
    migrator = reference_app(url)
    may_create(url, neighbour)
    # The look-alikes, in the first schema of the migrate role's search_path.
    with as_role(url, neighbour) as conn:
        conn.execute(f'CREATE SCHEMA "{migrator}"')
        conn.execute(f'SET search_path = "{migrator}"')
        conn.execute(sql.read("reference.sql"))

    result = run_reactor(
        "migrate", env=reactor_env(url, REACTOR_CONFIG=unqualified_mapping(tmp_path))
    )
    assert result.returncode == 0, result.stderr
    with psycopg.connect(url, autocommit=True) as admin:
        assert triggers_on(admin, "public.analysis_jobs") > 0
        assert triggers_on(admin, f'"{migrator}".analysis_jobs') == 0
        assert triggers_on(admin, f'"{migrator}".analysis_runs') == 0
        recorded = admin.execute(
            "SELECT jobs = 'public.analysis_jobs'::regclass,"
            "       runs = 'public.analysis_runs'::regclass FROM reactor.app_tables"
        ).fetchone()
        assert recorded == (True, True)
    # Run as a superuser, migrate says whose tables it installed on.
    assert (
        f"migrated as a superuser: public.analysis_jobs belongs to {migrator}, "
        f"public.analysis_runs belongs to {migrator}"
    ) in result.stdout
    assert not is_superuser(url, neighbour)


def test_a_mapped_view_is_refused_naming_what_it_is(database_url: str, tmp_path: Path) -> None:
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("CREATE VIEW public.jobs_view AS SELECT * FROM analysis_jobs")
    mapping = tmp_path / "reactor.toml"
    mapping.write_text(UNQUALIFIED.replace('"analysis_jobs"', '"jobs_view"'))
    env = reactor_env(database_url, REACTOR_CONFIG=str(mapping))
    for command in (["migrate"], ["migrate", "--print"], ["status"]):
        result = run_reactor(*command, env=env)
        assert result.returncode == 2, (command, result.stderr)
        line = one_line(result)
        assert "jobs_view (jobs.table in REACTOR_CONFIG" in line, line
        assert "is a view, not a table" in line, line


def test_migrate_refuses_a_table_of_another_role_naming_the_owner(
    empty_database_url: str, neighbour: str
) -> None:
    # The app's tables belong to the admin; the neighbour, with CREATE on the database but no
    # membership in the owner, runs migrate.
    url = empty_database_url
    owner = reference_app(url)
    may_create(url, neighbour)
    for command in (["migrate"], ["migrate", "--print"]):
        result = run_reactor(*command, env=reactor_env(dsn_as(url, neighbour)))
        assert result.returncode == 2, (command, result.stderr)
        line = one_line(result)
        assert f"analysis_jobs (jobs.table in the reference mapping) belongs to role {owner}" in (
            line
        ), line
        assert f"run `reactor migrate` as {owner}" in line, line
    with psycopg.connect(url, autocommit=True) as admin:
        assert triggers_on(admin, "public.analysis_jobs") == 0
        assert admin.execute("SELECT to_regnamespace('reactor')").fetchone() == (None,)


# A view named like the job table, in a schema named after the runtime role: whoever reads it
# calls the neighbour's function, which copies what it sees into the neighbour's table.
RUNTIME_PLANT = """
CREATE SCHEMA "{runtime}";
CREATE TABLE "{runtime}".loot (id uuid, doc_html text);
GRANT INSERT ON "{runtime}".loot TO PUBLIC;
CREATE FUNCTION "{runtime}".steal(id uuid, doc text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO "{runtime}".loot VALUES (id, doc);
    RETURN true;
END $$;
CREATE VIEW "{runtime}".analysis_jobs AS
    SELECT j.* FROM public.analysis_jobs j WHERE "{runtime}".steal(j.id, j.doc_html);
GRANT USAGE ON SCHEMA "{runtime}" TO PUBLIC;
GRANT SELECT ON "{runtime}".analysis_jobs TO PUBLIC;
"""


def test_runtime_commands_read_public_not_a_view_named_after_their_role(
    database_url: str, neighbour: str, runtime: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as admin:
        # The view reads the app's jobs with its owner's rights.
        admin.execute(f'GRANT SELECT ON analysis_jobs TO "{neighbour}"')
        job_id, run_id = new_job(admin)
        finish(admin, job_id)
    with as_role(database_url, neighbour) as conn:
        conn.execute(RUNTIME_PLANT.replace("{runtime}", runtime).encode())
    # The plant works: the runtime role's own search_path finds the view.
    with as_role(database_url, runtime) as conn:
        assert conn.execute("SELECT count(*) FROM analysis_jobs").fetchone() == (1,)
    with as_role(database_url, neighbour) as conn:
        assert conn.execute(f'DELETE FROM "{runtime}".loot').rowcount == 1

    env = reactor_env(dsn_as(database_url, runtime), REACTOR_GRACE_SECONDS="0")
    status = run_reactor("status", "--json", env=env)
    assert status.returncode in (0, 1), status.stderr
    assert json.loads(status.stdout)["jobs"]["due"] == 1
    sweep_records_the_one_due_job_as(database_url, runtime)
    with psycopg.connect(database_url, autocommit=True) as admin:
        assert run_row(admin, run_id) == (job_id, "worker")
        assert admin.execute(f'SELECT count(*) FROM "{runtime}".loot').fetchone() == (0,)


def test_a_name_that_finds_another_table_than_migrate_recorded_stops_run_and_sweep(
    database_url: str, login_role: str
) -> None:
    runtime = login_role
    grant_all(database_url, runtime)
    with psycopg.connect(database_url, autocommit=True) as admin:
        # The installed table renamed away, and another made under its name.
        admin.execute("ALTER TABLE analysis_jobs RENAME TO analysis_jobs_before")
        admin.execute("CREATE TABLE analysis_jobs (LIKE analysis_jobs_before INCLUDING ALL)")
        admin.execute(f'GRANT SELECT, UPDATE ON analysis_jobs TO "{runtime}"')
    for url in (database_url, dsn_as(database_url, runtime)):
        env = reactor_env(url, REACTOR_GRACE_SECONDS="0")
        for command in (["sweep", "--once"], ["run"]):
            result = run_reactor(*command, env=env, timeout=30)
            assert result.returncode == 2, (url, command, result.stderr)
            line = one_line(result)
            assert "installed the triggers on analysis_jobs_before" in line, line
            assert "run `reactor migrate`" in line, line


def test_an_app_trigger_calling_an_unqualified_public_function_works_under_the_reactor(
    database_url: str, neighbour: str, runtime: str
) -> None:
    # The app's trigger on its runs table calls note_run() unqualified, as the app's sessions
    # find it: in public. A look-alike in the schema named after the runtime role is never
    # called, because the reactor's sessions search public alone.
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(
            """
            CREATE TABLE public.noted (run_id uuid);
            GRANT INSERT ON public.noted TO PUBLIC;
            CREATE FUNCTION public.note_run(run uuid) RETURNS void LANGUAGE sql
                AS 'INSERT INTO public.noted VALUES (run)';
            CREATE FUNCTION public.app_runs_noted() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM note_run(NEW.id);
                RETURN NEW;
            END $$;
            CREATE TRIGGER app_runs_noted AFTER INSERT ON analysis_runs
                FOR EACH ROW EXECUTE FUNCTION public.app_runs_noted();
            """
        )
        job_id, run_id = new_job(admin)
        finish(admin, job_id)
    with as_role(database_url, neighbour) as conn:
        conn.execute(
            f"""
            CREATE SCHEMA "{runtime}";
            CREATE TABLE "{runtime}".loot (run_id uuid);
            GRANT USAGE ON SCHEMA "{runtime}" TO PUBLIC;
            GRANT INSERT ON "{runtime}".loot TO PUBLIC;
            CREATE FUNCTION "{runtime}".note_run(run uuid) RETURNS void LANGUAGE sql
                AS 'INSERT INTO "{runtime}".loot VALUES (run)';
            """.encode()
        )

    sweep_records_the_one_due_job_as(database_url, runtime)
    with psycopg.connect(database_url, autocommit=True) as admin:
        assert run_row(admin, run_id) == (job_id, "worker")
        assert admin.execute("SELECT run_id FROM public.noted").fetchall() == [(run_id,)]
        assert admin.execute(f'SELECT count(*) FROM "{runtime}".loot').fetchone() == (0,)


@pytest.mark.parametrize("public_creatable", [True, False])
def test_status_names_a_public_schema_every_role_may_create_in(
    database_url: str, public_creatable: bool
) -> None:
    verb = "GRANT" if public_creatable else "REVOKE"
    preposition = "TO" if public_creatable else "FROM"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f"{verb} CREATE ON SCHEMA public {preposition} PUBLIC")
    status = run_reactor("status", "--json", env=reactor_env(database_url))
    risks = json.loads(status.stdout)["risks"]
    named = [risk for risk in risks if "CVE-2018-1058" in risk]
    assert bool(named) == public_creatable, risks
    if public_creatable:
        assert status.returncode == 1
        assert "REVOKE CREATE ON SCHEMA public FROM PUBLIC" in named[0]
