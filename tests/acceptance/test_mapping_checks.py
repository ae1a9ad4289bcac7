"""Checks before harm: each contract check of the mapping, fed a wrong file or table.

`reactor migrate` checks the mapping against the catalog before it changes anything, and
`run`, `sweep` and `status` at start. Each mismatch is one line naming the fix, exit 2, and the
database is left as it was.
"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from reactor.install import sql
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.helpers import IMMUTABLE_BY_ITS_WORD

# (case, SQL run after reference.sql, the mapping file or None, what the line must say)
CASES = [
    ("bad toml", "", "[jobs\n", "is not valid TOML"),
    ("unknown key", "", "[jobs]\ncolour = 'red'\n", "unknown key [jobs] colour"),
    ("missing table", "", "[jobs]\ntable = 'jobz'\n", "table jobz not found"),
    ("missing column", "", "[jobs]\nstatus = 'state'\n", "has no column state"),
    (
        "types differ",
        "ALTER TABLE analysis_runs ALTER COLUMN id TYPE text",
        None,
        "jobs.run and runs.key must have one type",
    ),
    (
        "no unique key",
        "ALTER TABLE analysis_runs DROP CONSTRAINT analysis_runs_pkey",
        None,
        "has no unique index on it alone",
    ),
    (
        "not null unfilled",
        "ALTER TABLE analysis_runs ADD COLUMN owner_id uuid NOT NULL",
        None,
        "analysis_runs.owner_id is NOT NULL without a default",
    ),
    (
        "expression does not compile",
        "",
        "[runs.columns]\nresults = 'j.nope'\n",
        "does not compile",
    ),
    (
        "expression of the wrong type",
        "",
        "[runs.columns]\nresults = 'j.created_at'\n",
        "does not compile",
    ),
    (
        "naive time without a zone",
        "ALTER TABLE analysis_jobs ALTER COLUMN updated_at TYPE timestamp",
        None,
        "set jobs.time_zone",
    ),
    (
        "unknown zone",
        "ALTER TABLE analysis_jobs ALTER COLUMN updated_at TYPE timestamp",
        "[jobs]\ntime_zone = 'Mars/Olympus'\nnot_null = ['doc_html']\n",
        "not a time zone PostgreSQL knows",
    ),
    (
        "partitioned runs",
        "DROP TABLE analysis_runs; CREATE TABLE analysis_runs (id uuid, job_id uuid NOT NULL,"
        " doc_html text, results jsonb NOT NULL, saved_by text, created_at timestamptz NOT NULL"
        " DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now())"
        " PARTITION BY HASH (id)",
        None,
        "analysis_runs is partitioned",
    ),
    (
        "terminal value not in the enum",
        "CREATE TYPE job_status AS ENUM ('queued', 'running', 'complete', 'failed');"
        " ALTER TABLE analysis_jobs ALTER COLUMN status TYPE job_status USING status::job_status",
        "[jobs]\nterminal = ['complete', 'done']\nnot_null = ['doc_html']\n",
        "jobs.terminal names done",
    ),
    (
        "terminal value a CHECK refuses",
        "ALTER TABLE analysis_jobs ADD CONSTRAINT status_values"
        " CHECK (status IN ('queued', 'running', 'complete', 'error'))",
        "[jobs]\nterminal = ['complete', 'failed']\nnot_null = ['doc_html']\n",
        "jobs.terminal names 'failed', which no row of analysis_jobs can hold: its constraint "
        "status_values",
    ),
    (
        "strings for an integer status",
        "ALTER TABLE analysis_jobs ALTER COLUMN status TYPE smallint USING 0",
        None,
        "give jobs.terminal as integers",
    ),
    (
        "integer terminal value a CHECK refuses",
        "ALTER TABLE analysis_jobs ALTER COLUMN status TYPE integer USING 0;"
        " ALTER TABLE analysis_jobs ADD CHECK (status BETWEEN 0 AND 3)",
        "[jobs]\nterminal = [3, 4]\nnot_null = ['doc_html']\n",
        "jobs.terminal names 4, which no row of analysis_jobs can hold",
    ),
    (
        "no created_at where jobs share a run",
        "ALTER TABLE analysis_jobs DROP COLUMN created_at",
        None,
        "several jobs can share a run (jobs.run = run_id is not jobs.id)",
    ),
    (
        "key and job one column, run not the id",
        "",
        "[runs]\nkey = 'id'\njob = 'id'\n",
        "set jobs.run = 'id' (jobs.id) too",
    ),
    (
        "an id type the reactor cannot carry",
        "ALTER TABLE analysis_jobs ALTER COLUMN id TYPE numeric USING 0",
        None,
        "job ids must be uuid, bigint or text",
    ),
]


@pytest.mark.parametrize(
    ("schema", "toml", "says"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_migrate_names_the_problem_in_one_line_and_changes_nothing(
    empty_database_url: str, tmp_path: Path, schema: str, toml: str | None, says: str
) -> None:
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(sql.read("reference.sql"))
        if schema:
            conn.execute(schema)
    variables = {}
    if toml is not None:
        path = tmp_path / "reactor.toml"
        path.write_text(toml)
        variables["REACTOR_CONFIG"] = str(path)
    result = run_reactor("migrate", env=reactor_env(empty_database_url, **variables))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("reactor: ")
    assert says in lines[0]
    assert "Traceback" not in result.stderr
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT to_regnamespace('reactor')").fetchone() == (None,)


@pytest.mark.parametrize("command", [("run",), ("sweep", "--once"), ("status",)])
def test_every_command_checks_at_start(database_url: str, command: tuple[str, ...]) -> None:
    # The app added an owner to its artifact table after the reactor was installed.
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE analysis_runs ADD COLUMN owner_id uuid NOT NULL")
    result = run_reactor(*command, env=reactor_env(database_url))
    assert result.returncode == 2, result.stderr
    assert "analysis_runs.owner_id is NOT NULL without a default" in result.stderr
    assert "[runs.columns]" in result.stderr


def test_a_missing_mapping_file_is_one_line(database_url: str) -> None:
    result = run_reactor(
        "status", env=reactor_env(database_url, REACTOR_CONFIG="/nonexistent/reactor.toml")
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip() == "reactor: REACTOR_CONFIG=/nonexistent/reactor.toml: no such file"
    )


@pytest.mark.parametrize("command", [("--print",), ("--print-grants", "reactor_runtime")])
def test_printing_for_a_mapping_file_needs_the_catalog(command: tuple[str, ...]) -> None:
    # Without DATABASE_URL the columns' types are unknown, and SQL guessed from the names (a
    # jsonb document compared with '') would break the app's writes once applied.
    second = Path(__file__).parent.parent / "mappings" / "second.toml"
    result = run_reactor("migrate", *command, env=reactor_env(None, REACTOR_CONFIG=str(second)))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.strip() == (
        "reactor: printing the SQL for REACTOR_CONFIG needs DATABASE_URL: it takes the mapped "
        "columns' types from the catalog; point it at any database with the app's tables "
        "(a development copy will do)"
    )


def test_the_owner_column_filled_by_the_mapping_is_written(
    database_url: str, tmp_path: Path
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE analysis_jobs ADD COLUMN owner_id uuid")
        conn.execute("ALTER TABLE analysis_runs ADD COLUMN owner_id uuid NOT NULL")
        conn.execute(
            "INSERT INTO analysis_jobs (id, run_id, status, doc_html, results, owner_id,"
            " updated_at) VALUES (gen_random_uuid(), gen_random_uuid(), 'complete', '<p/>',"
            " '{\"a\": 1}', gen_random_uuid(), now() - interval '1 hour')"
        )
    path = tmp_path / "reactor.toml"
    path.write_text(
        "[runs.columns]\ndoc_html = 'j.doc_html'\nresults = 'j.results'\n"
        "owner_id = 'j.owner_id'\nupdated_at = 'now()'\n"
    )
    env = reactor_env(database_url, REACTOR_CONFIG=str(path))
    assert run_reactor("migrate", env=env).returncode == 0
    result = run_reactor("sweep", "--once", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"
    with psycopg.connect(database_url) as conn:
        assert conn.execute(
            "SELECT count(*) FROM analysis_runs r JOIN analysis_jobs j ON j.run_id = r.id"
            " WHERE r.owner_id = j.owner_id AND r.saved_by = 'worker'"
        ).fetchone() == (1,)


# An expression that closes the statement it is pasted into and starts another.
PWNED = (
    "j.doc_html FROM public.analysis_jobs j WHERE false; "
    "CREATE TABLE public.pwned AS SELECT current_user; SELECT j.doc_html"
)
MIGRATE_COMMANDS = [
    pytest.param((), id="migrate"),
    pytest.param(("--print",), id="print"),
    pytest.param(("--print-grants", "reactor_runtime"), id="print-grants"),
]


def _columns(tmp_path: Path, doc_html: str) -> dict[str, str]:
    path = tmp_path / "reactor.toml"
    path.write_text(
        f"[runs.columns]\ndoc_html = {json.dumps(doc_html)}\nresults = 'j.results'\n"
        "updated_at = 'now()'\n"
    )
    return {"REACTOR_CONFIG": str(path)}


def _catalog(url: str) -> list[tuple[str, str]]:
    # Every relation, function and schema the database holds, and the demo sequence's state.
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT 'class', oid::regclass::text FROM pg_class"
            " UNION ALL SELECT 'proc', oid::regprocedure::text FROM pg_proc"
            " UNION ALL SELECT 'namespace', nspname FROM pg_namespace"
            " UNION ALL SELECT 'touched', count(*)::text FROM public.touched"
            " UNION ALL SELECT 'ticks', is_called::text FROM public.ticks ORDER BY 1, 2"
        ).fetchall()
    return [(str(kind), str(name)) for kind, name in rows]


@pytest.mark.parametrize("command", MIGRATE_COMMANDS)
def test_an_expression_holding_statements_is_refused_and_runs_nothing(
    empty_database_url: str, tmp_path: Path, command: tuple[str, ...]
) -> None:
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(sql.read("reference.sql"))
    env = reactor_env(empty_database_url, **_columns(tmp_path, PWNED))
    result = run_reactor("migrate", *command, env=env)
    assert (result.returncode, result.stdout) == (2, ""), result.stdout + result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"reactor: {tmp_path / 'reactor.toml'}: [runs.columns] doc_html ")
    assert "holds a ;" in line
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT to_regclass('public.pwned')").fetchone() == (None,)
        assert conn.execute("SELECT to_regnamespace('reactor')").fetchone() == (None,)


@pytest.mark.parametrize("command", MIGRATE_COMMANDS[1:])
def test_printing_leaves_the_database_as_it_was(
    empty_database_url: str, tmp_path: Path, command: tuple[str, ...]
) -> None:
    # A function that claims to be immutable is folded while the expression is planned, and
    # so runs during the check: what it writes (a row, a sequence's next value, which no
    # rollback takes back) must not happen at all.
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(sql.read("reference.sql"))
        conn.execute(IMMUTABLE_BY_ITS_WORD)
    before = _catalog(empty_database_url)
    doc_html = "coalesce(j.doc_html, public.stamp('none'))"
    env = reactor_env(empty_database_url, **_columns(tmp_path, doc_html))
    refused = run_reactor("migrate", *command, env=env)
    assert (refused.returncode, refused.stdout) == (2, ""), refused.stdout + refused.stderr
    assert "read-only transaction" in refused.stderr
    assert _catalog(empty_database_url) == before
    # And what prints, prints without a trace.
    printed = run_reactor("migrate", *command, env=reactor_env(empty_database_url))
    assert printed.returncode == 0, printed.stderr
    assert _catalog(empty_database_url) == before
