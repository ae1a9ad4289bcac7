"""The reactor's SECURITY DEFINER trigger functions run as the role that ran `reactor migrate`
(often a superuser). No other role may make them run its own SQL with those rights.

The attack these tests play: a role creates a temporary table named like the app's, hangs a
reactor trigger function on it, and next to it a temporary view named like the app's other
table whose column calls a function of the role's own; then it fires the trigger. Were the
definer function to read the app's tables through the trigger table's schema, the role's
function would run as the owner. The role's function tries to create a table: if that table
exists afterwards, the attack worked.

Each role is played twice: as the grants leave it (no EXECUTE on any reactor function), and as a
database whose owner re-granted EXECUTE to PUBLIC, where the functions' own guard must refuse.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import psycopg.errors
import pytest

from reactor.install import grants
from reactor.install.mapping import REFERENCE
from tests.conftest import Server
from tests.helpers import drop_role, finish, new_job

# The app's role, and USAGE on the reactor's schema as well (say, to read `reactor status`): the
# functions' own privileges must hold without the schema's standing in front of them.
APP_GRANTS = """
GRANT USAGE ON SCHEMA public, reactor TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON analysis_jobs, analysis_runs TO {role};
"""

# The role's own function, planted where only its session sees it, and the trap around it.
# The view's id calls it; the temporary analysis_runs table fires a reactor trigger function.
PLANT = """
CREATE FUNCTION pg_temp.evil() RETURNS uuid LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE 'CREATE TABLE public.{marker} (who text DEFAULT current_user)';
    RETURN gen_random_uuid();
END $$;
CREATE TEMPORARY VIEW analysis_jobs AS
    SELECT pg_temp.evil() AS id, gen_random_uuid() AS run_id, 'complete'::text AS status,
           '<p/>'::text AS doc_html, '{{"a": 1}}'::jsonb AS results,
           NULL::timestamptz AS deleted_at, now() AS created_at, now() AS updated_at;
CREATE TEMPORARY TABLE analysis_runs (id uuid, job_id uuid, saved_by text);
"""

# Each reactor trigger function hung on a temporary table of the role's, then fired.
TRAPS = {
    "run_changed_v1": (
        "CREATE TRIGGER trap AFTER DELETE ON pg_temp.analysis_runs FOR EACH ROW "
        "EXECUTE FUNCTION reactor.run_changed_v1('')",
        "INSERT INTO pg_temp.analysis_runs VALUES (gen_random_uuid(), gen_random_uuid(), "
        "'worker'); DELETE FROM pg_temp.analysis_runs",
    ),
    "job_changed_v1": (
        "CREATE TEMPORARY TABLE jobs_trap (id uuid, updated_at timestamptz, status text, "
        "deleted_at timestamptz, doc_html text, results jsonb); "
        "CREATE TRIGGER trap AFTER INSERT ON pg_temp.jobs_trap FOR EACH ROW "
        "EXECUTE FUNCTION reactor.job_changed_v1('')",
        "INSERT INTO pg_temp.jobs_trap VALUES (gen_random_uuid(), now(), 'complete', NULL, "
        "'<p/>', '{\"a\": 1}')",
    ),
    "jobs_deleted_v1": (
        "CREATE TEMPORARY TABLE jobs_trap (id uuid, run_id uuid); "
        "CREATE TRIGGER trap AFTER DELETE ON pg_temp.jobs_trap "
        "REFERENCING OLD TABLE AS reactor_deleted_jobs FOR EACH STATEMENT "
        "EXECUTE FUNCTION reactor.jobs_deleted_v1('')",
        "INSERT INTO pg_temp.jobs_trap VALUES (gen_random_uuid(), gen_random_uuid()); "
        "DELETE FROM pg_temp.jobs_trap",
    ),
}


@pytest.fixture
def roles(server: Server, database_url: str) -> Iterator[dict[str, str]]:
    """The runtime role (what --print-grants prints) and an app role (the app's tables)."""
    if server.embedded is None:
        pytest.skip("needs a server whose authentication we control (trust for a new role)")
    tag = uuid.uuid4().hex[:10]
    made = {"runtime": f"reactor_rt_{tag}", "app": f"reactor_app_{tag}"}
    with psycopg.connect(database_url, autocommit=True) as admin:
        for name in made.values():
            admin.execute(f'CREATE ROLE "{name}" LOGIN')
        admin.execute(grants.grant_script(made["runtime"], REFERENCE.in_public()).encode())
        admin.execute(APP_GRANTS.format(role=f'"{made["app"]}"').encode())
    yield made
    with psycopg.connect(database_url, autocommit=True) as admin:
        for name in made.values():
            drop_role(admin, name)


def _attack(dsn: str, trap: str) -> psycopg.Error | None:
    """Play one trap in a session of the role's; the error that stopped it, if any."""
    create, fire = TRAPS[trap]
    marker = f"pwned_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(PLANT.format(marker=marker).encode())
        try:
            conn.execute(create.encode())
            conn.execute(fire.encode())
        except psycopg.Error as error:
            return error
        finally:
            owned = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"public.{marker}",))
            assert owned.fetchone() == (False,), f"{trap} ran the role's SQL as the owner"
    return None


