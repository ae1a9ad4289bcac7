"""``reactor hooks list/retry/cancel`` as an operator runs them, and no secret in any output of
a reactor whose webhook fails: logs, stored errors, metrics, status and the hooks commands."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import psycopg
import psycopg.conninfo
import pytest

from tests.acceptance.conftest import reactor_env, run_reactor
from tests.acceptance.test_cli import assert_one_clean_line, listening
from tests.conftest import Server
from tests.helpers import finish, new_job
from tests.polling import wait_for

Spawn = Callable[..., subprocess.Popen[str]]


def add_row(conn: psycopg.Connection[Any], status: str, error: str | None = None) -> int:
    row = conn.execute(
        "INSERT INTO reactor.hook_outbox (run_id, job_id, hook, status, attempts, last_error) "
        "VALUES (%s, %s, 'judge', %s, 2, %s) RETURNING id",
        (uuid.uuid4(), uuid.uuid4(), status, error),
    ).fetchone()
    assert row is not None
    return int(row[0])


def status_of(conn: psycopg.Connection[Any], row_id: int) -> str:
    row = conn.execute("SELECT status FROM reactor.hook_outbox WHERE id = %s", (row_id,)).fetchone()
    assert row is not None
    return str(row[0])


def hooks(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_reactor("hooks", *args, env=reactor_env(database_url))


def test_each_action_has_one_line_of_help() -> None:
    result = run_reactor("hooks", "--help", env=reactor_env(None))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for action in ("list", "retry", "cancel"):
        (at,) = [i for i, ln in enumerate(lines) if ln.strip().startswith(action + " ")]
        assert len(lines[at].split(None, 1)[1]) > 10
        # One line: the next one starts the next action or section, not a continuation.
        assert not lines[at + 1].startswith(" " * 10), lines[at : at + 2]


def test_list_retry_and_cancel(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        failed = add_row(conn, "failed", "HTTP 503 from https://judge.example/hook")
        pending = add_row(conn, "pending")
        running = add_row(conn, "running")
        add_row(conn, "done")

        result = hooks(database_url, "list", "--json")
        assert result.returncode == 1, result.stderr  # a parked row needs a person
        listed = json.loads(result.stdout)
        assert (listed["total"], listed["failed"]) == (3, 1)
        assert [(h["id"], h["status"]) for h in listed["hooks"]] == [
            (failed, "failed"),
            (pending, "pending"),
            (running, "running"),
        ]
        assert listed["hooks"][0]["last_error"] == "HTTP 503 from https://judge.example/hook"

        result = hooks(database_url, "list", "--failed")
        assert result.returncode == 1
        assert str(failed) in result.stdout
        assert "pending" not in result.stdout

        for args, needle in [
            (("retry", "999999"), "no hook row with id 999999"),
            (("retry", str(pending)), f"hook row {pending} is pending: only failed or cancelled"),
            (("retry", "--failed", str(failed)), "give --failed or row ids, one of the two"),
            (("cancel", str(running)), f"hook row {running} is running: only pending or failed"),
            (("cancel", str(pending), "424242"), "no hook row with id 424242"),
            (("list", "--limit", "many"), "--limit"),
        ]:
            assert needle in assert_one_clean_line(hooks(database_url, *args), 2), args
        # Every refusal above left every row as it was.
        assert status_of(conn, pending) == "pending"
        assert status_of(conn, failed) == "failed"

        result = hooks(database_url, "cancel", str(pending))
        assert (result.returncode, result.stdout.strip()) == (
            0,
            f"cancelled 1 hook call(s): {pending}",
        )
        assert status_of(conn, pending) == "cancelled"

        result = hooks(database_url, "retry", "--failed")
        assert (result.returncode, result.stdout.strip()) == (0, "re-queued 1 failed hook call(s)")
        assert status_of(conn, failed) == "pending"

        result = hooks(database_url, "retry", str(pending))  # a cancelled row comes back too
        assert result.returncode == 0, result.stderr
        assert status_of(conn, pending) == "pending"

        result = hooks(database_url, "list", "--json")
        assert result.returncode == 0
        assert json.loads(result.stdout)["failed"] == 0


def test_hooks_needs_the_current_schema(empty_database_url: str) -> None:
    line = assert_one_clean_line(hooks(empty_database_url, "list"), 4)
    assert "reactor migrate" in line


# -- no secret in any output ---------------------------------------------------------------------

DSN_PASSWORD = "dsn-PLANTED-pw1"
URL_PASSWORD = "url-PLANTED-pw2"
URL_TOKEN = "qry-PLANTED-tok3"
WEBHOOK_SECRET = "whk-PLANTED-sec4"
LOCATION_TOKEN = "loc-PLANTED-tok5"
DASHBOARD_TOKEN = "dash-PLANTED-token6"
PLANTED = (DSN_PASSWORD, URL_PASSWORD, URL_TOKEN, WEBHOOK_SECRET, LOCATION_TOKEN, DASHBOARD_TOKEN)


class _Failing(BaseHTTPRequestHandler):
    """Answers 500, then a 307, then a 301 carrying a token in its Location."""

    answers: ClassVar[list[int]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status = self.answers.pop(0) if self.answers else 500
        self.send_response(status)
        if 300 <= status < 400:
            host = self.headers.get("Host", "")
            self.send_header("Location", f"http://{host}/moved?token={LOCATION_TOKEN}")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def failing_receiver() -> Iterator[int]:
    """A real local HTTP server on a free port; yields the port."""
    _Failing.answers = [500, 307, 301]
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_no_secret_in_any_output(
    database_url: str, server: Server, spawn: Spawn, failing_receiver: int
) -> None:
    if server.embedded is None:
        pytest.skip("needs a server that ignores the planted password (trust authentication)")
    parts = psycopg.conninfo.conninfo_to_dict(database_url)
    dsn = (
        f"postgresql://{parts['user']}:{DSN_PASSWORD}@{parts['host']}:{parts['port']}/"
        f"{parts['dbname']}"
    )
    shown_url = f"http://127.0.0.1:{failing_receiver}/judge"
    url = f"http://hookuser:{URL_PASSWORD}@127.0.0.1:{failing_receiver}/judge?token={URL_TOKEN}"
    with ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler) as probe:
        http_port = probe.server_address[1]  # a free port for /metrics
    with ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler) as probe:
        page_port = probe.server_address[1]  # and one for the page
    env = reactor_env(
        dsn,
        REACTOR_HOOKS=f"judge=webhook:{url}",
        REACTOR_WEBHOOK_SECRET=WEBHOOK_SECRET,
        REACTOR_GRACE_SECONDS="0.2",
        REACTOR_HOOK_BACKOFF_SECONDS="0.05",
        REACTOR_HTTP_ADDR=f"127.0.0.1:{http_port}",
        REACTOR_DASHBOARD_ADDR=f"127.0.0.1:{page_port}",
        REACTOR_LOG_LEVEL="DEBUG",
        REACTOR_DASHBOARD_TOKEN=DASHBOARD_TOKEN,
    )
    outputs: dict[str, str] = {}
    with psycopg.connect(database_url, autocommit=True) as conn:
        proc = spawn("run", env=env)
        wait_for(lambda: listening(conn) or proc.poll() is not None)
        finish(conn, new_job(conn)[0])

        def parked() -> bool:
            row = conn.execute("SELECT status FROM reactor.hook_outbox").fetchone()
            return row is not None and row[0] == "failed"

        wait_for(lambda: parked() or proc.poll() is not None)
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as r:
            outputs["metrics"] = r.read().decode()
        # The page and its document, read-only and signed in (as a script does, by Bearer).
        for path in ("/", "/api/status"):
            for headers in ({}, {"Authorization": f"Bearer {DASHBOARD_TOKEN}"}):
                request = urllib.request.Request(
                    f"http://127.0.0.1:{page_port}{path}", headers=headers
                )
                with urllib.request.urlopen(request, timeout=10) as r:
                    outputs[f"GET {path} {sorted(headers)}"] = r.read().decode()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        outputs["run"] = out + err
        (stored,) = conn.execute("SELECT last_error FROM reactor.hook_outbox").fetchone() or ()
        outputs["last_error"] = str(stored)
        for args in (
            ("status",),
            ("status", "--json"),
            ("hooks", "list"),
            ("hooks", "list", "--json"),
            ("hooks", "list", "--failed"),
            ("hooks", "retry", "424242"),
        ):
            result = run_reactor(*args, env=env)
            outputs[" ".join(args)] = result.stdout + result.stderr
    for hooks_spec in (
        f"judge=webhook:ftp://hookuser:{URL_PASSWORD}@127.0.0.1/x?token={URL_TOKEN}",
        f"judge webhook:{url}",  # no "=": the whole item is malformed
        f"judge=webhook:http://hookuser:{URL_PASSWORD}@127.0.0.1:99999/?token={URL_TOKEN}",
    ):
        bad = {**env, "REACTOR_HOOKS": hooks_spec, "REACTOR_LOG_LEVEL": "INFO"}
        result = run_reactor("run", env=bad)
        outputs[f"bad config {hooks_spec[:20]}"] = assert_one_clean_line(result, 2)

    # What the operator needs is there...
    assert stored == (
        f"HTTP 301 from {shown_url} (a redirect to http://127.0.0.1:{failing_receiver}/moved; "
        "redirects are not followed)"
    )
    assert "HTTP 500 from " + shown_url in outputs["run"]
    assert shown_url in outputs["status --json"]
    assert shown_url in outputs["hooks list --json"]
    assert shown_url in outputs["GET / []"]
    assert shown_url in outputs["GET /api/status []"]
    assert 'reactor_hook_outcomes_total{hook="judge",outcome="failed"} 1.0' in outputs["metrics"]
    # ...and no secret is, anywhere.
    for name, text in outputs.items():
        for secret in PLANTED:
            assert secret not in text, f"{secret} leaked into {name}: {text[:2000]}"
