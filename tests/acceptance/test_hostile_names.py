"""Names and values never end a dollar-quoted body, through the real CLI and a real psql.

The app's owner names the tables and columns, and `reactor migrate` runs as a role with more
rights, often a superuser; `reactor migrate --print` is applied by psql on some machine. The
mapping's names are quoted wherever the reactor's SQL holds them, but the function bodies are
dollar-quoted, and a body ends at the first occurrence of its delimiter whatever the quotes:
a column named ``id$$; ... `` would end it there, and what follows would run as SQL (with the
database's check_function_bodies off, a setting its owner may set) or, under psql, as a psql
command (``\\!`` runs a shell). Here every mapped name and value holds such text, and nothing
but the reactor's statements runs: no marker file, no table or role of the attacker's, every
function body exactly what its template wrote between its delimiters.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from reactor import db
from reactor.install import mapping_file, sql
from reactor.install.mapping import Mapping
from reactor.testing import audit
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.acceptance.test_trust import one_line
from tests.helpers import no_function_body_checks

PSQL = shutil.which("psql") or "/usr/bin/psql"
REACTOR_SCHEMA = "rx_hostile"
# A dollar quote's delimiter as a template writes it: $$ or $tag$.
DELIMITER = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$")


@dataclass(frozen=True)
class Hostile:
    """An app whose mapped names and values try to leave their bodies: ``kind`` "sql" ends a
    body and runs a statement (each occurrence opens a string that the next closes, so the
    whole text still parses), "psql" ends a body before a psql command. ``token`` makes the
    role and the marker files they aim at this test's own."""

    kind: str
    token: str

    @property
    def role(self) -> str:
        """The role the statements in the names make a superuser: the app's owner, say."""
        return f"app_{self.token}"

    @property
    def markers(self) -> list[Path]:
        """The files the psql commands in the names would make."""
        return [Path(f"/tmp/rx{self.token}_{what}") for what in ("s", "o", "run", "t")]

    def names(self) -> dict[str, str]:
        """Each mapped name: $$ and the statement or the command after it, $tag$ (the ones a
        render picks among them), quotes, backslashes; each within PostgreSQL's 63 bytes."""
        t = self.token
        names = {
            "schema": "app'\\",
            "jobs": "Job$reactor_3$",
            "status": "st'\"\\$reactor_1$",
            "updated_at": "up$reactor_2$\\o",
            "created_at": "cr$t$",
            "deleted_at": "del$x",
            "doc": "doc$reactor_trust$",
            "results": 'res"$a$',
            "runs": "Report$r$",
            "key": "key$t$",
            "job": "job$q$",
            "saved_by": "by\\gexec",
            "copied": "doc \\gexec",
        }
        if self.kind == "sql":
            names["id"] = f"id$$;COMMIT;ALTER ROLE {self.role} SUPERUSER;COMMIT;SELECT $$"
            names["run"] = "run$t$"
        else:
            # The job table's schema is the first name in the first body.
            names |= {
                "schema": f"app$$ \\! touch /tmp/rx{t}_s #",
                "jobs": f"Job$$ \\o /tmp/rx{t}_o",
                "id": "id$$$",
                "run": f"run$$ \\! touch /tmp/rx{t}_run #",
                "runs": "Report$$ \\gexec",
                "key": "key$$",
                "saved_by": "by\\gexec$$",
            }
        return names

    def values(self) -> dict[str, str]:
        """Each mapped value (the status and saved_by values), as :meth:`names`."""
        if self.kind == "sql":
            statement = f"$$;COMMIT;ALTER ROLE {self.role} SUPERUSER;COMMIT;SELECT $$"
            return {
                "done": f"done{statement}",
                "failed": "fail'\"\\",
                "worker": f"w{statement}",
                "client": "c'\\",
            }
        return {
            "done": f"done$$ \\! touch /tmp/rx{self.token}_t #",
            "failed": "fail'\"\\",
            # No $$: the first body reads it before the job table's schema.
            "worker": "w'\"\\",
            "client": "c'$$\\",
        }

    def create_tables(self, url: str) -> None:
        """The app's two tables, in the app's names."""
        n = self.names()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(SQL("CREATE SCHEMA {}").format(Identifier(n["schema"])))
            conn.execute(
                SQL(
                    "CREATE TABLE {jobs} ({id} uuid PRIMARY KEY, {run} uuid NOT NULL,"
                    " {status} text NOT NULL, {doc} text, {results} jsonb,"
                    " {deleted_at} timestamptz, {created_at} timestamptz NOT NULL DEFAULT now(),"
                    " {updated_at} timestamptz NOT NULL DEFAULT now())"
                ).format(
                    jobs=Identifier(n["schema"], n["jobs"]),
                    **{key: Identifier(n[key]) for key in _JOB_COLUMNS},
                )
            )
            conn.execute(
                SQL(
                    "CREATE TABLE {runs} ({key} uuid PRIMARY KEY, {job} uuid NOT NULL,"
                    " {saved_by} text, {copied} text)"
                ).format(
                    runs=Identifier(n["schema"], n["runs"]),
                    **{key: Identifier(n[key]) for key in ("key", "job", "saved_by", "copied")},
                )
            )

    def mapping_file(self, directory: Path) -> str:
        """The mapping of the two tables, as TOML (JSON's strings are TOML's basic strings)."""
        n, v = self.names(), self.values()

        def s(text: str) -> str:
            return json.dumps(text)

        copied = json.dumps(f"j.{Identifier(n['doc']).as_string(None)}")
        path = directory / "hostile.toml"
        path.write_text(
            f"reactor_schema = {s(REACTOR_SCHEMA)}\n\n[jobs]\n"
            f"table = {s(n['schema'] + '.' + n['jobs'])}\n"
            + "".join(f"{key} = {s(n[key])}\n" for key in _JOB_COLUMNS if key in _SCALARS)
            + f"not_null = [{s(n['doc'])}, {s(n['results'])}]\n"
            f"not_empty = [{s(n['results'])}]\n"
            f"terminal = [{s(v['done'])}, {s(v['failed'])}]\n\n[runs]\n"
            f"table = {s(n['schema'] + '.' + n['runs'])}\n"
            f"key = {s(n['key'])}\njob = {s(n['job'])}\nsaved_by = {s(n['saved_by'])}\n"
            f"client = [{s(v['client'])}]\nworker = {s(v['worker'])}\n\n"
            f"[runs.columns]\n{s(n['copied'])} = {copied}\n",
            encoding="utf-8",
        )
        return str(path)

    def finish_a_job(self, url: str) -> None:
        """One job finished an hour ago, with its documents."""
        n, v = self.names(), self.values()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                SQL(
                    "INSERT INTO {jobs} ({id}, {run}, {status}, {doc}, {results}, {updated_at})"
                    " VALUES (gen_random_uuid(), gen_random_uuid(), %s, '<p/>', '{{\"a\": 1}}',"
                    " now() - interval '1 hour')"
                ).format(
                    jobs=Identifier(n["schema"], n["jobs"]),
                    **{key: Identifier(n[key]) for key in _JOB_COLUMNS},
                ),
                (v["done"],),
            )

    def saved_by(self, url: str) -> list[object]:
        """saved_by of every run row."""
        n = self.names()
        with psycopg.connect(url, autocommit=True) as conn:
            query = SQL("SELECT {saved_by} FROM {runs}").format(
                saved_by=Identifier(n["saved_by"]), runs=Identifier(n["schema"], n["runs"])
            )
            return [row[0] for row in conn.execute(query).fetchall()]

    def assert_nothing_else_ran(self, url: str) -> None:
        """No marker file, and the role the names aim at is no superuser."""
        assert [path for path in self.markers if path.exists()] == []
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT rolsuper FROM pg_roles WHERE rolname = %s", (self.role,)
            ).fetchone()
        assert row == (False,), f"{self.role} became a superuser"