@pytest.mark.parametrize("trap", sorted(TRAPS))
@pytest.mark.parametrize("who", ["runtime", "app"])
def test_no_role_may_hang_a_reactor_function_on_its_own_table(
    database_url: str, roles: dict[str, str], who: str, trap: str
) -> None:
    dsn = psycopg.conninfo.make_conninfo(database_url, user=roles[who])
    error = _attack(dsn, trap)
    assert isinstance(error, psycopg.errors.InsufficientPrivilege)
    assert "permission denied for function" in str(error)


@pytest.mark.parametrize("trap", sorted(TRAPS))
@pytest.mark.parametrize("who", ["runtime", "app"])
def test_a_reactor_function_refuses_a_table_it_was_not_installed_on(
    database_url: str, roles: dict[str, str], who: str, trap: str
) -> None:
    # A database whose owner handed EXECUTE back to everyone: the guard alone must hold.
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA reactor TO PUBLIC")
    dsn = psycopg.conninfo.make_conninfo(database_url, user=roles[who])
    error = _attack(dsn, trap)
    assert isinstance(error, psycopg.errors.InsufficientPrivilege)
    assert "was called for table" in str(error)


def test_no_reactor_function_is_executable_by_public(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        open_to_all = conn.execute(
            """
            SELECT p.oid::regprocedure::text
              FROM pg_proc p
             WHERE p.pronamespace = 'reactor'::regnamespace
               AND has_function_privilege('public', p.oid, 'EXECUTE')
            """
        ).fetchall()
    assert open_to_all == []


def test_the_app_role_still_finishes_jobs_through_the_triggers(
    database_url: str, roles: dict[str, str]
) -> None:
    # Triggers fire without EXECUTE on their function: the revoke costs the app nothing.
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("DROP TRIGGER run_audit ON analysis_runs")  # the tests' own, not granted
    dsn = psycopg.conninfo.make_conninfo(database_url, user=roles["app"])
    with psycopg.connect(dsn, autocommit=True) as app:
        job_id, run_id = new_job(app)
        finish(app, job_id)
        app.execute(
            "INSERT INTO analysis_runs (id, job_id, results, saved_by) "
            "VALUES (%s, %s, '{}', 'worker')",
            (run_id, job_id),
        )
        app.execute("DELETE FROM analysis_runs WHERE id = %s", (run_id,))  # run_changed_v1
        app.execute("DELETE FROM analysis_jobs WHERE id = %s", (uuid.uuid4(),))  # jobs_deleted
    with psycopg.connect(database_url, autocommit=True) as admin:
        queued = admin.execute("SELECT job_id FROM reactor.pending").fetchall()
    assert queued == [(job_id,)]


def test_a_malformed_queue_limit_setting_never_fails_the_apps_commit(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as app:
        app.execute("SET reactor.notify_queue_limit = '20%'")
        job_id, _ = new_job(app)
        finish(app, job_id)  # raised "invalid input syntax for type double precision" before
        queued = app.execute("SELECT count(*) FROM reactor.pending WHERE job_id = %s", (job_id,))
        row = queued.fetchone()
    assert row == (1,)
