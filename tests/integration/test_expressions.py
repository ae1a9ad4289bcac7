"""[runs.columns] expressions, and names, as the driver runs them: a % is text, not a placeholder.

The record statements run with psycopg parameters, which read every % as the start of one; the
mapping's expressions and names go into them as text, whatever they hold. And the check that
`reactor migrate` makes of an expression compiles it as one statement, changing nothing.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import psycopg.sql
import pytest

from reactor import db, status
from reactor.errors import ConfigError
from reactor.install import Install, mapping, mapping_file
from reactor.record.recorder import Recorder
from reactor.settings.config import Settings
from reactor.telemetry.metrics import Metrics
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.helpers import IMMUTABLE_BY_ITS_WORD

pytestmark = pytest.mark.anyio

MAPPINGS = Path(__file__).parent.parent / "mappings"
SECOND_SQL = (MAPPINGS / "second.sql").read_text()
SECOND_TOML = (MAPPINGS / "second.toml").read_text()
GRACE = 2.0
OWNER = "7f1c0b4e-2d7a-4d8e-9a51-0c6f3f1a2b3c"
DEFAULT_TITLE = """title = "coalesce(j.title, 'Untitled')\""""


def second_with(tmp_path: Path, title: str, *, report: str = "Report") -> mapping.Mapping:
    """second.toml with ``title`` as its title expression and ``report`` as the runs table."""
    assert DEFAULT_TITLE in SECOND_TOML
    text = SECOND_TOML.replace(DEFAULT_TITLE, f"title = {json.dumps(title)}")
    text = text.replace('table = "app.Report"', f"table = {json.dumps('app.' + report)}")
    path = tmp_path / "second.toml"
    path.write_text(text)
    return mapping_file.load(str(path))


@pytest.fixture
def second_url(empty_database_url: str) -> str:
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(SECOND_SQL)
    return empty_database_url


@asynccontextmanager
async def installed(url: str, shape: mapping.Mapping) -> AsyncIterator[Install]:
    """``shape`` installed by `reactor migrate`, typed by the catalog."""
    async with await db.connect(url, "test") as conn:
        migrated = await db.migrate(conn, shape, channel="second_jobs_terminal")
    yield migrated.install


