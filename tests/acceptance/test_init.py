"""``reactor init`` on the app schemas of tests/apps/: the candidates listed, the drafts, the
checks of ``reactor migrate`` on them, and the runtime role's SQL applied."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.acceptance.conftest import reactor_env, run_reactor

APPS = Path(__file__).parent.parent / "apps"


@dataclass(frozen=True)
class App:
    """One schema of the corpus, and what the draft for it must say."""

    name: str
    jobs: str
    runs: str
    terminal: str  # what --terminal confirms
    one_to_one: bool
    # Keys the draft must hold, by section, with their values; None: the key must be absent.
    expected: dict[str, dict[str, Any]] = field(default_factory=dict)

    def flags(self) -> tuple[str, ...]:
        """The flags that name its pair."""
        return ("--jobs", self.jobs, "--runs", self.runs)

    def load(self, url: str) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute((APPS / f"{self.name}.sql").read_text())


DJANGO = App(
    "django",
    "app_exports",
    "app_exportreport",
    "done,error",
    True,
    {
        "jobs": {
            "id": "id",
            "run": "id",
            "status": "status",
            "terminal": ["done", "error"],
            "created_at": None,
            "not_null": ["result"],
            "time_zone": None,
        },
        "runs": {"key": "export_id", "job": "export_id", "saved_by": "saved_by"},
        "runs.columns": {"result": "j.result", "owner_id": "j.owner_id", "created_at": "now()"},
    },
)
RAILS = App(
    "rails",
    "exports",
    "export_reports",
    "2,3",
    True,
    {
        "jobs": {
            "run": "id",
            "terminal": [2, 3],
            "created_at": None,
            "time_zone": "UTC",
            "not_null": ["payload"],
        },
        "runs": {"key": "export_id", "job": "export_id"},
        "runs.columns": {
            "payload": "j.payload",
            "created_at": "now() AT TIME ZONE 'UTC'",
            "updated_at": "now() AT TIME ZONE 'UTC'",
        },
    },
)
PRISMA = App(
    "prisma",
    "Job",
    "Report",
    "SUCCEEDED,FAILED",
    True,
    {
        "jobs": {
            "table": "Job",
            "run": "id",
            "status": "status",
            "terminal": ["SUCCEEDED", "FAILED"],
            "updated_at": "updatedAt",
            "created_at": None,
            "time_zone": "UTC",
        },
        "runs": {"key": "jobId", "job": "jobId"},
        "runs.columns": {"id": "gen_random_uuid()::text", "output": "j.output"},
    },
)
SQLALCHEMY = App(
    "sqlalchemy",
    "jobs",
    "job_results",
    "complete,failed",
    True,
    {
        "jobs": {"run": "id", "deleted_at": "deleted_at", "created_at": None},
        "runs": {"key": "job_id", "job": "job_id", "saved_by": "saved_by"},
        "runs.columns": {"result": "j.result"},
    },
)
HANDWRITTEN = App(
    "handwritten",
    "work.tasks",
    "work.reports",
    "complete,failed",
    False,
    {
        "jobs": {
            "table": "work.tasks",
            "run": "report_id",
            "status": "state",
            "created_at": "created_at",
            "deleted_at": "deleted_at",
            "not_null": ["findings"],
        },
        "runs": {"key": "id", "job": "task_id", "client": ["client"], "worker": "worker"},
        "runs.columns": {"body": "j.body", "findings": "j.findings", "updated_at": "now()"},
    },
)
CORPUS = [DJANGO, RAILS, PRISMA, SQLALCHEMY, HANDWRITTEN]
# The drafts db.fit accepts as they stand today; Rails' integer status and Prisma's job table
# without created_at wait for one-to-one mappings and integer status in db.fit.
MIGRATES = [DJANGO, SQLALCHEMY, HANDWRITTEN]
AWAITS_FIT = [RAILS, PRISMA]


def _by_name(apps: list[App]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("app", apps, ids=[app.name for app in apps])


def _init(url: str, *args: str, **variables: str) -> Any:
    return run_reactor("init", *args, env=reactor_env(url, **variables))


@_by_name(CORPUS)
def test_without_names_it_lists_the_pair_and_asks_for_the_choice(
    empty_database_url: str, app: App
) -> None:
    app.load(empty_database_url)
    result = _init(empty_database_url)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    listed = [line.strip() for line in result.stderr.splitlines() if "reactor init --jobs" in line]
    assert len(listed) == 1, result.stderr
    assert listed[0].startswith(f"reactor init --jobs {app.jobs} --runs {app.runs} ")
    assert ("one-to-one" in listed[0]) == app.one_to_one


@_by_name(CORPUS)
def test_the_draft_proposes_the_keys_of_the_schema(empty_database_url: str, app: App) -> None:
    app.load(empty_database_url)
    result = _init(empty_database_url, *app.flags(), "--terminal", app.terminal)
    assert "Traceback" not in result.stderr
    drafted = tomllib.loads(result.stdout)
    for section, keys in app.expected.items():
        table = drafted
        for part in section.split("."):
            table = table[part]
        for key, value in keys.items():
            if value is None:
                assert key not in table, (section, key, result.stdout)
            else:
                assert table.get(key) == value, (section, key, result.stdout)
    if app.one_to_one:
        assert drafted["runs"]["key"] == drafted["runs"]["job"]
        assert drafted["jobs"]["run"] == drafted["jobs"]["id"]


def _migrates_as_it_stands(url: str, app: App, tmp_path: Path) -> None:
    """init -o FILE exits 0, migrate installs it, init --role prints SQL that applies, and the
    role it made passes `reactor status`'s privilege checks."""
    app.load(url)
    path = tmp_path / "reactor.toml"
    result = _init(url, *app.flags(), "--terminal", app.terminal, "-o", str(path))
    assert result.returncode == 0, result.stderr
    assert "# TODO" not in path.read_text()
    assert "reactor migrate" in result.stderr
    assert "--role" in result.stderr
    config = {"REACTOR_CONFIG": str(path)}
    migrated = run_reactor("migrate", env=reactor_env(url, **config))
    assert migrated.returncode == 0, migrated.stderr
    # A first install ends naming the newcomer's next two steps; an upgrade does not.
    assert migrated.stdout.splitlines()[-2:] == [
        'next, as the owner: reactor init --role reactor_rt | psql "$DATABASE_URL"',
        "then: reactor run, with DATABASE_URL logging in as reactor_rt",
    ]
    again = run_reactor("migrate", env=reactor_env(url, **config))
    assert again.returncode == 0, again.stderr
    assert "reactor init --role" not in again.stdout
    role = _init(url, "--role", "reactor_rt", **config)
    assert role.returncode == 0, role.stderr
    assert "CREATE ROLE" in role.stdout
    assert "GRANT" in role.stdout
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(role.stdout)
        # Applied twice, as a re-run of the newcomer's steps would: the role is kept.
        conn.execute(role.stdout)
    as_role = psycopg.conninfo.make_conninfo(url, user="reactor_rt")
    status = run_reactor("status", env=reactor_env(as_role, **config))
    assert status.returncode == 0, status.stderr + status.stdout


