"""SQL the reactor prints for a person to run names the app's objects as the catalog does.

PostgreSQL folds an unquoted name to lower case: a GRANT on SCHEMA MyApp grants on myapp. The
app here keeps the reference tables in a schema "MyApp", under a reactor schema of its own.
"""

from __future__ import annotations

import io
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import psycopg.conninfo
import pytest
from rich.console import Console

from reactor import db, status
from reactor.errors import PrivilegeMissing
from reactor.install import Install, grants, mapping, mapping_file, sql
from reactor.install.quote import quote_ident, readable
from reactor.record.recorder import Recorder
from reactor.settings.config import Settings
from reactor.telemetry.metrics import Metrics
from tests.conftest import Server
from tests.helpers import drop_role, reference_toml

pytestmark = pytest.mark.anyio

TOML = reference_toml("MyApp.Jobs", "MyApp.Runs", reactor_schema="my_reactor")


@pytest.fixture
def my_app(empty_database_url: str, tmp_path: Path) -> tuple[str, mapping.Mapping]:
    """The reference tables as "MyApp"."Jobs" and "MyApp"."Runs", and their mapping."""
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute('CREATE SCHEMA "MyApp"; SET search_path = "MyApp"')
        conn.execute(sql.read("reference.sql"))
        conn.execute('ALTER TABLE analysis_jobs RENAME TO "Jobs"')
        conn.execute('ALTER TABLE analysis_runs RENAME TO "Runs"')
    path = tmp_path / "reactor.toml"
    path.write_text(TOML)
    return empty_database_url, mapping_file.load(str(path))


async def install(url: str, shape: mapping.Mapping) -> Install:
    async with await db.connect(url, "test") as conn:
        migrated = await db.migrate(conn, shape, channel="my_reactor_jobs_terminal")
    return migrated.install


def add_finished_job(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            'INSERT INTO "MyApp"."Jobs" (id, run_id, status, doc_html, results, updated_at)'
            " VALUES (%s, %s, 'complete', '<p/>', %s, now() - interval '1 hour')",
            (uuid.uuid4(), uuid.uuid4(), json.dumps({"a": 1})),
        )


def test_the_quoting_of_a_printed_name() -> None:
    assert readable("app") == "app"
    assert readable("MyApp") == '"MyApp"'
    assert readable("MyApp", "Jobs") == '"MyApp"."Jobs"'
    assert readable("my_reactor", "outranks_v1") == "my_reactor.outranks_v1"
    assert readable("user", "Job") == '"user"."Job"'
    assert readable("public", "analysis_jobs") == "public.analysis_jobs"


# Names beside the keywords: case, digits, $, spaces, quotes, non-ASCII, and words that only
# look like keywords.
ODD_NAMES = [
    "Job",
    "JOBS",
    "job2",
    "2jobs",
    "_jobs",
    "job$",
    "my job",
    'say"hi"',
    "jöbs",
    "",
    "selected",
    "user_id",
    "Select",
]


def test_quote_ident_quotes_as_the_server_does_every_keyword_and_odd_name(
    database_url: str,
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        words = [w for (w,) in conn.execute("SELECT word FROM pg_get_keywords()").fetchall()]
        assert len(words) > 400
        names = [*words, *ODD_NAMES]
        rows = conn.execute(
            "SELECT n, quote_ident(n) FROM unnest(%s::text[]) AS n", (names,)
        ).fetchall()
    differ = {
        name: (quote_ident(name), quoted) for name, quoted in rows if quote_ident(name) != quoted
    }
    assert differ == {}


@pytest.fixture
def my_role(server: Server, my_app: tuple[str, mapping.Mapping]) -> Iterator[str]:
    """A fresh LOGIN role, granted nothing yet in my_app's database; dropped afterwards with
    what it owns and was granted there."""
    if server.embedded is None:
        pytest.skip("needs a server whose authentication we control (trust for a new role)")
    url, _ = my_app
    role = f"reactor_rt_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
    yield role
    with psycopg.connect(url, autocommit=True) as admin:
        drop_role(admin, role)


async def test_the_printed_grants_name_a_mixed_case_schema_as_it_is(
    my_app: tuple[str, mapping.Mapping], my_role: str
) -> None:
    url, shape = my_app
    installed = await install(url, shape)
    # Typed from the catalog, as --print-grants does.
    script = grants.grant_script(my_role, installed.mapping)
    assert 'GRANT USAGE ON SCHEMA "MyApp" TO' in script
    assert "ON FUNCTION my_reactor.outranks_v2(uuid, uuid, text) TO" in script
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(script.encode())
    add_finished_job(url)
    as_role = psycopg.conninfo.make_conninfo(url, user=my_role)
    async with await db.connect(as_role, "test", configure_session=False) as conn:
        await db.Database.dedicated(installed, conn).require_privileges()
    async with db.make_pool(as_role, max_size=2) as pool:
        database = db.Database.pooled(installed, pool)
        drained = await Recorder(database, Metrics()).drain(10)
    assert drained.recorded == 1


async def test_the_startup_check_finds_a_grant_missing_in_a_mixed_case_schema(
    my_app: tuple[str, mapping.Mapping], my_role: str
) -> None:
    url, shape = my_app
    installed = await install(url, shape)
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(grants.grant_script(my_role, installed.mapping).encode())
        admin.execute(f'REVOKE SELECT ON "MyApp"."Jobs" FROM "{my_role}"')
    grant = 'GRANT SELECT ON "MyApp"."Jobs"'
    as_role = psycopg.conninfo.make_conninfo(url, user=my_role)
    async with await db.connect(as_role, "test", configure_session=False) as conn:
        with pytest.raises(PrivilegeMissing, match=re.escape(grant)):
            await db.Database.dedicated(installed, conn).require_privileges()


async def test_status_names_the_statement_that_enables_the_trigger_again(
    my_app: tuple[str, mapping.Mapping],
) -> None:
    url, shape = my_app
    installed = await install(url, shape)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute('ALTER TABLE "MyApp"."Jobs" DISABLE TRIGGER my_reactor_job_update')
    settings = Settings(database_url=url, grace=1.0)
    async with await db.connect(url, "status", configure_session=False) as conn:
        report = await status.collect(conn, installed, settings)
    assert report.trigger_at_risk
    statement = report.enable_trigger
    assert statement == 'ALTER TABLE "MyApp"."Jobs" ENABLE TRIGGER my_reactor_job_update'
    # The operator reads it in `reactor status`'s table.
    console = Console(record=True, width=200, file=io.StringIO())
    status.render(report, console)
    assert f"disabled ({statement})" in console.export_text()
    # And in its plain text, where the cli extra is not installed.
    assert f"disabled ({statement})" in status.plain(report)
    # What it says to run is what enables it.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement.encode())
    async with await db.connect(url, "status", configure_session=False) as conn:
        trigger = await db.Database.dedicated(installed, conn).job_trigger()
        assert trigger == db.JobTrigger("my_reactor_jobs_terminal", spread=False, enabled=True)