# The job table's columns other than its table; the ones a file names as one key each.
_JOB_COLUMNS = ("id", "run", "status", "doc", "results", "deleted_at", "created_at", "updated_at")
_SCALARS = ("id", "run", "status", "deleted_at", "created_at", "updated_at")


@pytest.fixture(params=["sql", "psql"])
def hostile(request: pytest.FixtureRequest, empty_database_url: str) -> Iterator[Hostile]:
    app = Hostile(request.param, uuid.uuid4().hex[:8])
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(SQL("CREATE ROLE {}").format(Identifier(app.role)))
    app.create_tables(empty_database_url)
    yield app
    for path in app.markers:
        path.unlink(missing_ok=True)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(SQL("DROP ROLE {}").format(Identifier(app.role)))


def fitted(url: str, path: str) -> Mapping:
    """The mapping at ``path`` as `reactor migrate` renders it: typed by the catalog."""

    async def fit() -> Mapping:
        async with await db.connect(url, "test") as conn:
            return await db.fit(conn, mapping_file.load(path), installing=True)

    return anyio.run(fit, backend="asyncio")


def bodies(text: str, mapping: Mapping) -> list[str]:
    """What ``text`` (a template) holds between the delimiters of each of its dollar quotes,
    rendered for ``mapping``, each alone: what each body must be once installed."""
    return [sql.render(body, mapping) for body in DELIMITER.split(text)[1::2]]


def installed_bodies(url: str, schema: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = %s",
            (schema,),
        ).fetchall()
    return sorted(str(row[0]) for row in rows)


