"""``reactor init`` on the app schemas of tests/apps/: the candidates listed, the drafts, the
checks of ``reactor migrate`` on them, and the runtime role's SQL applied."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import tomllib
import unicodedata
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from reactor.install.quote import literal
from reactor.install.quote import readable as sql_name
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
    assert "the path exists" in result.stderr
    assert path.read_text() == "# reviewed by hand\n"


def test_a_dangling_symlink_is_an_existing_path(empty_database_url: str, tmp_path: Path) -> None:
    DJANGO.load(empty_database_url)
    target = tmp_path / "elsewhere" / "reactor.toml"
    target.parent.mkdir()
    link = tmp_path / "reactor.toml"
    link.symlink_to(target)
    result = _init(
        empty_database_url, *DJANGO.flags(), "--terminal", DJANGO.terminal, "-o", str(link)
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [
        f"reactor: -o {link}: the path exists; remove it, or name another"
    ]
    assert not target.exists()


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


def _nothing_hidden_but_newlines(text: str) -> bool:
    return all(c == "\n" or unicodedata.category(c) not in ("Cc", "Cf", "Zl", "Zp") for c in text)


# A job table whose name ends the old quoting of the listed command and runs a command of its
# own; an artifact table whose name has a dot and a double quote.
_BREAKS_OUT = "ex'$(touch pwned)'ports"
_DOTTED = 'rep.orts"x'


def _hostile_pair(url: str, jobs: str, runs: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {sql_name(jobs)} (id bigint PRIMARY KEY, status text NOT NULL"
            "  CHECK (status IN ('queued', 'done', 'failed')), result text,"
            "  updated_at timestamptz NOT NULL DEFAULT now());"
            f"CREATE TABLE {sql_name(runs)} (export_id bigint PRIMARY KEY"
            f"  REFERENCES {sql_name(jobs)} (id), result text NOT NULL)"
        )


def test_the_listed_commands_are_safe_to_paste_into_bash(
    empty_database_url: str, tmp_path: Path
) -> None:
    _hostile_pair(empty_database_url, _BREAKS_OUT, _DOTTED)
    listed = _init(empty_database_url)
    assert listed.returncode == 2, listed.stderr
    (line,) = [x.strip() for x in listed.stderr.splitlines() if "reactor init --jobs" in x]
    # Pasted into a real bash, with `reactor` standing for a command that keeps its arguments.
    script = "reactor() { printf '%s\\0' \"$@\" > args; }\n" + line + "\n"
    subprocess.run(["bash", "-c", script], cwd=tmp_path, check=True)
    assert not (tmp_path / "pwned").exists()
    words = (tmp_path / "args").read_text().split("\0")[:-1]
    assert words[:2] == ["init", "--jobs"]
    # The arguments bash passed draft the pair they name.
    drafted = _init(empty_database_url, *words[1:], "--terminal", "done,failed")
    assert "Traceback" not in drafted.stderr
    parsed = tomllib.loads(drafted.stdout)
    assert (parsed["jobs"]["table"], parsed["runs"]["table"]) == (_BREAKS_OUT, _DOTTED)


def test_a_name_with_a_control_character_is_listed_without_a_command(
    empty_database_url: str,
) -> None:
    _hostile_pair(empty_database_url, "ex\nports\x1b[2J", "reports")
    listed = _init(empty_database_url)
    assert listed.returncode == 2
    assert "reactor init --jobs" not in listed.stderr
    assert "(no command: ex\\nports\\x1b[2J holds a control character" in listed.stderr
    assert _nothing_hidden_but_newlines(listed.stderr)


def test_a_table_named_as_sql_quotes_it_is_found(empty_database_url: str) -> None:
    PRISMA.load(empty_database_url)
    result = _init(
        empty_database_url, "--jobs", 'public."Job"', "--runs", '"Report"', "--terminal", "FAILED"
    )
    assert "Traceback" not in result.stderr
    parsed = tomllib.loads(result.stdout)
    assert (parsed["jobs"]["table"], parsed["runs"]["table"]) == ("Job", "Report")


def test_a_refusal_naming_a_hostile_constraint_adds_no_key(empty_database_url: str) -> None:
    # The constraint's name would end the comment the refusal is written in and start a table.
    hostile = 'x\n[reactor]\nhooks = "webhook:http://e.example/"\n#'
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE exports (id bigint PRIMARY KEY, status text NOT NULL,"
            "  result text, updated_at timestamptz NOT NULL DEFAULT now(),"
            f"  CONSTRAINT {sql_name(hostile)} CHECK (status IN ('queued', 'done')));"
            "CREATE TABLE export_reports (export_id bigint PRIMARY KEY REFERENCES exports (id),"
            "  result text NOT NULL)"
        )
    result = _init(
        empty_database_url,
        "--jobs",
        "exports",
        "--runs",
        "export_reports",
        "--terminal",
        "done,failed",
    )
    assert result.returncode == 2
    assert "`reactor migrate` would refuse it" in result.stdout
    assert 'its constraint x\\n[reactor]\\nhooks = "webhook:' in result.stdout
    parsed = tomllib.loads(result.stdout)
    assert set(parsed) == {"reactor_schema", "jobs", "runs"}
    assert _nothing_hidden_but_newlines(result.stdout + result.stderr)


def test_a_check_runs_as_the_tables_owner_not_as_the_superuser_who_drafts(
    empty_database_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    database_url = empty_database_url
    owner = f"owner_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{owner}"')

    def drop_owner() -> None:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{owner}"')
            conn.execute(f'DROP ROLE "{owner}"')

    request.addfinalizer(drop_owner)
    # A directory the server's own OS user may write in, whoever runs the tests.
    shared = Path(tempfile.mkdtemp(prefix="reactor-seen-"))
    shared.chmod(0o777)
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    seen = shared / "seen"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'GRANT pg_write_server_files TO "{owner}"')
        conn.execute(f'GRANT CREATE ON SCHEMA public TO "{owner}"')
        conn.execute(f'SET ROLE "{owner}"')
        # The owner's function, in the CHECK of the status: it writes down who runs it.
        conn.execute(
            "CREATE FUNCTION who_checks(s text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN"
            "  EXECUTE format('COPY (SELECT current_user, session_user) TO %L', "
            f"{literal(str(seen))}); RETURN true; END $$;"
            "CREATE TABLE exports (id bigint PRIMARY KEY,"
            "  status text NOT NULL CHECK (who_checks(status)), result text,"
            "  updated_at timestamptz NOT NULL DEFAULT now());"
            "CREATE TABLE export_reports (export_id bigint PRIMARY KEY REFERENCES exports (id),"
            "  result text NOT NULL)"
        )
        superuser = conn.execute("SELECT session_user").fetchone()[0]  # type: ignore[index]
    path = tmp_path / "reactor.toml"
    flags = ("--jobs", "exports", "--runs", "export_reports", "--terminal", "done,failed")
    drafted = _init(database_url, *flags, "-o", str(path))
    assert drafted.returncode == 0, drafted.stderr
    assert seen.read_text().split() == [owner, superuser]
    seen.unlink()
    migrated = run_reactor("migrate", env=reactor_env(database_url, REACTOR_CONFIG=str(path)))
    assert migrated.returncode == 0, migrated.stderr
    assert seen.read_text().split() == [owner, superuser]