@_by_name(MIGRATES)
def test_a_confirmed_draft_migrates_and_its_role_applies(
    empty_database_url: str, app: App, tmp_path: Path
) -> None:
    _migrates_as_it_stands(empty_database_url, app, tmp_path)


@_by_name(AWAITS_FIT)
def test_the_drafts_of_integer_status_and_no_created_at_migrate(
    empty_database_url: str, app: App, tmp_path: Path
) -> None:
    _migrates_as_it_stands(empty_database_url, app, tmp_path)


def test_guessed_terminal_values_are_a_todo(empty_database_url: str) -> None:
    DJANGO.load(empty_database_url)
    result = _init(empty_database_url, *DJANGO.flags())
    assert result.returncode == 2, result.stderr
    drafted = tomllib.loads(result.stdout)
    assert drafted["jobs"]["terminal"] == ["done", "error"]
    assert "# TODO: confirm the finished values of status" in result.stdout
    assert "reactor: TODO: confirm the finished values of status" in result.stderr
    assert "guessed: done,error" in result.stderr


def test_an_integer_status_without_terminal_values_is_a_todo(empty_database_url: str) -> None:
    RAILS.load(empty_database_url)
    result = _init(empty_database_url, *RAILS.flags())
    assert result.returncode == 2, result.stderr
    # The file as it stands refuses to migrate: no status value is taken for granted.
    assert "terminal = []" in result.stdout
    assert "status is integer and nothing in the catalog names its values" in result.stderr


def test_a_terminal_value_no_row_can_hold_is_a_todo(empty_database_url: str) -> None:
    DJANGO.load(empty_database_url)
    result = _init(empty_database_url, *DJANGO.flags(), "--terminal", "done,failed")
    assert result.returncode == 2
    assert "--terminal 'failed' is none of the CHECK constraint's values" in result.stderr


def test_two_pairs_are_listed_and_never_chosen_between(empty_database_url: str) -> None:
    DJANGO.load(empty_database_url)
    HANDWRITTEN.load(empty_database_url)
    result = _init(empty_database_url)
    assert (result.returncode, result.stdout) == (2, "")
    assert "found 2 candidate pair(s)" in result.stderr
    assert f"--jobs {DJANGO.jobs} --runs {DJANGO.runs}" in result.stderr
    assert f"--jobs {HANDWRITTEN.jobs} --runs {HANDWRITTEN.runs}" in result.stderr
    # One name narrows the list; the draft still waits for both.
    narrowed = _init(empty_database_url, "--jobs", HANDWRITTEN.jobs)
    assert narrowed.returncode == 2
    assert "found 1 candidate pair(s)" in narrowed.stderr
    assert DJANGO.jobs not in narrowed.stderr


def test_a_table_that_is_not_there_is_one_line(empty_database_url: str) -> None:
    SQLALCHEMY.load(empty_database_url)
    result = _init(empty_database_url, "--jobs", "Jobs", "--runs", "job_results")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "reactor: --jobs Jobs: no table public.Jobs (names are as in the catalog: case matters, "
        "and an unqualified name means public.NAME); `reactor init` without flags lists the "
        "pairs it finds"
    ]


def test_an_existing_file_is_not_replaced(empty_database_url: str, tmp_path: Path) -> None:
    path = tmp_path / "reactor.toml"
    path.write_text("# reviewed by hand\n")
    result = _init(empty_database_url, "--jobs", "a", "--runs", "b", "-o", str(path))
    assert result.returncode == 2
    assert "the file exists" in result.stderr
    assert path.read_text() == "# reviewed by hand\n"


def test_a_role_name_that_is_not_an_identifier_is_refused(empty_database_url: str) -> None:
    result = _init(empty_database_url, "--role", 'x"; DROP TABLE jobs; --')
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("reactor: --role ")


def test_drafting_changes_nothing(empty_database_url: str) -> None:
    HANDWRITTEN.load(empty_database_url)
    result = _init(empty_database_url, *HANDWRITTEN.flags(), "--terminal", HANDWRITTEN.terminal)
    assert result.returncode == 0, result.stderr
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT to_regnamespace('reactor')").fetchone() == (None,)