def assert_bodies_as_written(url: str, mapping: Mapping) -> None:
    """Every function of the reactor's schema holds what its template wrote between its
    delimiters, and there is no other: no body ended early, nothing was made from a name."""
    expected = bodies(sql.baseline().text, mapping) + bodies(sql.repeatable().text, mapping)
    assert len(expected) == 8  # the baseline's functions and the mapping's, outranks_v2 among them
    assert installed_bodies(url, REACTOR_SCHEMA) == sorted(expected)


def test_migrate_installs_every_name_as_a_name(
    empty_database_url: str, hostile: Hostile, tmp_path: Path
) -> None:
    url = empty_database_url
    # The database's owner turned the compile of function bodies off: a body that ended early
    # would be created as it is, and the rest of the name run after it.
    no_function_body_checks(url)
    path = hostile.mapping_file(tmp_path)
    env = reactor_env(url, REACTOR_CONFIG=path, REACTOR_GRACE_SECONDS="0")

    migrated = run_reactor("migrate", env=env)

    hostile.assert_nothing_else_ran(url)
    assert migrated.returncode == 0, migrated.stderr
    mapping = fitted(url, path)
    assert_bodies_as_written(url, mapping)
    # The audit's function too (the demo's, the tests' and the benchmarks'), compiled.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET check_function_bodies = on")
        conn.execute(audit.ddl(mapping))
    (audit_body,) = bodies(sql.preamble("audit.sql"), mapping)
    assert audit_body in installed_bodies(url, "public")
    hostile.assert_nothing_else_ran(url)
    # And the installed functions work: the job trigger queues a finished job, a sweep writes
    # its run with the worker's value.
    hostile.finish_a_job(url)
    swept = run_reactor("sweep", "--once", env=env)
    assert swept.returncode == 0, swept.stderr
    assert swept.stdout.strip() == "1"
    assert hostile.saved_by(url) == [hostile.values()["worker"]]


def test_the_printed_script_through_psql_runs_only_the_reactors_statements(
    empty_database_url: str, hostile: Hostile, tmp_path: Path
) -> None:
    url = empty_database_url
    path = hostile.mapping_file(tmp_path)
    env = reactor_env(url, REACTOR_CONFIG=path, REACTOR_GRACE_SECONDS="0")
    printed = run_reactor("migrate", "--print", env=env)
    assert printed.returncode == 0, printed.stderr

    # As the docs apply it: piped into psql, which goes on after an error unless told not to.
    applied = subprocess.run(
        [PSQL, "--no-psqlrc", "-d", url],
        input=printed.stdout,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    hostile.assert_nothing_else_ran(url)
    assert applied.returncode == 0, applied.stderr
    assert "ERROR" not in applied.stderr, applied.stderr
    # The compile of function bodies is on from the script's first line, whatever the
    # database's owner set.
    assert printed.stdout.splitlines()[0] == "SET check_function_bodies = on;"
    assert_bodies_as_written(url, fitted(url, path))
    # What psql installed is what `reactor migrate` would have: `sweep` takes it as current.
    hostile.finish_a_job(url)
    swept = run_reactor("sweep", "--once", env=env)
    assert swept.returncode == 0, swept.stderr
    assert swept.stdout.strip() == "1"
    assert hostile.saved_by(url) == [hostile.values()["worker"]]


@pytest.mark.parametrize(
    ("column", "shown"),
    [("st\natus", "'st\\natus'"), ("status\x1b[2J", "'status\\x1b[2J'")],
)
def test_a_name_with_a_control_character_is_refused_and_shown_escaped(
    empty_database_url: str, tmp_path: Path, column: str, shown: str
) -> None:
    url = empty_database_url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.read("reference.sql"))
        conn.execute(
            SQL("ALTER TABLE analysis_jobs RENAME status TO {}").format(Identifier(column))
        )
    path = tmp_path / "reactor.toml"
    path.write_text(
        f'[jobs]\ntable = "analysis_jobs"\nstatus = {json.dumps(column)}\n'
        'not_null = ["doc_html", "results"]\nnot_empty = ["results"]\n'
        'deleted_at = "deleted_at"\n\n[runs]\ntable = "analysis_runs"\n',
        encoding="utf-8",
    )
    env = reactor_env(url, REACTOR_CONFIG=str(path))

    for command in (("migrate",), ("migrate", "--print")):
        refused = run_reactor(*command, env=env)

        assert refused.returncode == 2, refused.stderr
        line = one_line(refused)
        assert f"jobs.status = {shown}" in line
        assert column not in refused.stderr
        assert refused.stdout == ""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT to_regnamespace('reactor') IS NULL").fetchone()
    assert row == (True,)
