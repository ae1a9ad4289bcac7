"""The install trusts nothing it finds in its schema, through the real CLI.

A neighbour in a shared database (a role with CREATE on it, as every role had on public up to
PostgreSQL 14) plants what the reactor's SECURITY DEFINER job trigger would run with its
owner's rights: a schema of the reactor's name made first, a trigger on reactor.pending, a
function, CREATE granted on the schema. `reactor migrate` refuses each before it changes
anything; `run` and `sweep` refuse to start; `status` names each as a risk.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import psycopg.conninfo
import pytest

from reactor import db
from reactor.install import REFERENCE_INSTALL, sql
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.conftest import Server
from tests.helpers import finish, new_job

# What a neighbour plants: the trigger makes it superuser as whoever inserts into the table.
PLANT = """
CREATE SCHEMA reactor;
CREATE TABLE reactor.pending (job_id uuid PRIMARY KEY, since timestamptz, job_updated_at
    timestamptz);
CREATE FUNCTION reactor.escalate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER ROLE %I SUPERUSER', '{role}');
    RETURN NEW;
END $$;
CREATE TRIGGER escalate AFTER INSERT ON reactor.pending
    FOR EACH ROW EXECUTE FUNCTION reactor.escalate();
"""


@pytest.fixture
def neighbour(server: Server) -> Iterator[str]:
    """A role that may create schemas in the test's databases, as a neighbour in a shared
    database may; never a superuser."""
    if server.embedded is None:
        pytest.skip("needs a server whose authentication we control (trust for a new role)")
    role = f"neighbour_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server.admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
    yield role
    with psycopg.connect(server.admin_dsn, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        # What it owns lives in the test's database, dropped after this: the role stays in the
        # test server until then, which only this test knows by name.
        with contextlib.suppress(psycopg.errors.DependentObjectsStillExist):
            admin.execute(f'DROP ROLE "{role}"')


def as_role(url: str, role: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(psycopg.conninfo.make_conninfo(url, user=role), autocommit=True)


def is_superuser(url: str, role: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    assert row is not None
    return bool(row[0])


def may_create(url: str, role: str) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            "DO $$ BEGIN EXECUTE format('GRANT CREATE ON DATABASE %I TO %I', "
            f"current_database(), '{role}'); END $$"
        )


def one_line(result: object) -> str:
    stderr = str(getattr(result, "stderr", ""))
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_a_schema_planted_before_the_first_install_is_refused(
    empty_database_url: str, neighbour: str
) -> None:
    url = empty_database_url
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(sql.read("reference.sql"))
        admin.execute(f'GRANT INSERT, UPDATE ON analysis_jobs TO "{neighbour}"')
    may_create(url, neighbour)
    with as_role(url, neighbour) as conn:
        conn.execute(PLANT.replace("{role}", neighbour))

    result = run_reactor("migrate", env=reactor_env(url))
    assert result.returncode == 2, result.stderr
    line = one_line(result)
    assert f"schema reactor exists and belongs to role {neighbour}" in line
    # Nothing was installed: no trigger on the app's table, no definer function to run it.
    with psycopg.connect(url, autocommit=True) as admin:
        assert admin.execute(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'analysis_jobs'::regclass"
        ).fetchone() == (0,)
        job, _ = new_job(admin)
        finish(admin, job)
    assert not is_superuser(url, neighbour)

    # The printed script, applied by a migration tool, refuses the same way.
    script = db.migration_script(REFERENCE_INSTALL, reference_schema=False)
    with psycopg.connect(url, autocommit=True) as admin:
        with pytest.raises(psycopg.errors.RaiseException, match="belongs to role"):
            admin.execute(script.split(db.OUTSIDE_TRANSACTION)[0].encode())
        admin.execute("ROLLBACK")
        assert admin.execute(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'reactor'::regnamespace"
        ).fetchone() == (1,)  # the neighbour's alone


def test_the_schema_is_made_fresh_and_grants_create_to_nobody(empty_database_url: str) -> None:
    url = empty_database_url
    result = run_reactor("migrate", "--reference-schema", env=reactor_env(url))
    assert result.returncode == 0, result.stderr
    with psycopg.connect(url, autocommit=True) as admin:
        made_by_me = admin.execute(
            "SELECT nspowner = (SELECT oid FROM pg_roles WHERE rolname = current_user) "
            "FROM pg_namespace WHERE nspname = 'reactor'"
        ).fetchone()
        assert made_by_me == (True,)
        others_may_create = admin.execute(
            "SELECT count(*) FROM pg_namespace n, aclexplode(n.nspacl) a "
            "WHERE n.nspname = 'reactor' AND a.privilege_type = 'CREATE' "
            "AND a.grantee <> n.nspowner"
        ).fetchone()
        assert others_may_create == (0,)


@pytest.mark.parametrize(
    ("plant", "named"),
    [
        ("GRANT CREATE ON SCHEMA reactor TO {role}", "may create objects in it"),
        (
            "CREATE FUNCTION reactor.helper() RETURNS int LANGUAGE sql AS 'SELECT 1';"
            "ALTER FUNCTION reactor.helper() OWNER TO {role}",
            "function reactor.helper()",
        ),
        (
            "CREATE FUNCTION public.noop() RETURNS trigger LANGUAGE plpgsql AS "
            "'BEGIN RETURN NEW; END';"
            "CREATE TRIGGER planted AFTER INSERT ON reactor.pending "
            "FOR EACH ROW EXECUTE FUNCTION public.noop()",
            "trigger planted on reactor.pending",
        ),
        (
            "CREATE RULE planted AS ON INSERT TO reactor.set_aside DO ALSO NOTIFY x",
            "rule planted on reactor.set_aside",
        ),
        (
            "CREATE POLICY planted ON reactor.hook_outbox USING (true)",
            "policy planted on reactor.hook_outbox",
        ),
        (
            "CREATE TABLE public.watcher (job uuid REFERENCES reactor.pending (job_id) "
            "ON DELETE CASCADE)",
            "foreign key",
        ),
    ],
    ids=["create-grant", "function", "trigger", "rule", "policy", "foreign-key"],
)
def test_what_another_made_in_the_schema_stops_every_command(
    database_url: str, neighbour: str, plant: str, named: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(plant.replace("{role}", f'"{neighbour}"').encode())
    env = reactor_env(database_url, REACTOR_GRACE_SECONDS="1")

    for command in (["migrate"], ["sweep", "--once"], ["run"]):
        result = run_reactor(*command, env=env, timeout=30)
        assert result.returncode == 2, (command, result.stderr)
        line = one_line(result)
        assert named in line, line
        assert "nothing runs until it is gone" in line

    status = run_reactor("status", "--json", env=env)
    assert status.returncode == 1, status.stderr
    risks = json.loads(status.stdout)["risks"]
    assert any(named in risk for risk in risks), risks

    # The printed script refuses too, in its first transaction, before it changes anything.
    script = db.migration_script(
        REFERENCE_INSTALL, reference_schema=False, applied=sql.latest_version()
    )
    with (
        psycopg.connect(database_url, autocommit=True) as admin,
        pytest.raises(psycopg.errors.RaiseException, match=re.escape(named)),
    ):
        admin.execute(script.split(db.OUTSIDE_TRANSACTION)[0].encode())


def test_reactor_schema_may_not_be_a_shared_or_the_apps_schema(
    database_url: str, tmp_path: Path
) -> None:
    folder = tmp_path
    for schema, said in (
        ("public", "a schema other roles create in"),
        ("pg_reactor", "a schema other roles create in"),
        ("information_schema", "a schema other roles create in"),
    ):
        config = folder / f"{schema}.toml"
        config.write_text(f'reactor_schema = "{schema}"\n')
        result = run_reactor("migrate", env=reactor_env(database_url, REACTOR_CONFIG=str(config)))
        assert result.returncode == 2, result.stderr
        assert said in one_line(result)
    # The app's own schema: tables mapped into it by name.
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("CREATE SCHEMA app")
        admin.execute("ALTER TABLE analysis_jobs SET SCHEMA app")
    config = folder / "app.toml"
    config.write_text('reactor_schema = "app"\n[jobs]\ntable = "app.analysis_jobs"\n')
    result = run_reactor("migrate", env=reactor_env(database_url, REACTOR_CONFIG=str(config)))
    assert result.returncode == 2, result.stderr
    assert "the reactor needs a schema of its own" in one_line(result)
