"""The reactor's correctness does not depend on the session defaults a database or role hands
out: isolation level, read-only default and timeouts are pinned in every transaction.

The role here is as hostile as a managed server's settings get: ``serializable`` by default,
read-only by default, and a lock timeout of a millisecond.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import anyio
import psycopg
import psycopg.errors
import pytest
from psycopg.rows import tuple_row

from reactor import db
from reactor.install import REFERENCE_INSTALL
from tests import pgbouncer as bouncer
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.conftest import Server
from tests.helpers import Conn, drop_role, finish, grant_audit, new_job, run_row, worker_writes
from tests.integration.support import app_and_a_tab
from tests.integration.test_privileges import dsn_as, grant_all
from tests.integration.test_stuck import lock_waiter
from tests.polling import eventually

pytestmark = pytest.mark.anyio

DEFAULTS = {
    "default_transaction_isolation": "serializable",
    "default_transaction_read_only": "on",
    "lock_timeout": "1ms",
}


@pytest.fixture
def hostile_role(server: Server, database_url: str) -> Iterator[str]:
    """A role with every grant the reactor needs and the session defaults above.

    Its name is fixed, so the test PgBouncer's auth file can let it in.
    """
    if server.embedded is None:
        pytest.skip("needs a server whose authentication we control (trust for a new role)")
    name = bouncer.HOSTILE_ROLE
    with psycopg.connect(database_url, autocommit=True) as admin:
        # One left by an interrupted run is set up afresh below.
        with contextlib.suppress(psycopg.errors.DuplicateObject):
            admin.execute(f'CREATE ROLE "{name}" LOGIN')
        for setting, value in DEFAULTS.items():
            admin.execute(f"ALTER ROLE \"{name}\" SET {setting} = '{value}'")
        grant_audit(admin, name)
    grant_all(database_url, name)
    yield name
    with psycopg.connect(database_url, autocommit=True) as admin:
        drop_role(admin, name)


@pytest.fixture(params=["direct", "pgbouncer"])
async def database(
    request: pytest.FixtureRequest, database_url: str, hostile_role: str
) -> AsyncIterator[db.Database]:
    """The reactor's statements as the hostile role, straight to the server or through the
    pooler (where its settings cannot be set for the session)."""
    dsn = dsn_as(database_url, hostile_role)
    if request.param == "pgbouncer":
        dsn = request.getfixturevalue("pgbouncer").dsn_for(dsn)
    async with db.make_pool(dsn, max_size=2) as pool:
        yield db.Database.pooled(REFERENCE_INSTALL, pool)


def test_the_role_really_has_those_defaults(database_url: str, hostile_role: str) -> None:
    with psycopg.connect(dsn_as(database_url, hostile_role), autocommit=True) as conn:
        for setting, value in DEFAULTS.items():
            assert conn.execute(f"SHOW {setting}").fetchone() == (value,)


async def test_a_write_racing_a_tab_save_is_settled_not_a_serialization_failure(
    database_url: str, database: db.Database
) -> None:
    # The tab saves the run while the reactor's upsert of it waits: under READ COMMITTED the
    # upsert re-checks the committed client row and yields; under SERIALIZABLE it fails with
    # "could not serialize access due to concurrent update".
    with app_and_a_tab(database_url) as (app, tab):
        job_id, run_id = new_job(app)
        finish(app, job_id)
        tab.execute(
            "INSERT INTO analysis_runs (id, job_id, doc_html, results, saved_by) "
            "SELECT run_id, id, doc_html, results, 'client' FROM analysis_jobs WHERE id = %s",
            (job_id,),
        )
        outcomes = []

        async def record() -> None:
            outcomes.extend(await database.record_jobs([str(job_id)]))

        async with anyio.create_task_group() as tg:
            tg.start_soon(record)
            await eventually(lambda: lock_waiter(app), timeout=10)
            tab.commit()
        assert [o.outcome for o in outcomes] == ["superseded"]
        assert run_row(app, run_id) == (job_id, "client")
        assert worker_writes(app) == []


async def test_the_reactor_records_and_hooks_as_that_role(
    database_url: str, hostile_role: str, database: db.Database
) -> None:
    with psycopg.connect(database_url, autocommit=True) as app:
        job_id, run_id = new_job(app)
        finish(app, job_id)
        assert [o.outcome for o in await database.record_oldest(10)] == ["recorded"]
        assert run_row(app, run_id) == (job_id, "worker")
        # The other statements of a running reactor, as that role, one by one.
        assert await database.upcoming(10) == []
        check = db.HealthCheck("test", 15.0, 86400.0)
        assert (await database.health(check, probe="probe:x")).oldest_overdue == 0
        assert await database.claim_hooks(10, 60) == []
        await database.notify("ping", "reactor_session_defaults")


def test_sweep_and_status_as_that_role(database_url: str, hostile_role: str, app: Conn) -> None:
    for _ in range(3):
        finish(app, new_job(app)[0])
    env = reactor_env(dsn_as(database_url, hostile_role), REACTOR_GRACE_SECONDS="0")
    result = run_reactor("sweep", "--once", env=env)
    assert (result.returncode, result.stdout.strip()) == (0, "3"), result.stderr
    result = run_reactor("status", "--json", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(worker_writes(app)) == 3


@pytest.fixture
def app(database_url: str) -> Iterator[Conn]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


def test_the_precedence_rule_reads_the_app_table_whatever_the_search_path(app: Conn) -> None:
    # The caller's search_path may not name the app's schema at all (or may put a temporary
    # table of the same name first): the function carries its own.
    earlier, _ = new_job(app)
    later, _ = new_job(app)
    with app.transaction():
        app.execute("SET LOCAL search_path = pg_catalog")
        app.execute(
            "CREATE TEMP TABLE analysis_jobs (id uuid, created_at timestamptz) ON COMMIT DROP"
        )
        rows = app.execute(
            "SELECT reactor.outranks_v2(%s, %s, 'worker'), reactor.outranks_v2(%s, %s, 'worker')",
            (later, earlier, earlier, later),
        ).fetchone()
    assert rows == (True, False)


async def test_every_session_searches_public_alone(
    database_url: str, hostile_role: str, database: db.Database
) -> None:
    # Not "$user", public: a schema named after the role is what a neighbour can create. A
    # pooled call sees it on a session of its own and, LOCAL, behind the pooler.
    seen = await database.on.fetch("SELECT current_setting('search_path')", None, tuple_row)
    assert seen == [("public",)]
    # A command's own connection, which sets nothing else for the session.
    async with await db.connect(
        dsn_as(database_url, hostile_role), "status", configure_session=False
    ) as conn:
        cur = await conn.execute("SELECT current_setting('search_path')")
        assert await cur.fetchone() == ("public",)