def add_job(url: str, key: str) -> None:
    """A finished job of ``key`` past its grace, with no title."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            'INSERT INTO app."Job" ("reportKey", state, html, verdicts, "ownerId",'
            ' "updatedAt") VALUES (%s, %s, %s, %s::jsonb, %s,'
            " (now() - interval '10 seconds') AT TIME ZONE 'UTC')",
            (key, "done", "<p>report</p>", json.dumps(["ok"]), OWNER),
        )


def title_of(url: str, key: str, *, report: str = "Report") -> Any:
    with psycopg.connect(url) as conn:
        # Without parameters: psycopg.sql leaves the % of a name as it is.
        query = psycopg.sql.SQL("SELECT title FROM {} WHERE key = {} AND origin = 'system'")
        row = conn.execute(
            query.format(psycopg.sql.Identifier("app", report), psycopg.sql.Literal(key))
        ).fetchone()
    return None if row is None else row[0]


async def drain(install: Install, url: str, hooks: tuple[str, ...] = ()) -> Recorder:
    async with db.make_pool(url, max_size=2) as pool:
        database = db.Database.pooled(install, pool, settings=Settings(grace=GRACE), hooks=hooks)
        recorder = Recorder(database, Metrics())
        await recorder.drain(100)
    return recorder


# %(hooks)s is the record statements' own parameter: read as one, the title would be the hook
# names (or the statement would fail on an array where text belongs).
@pytest.mark.parametrize(
    ("title", "hooks"),
    [("100%", ()), ("%(hooks)s", ("audit",))],
    ids=["a percent is recorded as written", "a placeholder neither binds nor breaks"],
)
async def test_a_percent_in_an_expression_is_written_as_it_stands(
    second_url: str, tmp_path: Path, title: str, hooks: tuple[str, ...]
) -> None:
    shape = second_with(tmp_path, f"coalesce(j.title, '{title}')")
    async with installed(second_url, shape) as install:
        add_job(second_url, "untitled")
        recorder = await drain(install, second_url, hooks=hooks)
        assert recorder.set_aside == {}
        assert title_of(second_url, "untitled") == title


async def test_a_semicolon_inside_a_literal_is_text(second_url: str, tmp_path: Path) -> None:
    shape = second_with(tmp_path, "coalesce(j.title, 'a; b') /* ; */")
    async with installed(second_url, shape) as install:
        add_job(second_url, "semicolon")
        await drain(install, second_url)
        assert title_of(second_url, "semicolon") == "a; b"


async def test_a_percent_in_a_table_name_reaches_every_named_query(
    second_url: str, tmp_path: Path
) -> None:
    # Names are filled into the named queries as the expressions are, and break the same way.
    with psycopg.connect(second_url, autocommit=True) as conn:
        conn.execute('ALTER TABLE app."Report" RENAME TO "Report 100%"')
    shape = second_with(tmp_path, "coalesce(j.title, 'Untitled')", report="Report 100%")
    async with installed(second_url, shape) as install:
        add_job(second_url, "renamed")
        recorder = await drain(install, second_url)
        assert recorder.set_aside == {}
        assert title_of(second_url, "renamed", report="Report 100%") == "Untitled"
        async with await db.connect(second_url, "test", configure_session=False) as conn:
            trigger = await db.Database.dedicated(install, conn).job_trigger()
            assert trigger == db.JobTrigger("second_jobs_terminal", spread=False, enabled=True)
            settings = Settings(database_url=second_url, grace=GRACE)
            report = await status.collect(conn, install, settings)
        assert status.as_json(report)["jobs"]["due"] == 0


async def test_the_check_runs_one_statement_and_changes_nothing(second_url: str) -> None:
    # Past the file's own check (a mapping made in code): the server is sent one statement, so
    # the second one is refused, never run.
    second = mapping_file.load(str(MAPPINGS / "second.toml"))
    pwned = (
        'j.title FROM app."Job" j WHERE false; CREATE TABLE public.pwned AS SELECT 1; '
        "SELECT j.title"
    )
    columns = tuple((c, pwned if c == "title" else e) for c, e in second.runs.columns)
    second = replace(second, runs=replace(second.runs, columns=columns))
    async with await db.connect(second_url, "test") as conn:
        with pytest.raises(ConfigError, match=r"\[runs.columns\] title .* does not compile"):
            await db.fit(conn, second, installing=True)
        cur = await conn.execute("SELECT to_regclass('public.pwned')")
        assert await cur.fetchone() == (None,)


async def test_what_an_expression_tries_to_change_is_refused_and_undone(
    second_url: str, tmp_path: Path
) -> None:
    # The planner folds an immutable function with constant arguments, so compiling an
    # expression may run one; whatever it writes must not stay. A sequence is the hard case:
    # nextval is never rolled back, only a READ ONLY transaction refuses it.
    with psycopg.connect(second_url, autocommit=True) as conn:
        conn.execute(IMMUTABLE_BY_ITS_WORD)
    shape = second_with(tmp_path, "coalesce(j.title, public.stamp('Untitled'))")
    async with await db.connect(second_url, "test") as conn:
        with pytest.raises(ConfigError, match="read-only transaction"):
            await db.fit(conn, shape, installing=True)
    with psycopg.connect(second_url) as conn:
        assert conn.execute("SELECT count(*) FROM public.touched").fetchone() == (0,)
        assert conn.execute("SELECT is_called FROM public.ticks").fetchone() == (False,)


def test_the_commands_record_and_print_percent_signs_as_written(
    second_url: str, tmp_path: Path
) -> None:
    # End to end through the CLI: migrate, a sweep's record statement, and the printed script,
    # which runs without parameters and so keeps each % single.
    with psycopg.connect(second_url, autocommit=True) as conn:
        conn.execute('ALTER TABLE app."Report" RENAME TO "Report 100%"')
    second_with(tmp_path, "coalesce(j.title, '100%')", report="Report 100%")
    env = reactor_env(
        second_url, REACTOR_CONFIG=str(tmp_path / "second.toml"), REACTOR_GRACE_SECONDS="2"
    )
    migrated = run_reactor("migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    add_job(second_url, "swept")
    swept = run_reactor("sweep", "--once", env=env)
    assert (swept.returncode, swept.stdout.strip()) == (0, "1"), swept.stderr
    assert title_of(second_url, "swept", report="Report 100%") == "100%"
    printed = run_reactor("migrate", "--print", env=env)
    assert printed.returncode == 0, printed.stderr
    assert '"app"."Report 100%"' in printed.stdout
    assert "%%" not in printed.stdout
