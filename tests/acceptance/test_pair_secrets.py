"""A pair's webhook secrets are its own: two pairs served by one `reactor run`, the second's
file naming a webhook hook like the first's, each receiver in the test checking what it got."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg
import pytest

from reactor.hooks.signature import SIGNATURE_HEADER, verify_signature
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.acceptance.test_pairs import MAPPINGS, REPORTS, a_job_for_each_pair_once_listening
from tests.polling import wait_for

Spawn = Callable[..., subprocess.Popen[str]]
ANALYSIS_KEY = "analysis-ops-key-4c1f0e9b"
REPORTS_KEY = "reports-ops-key-7d2a51c3"


class Receiver:
    """A webhook receiver on 127.0.0.1 that keeps every call's signature header and body."""

    def __init__(self) -> None:
        calls: list[tuple[str | None, bytes]] = []
        self.calls = calls

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                calls.append((self.headers.get(SIGNATURE_HEADER), body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/ops"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers() -> Iterator[tuple[Receiver, Receiver]]:
    analysis, reports = Receiver(), Receiver()
    yield analysis, reports
    analysis.close()
    reports.close()


@pytest.fixture
def both_name_ops(database_url: str, tmp_path: Path, receivers: tuple[Receiver, Receiver]) -> str:
    """REACTOR_CONFIG for the reference pair and the second mapping's, each with a webhook hook
    named ops calling its own receiver, both installed."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute((MAPPINGS / "second.sql").read_text())
    analysis, reports = receivers
    reference = tmp_path / "analysis.toml"
    reference.write_text(
        f'reactor_schema = "reactor"\n[reactor]\nhooks = "ops=webhook:{analysis.url}"\n'
    )
    second = tmp_path / "reports.toml"
    second.write_text(
        f'reactor_schema = "{REPORTS}"\n'
        + (MAPPINGS / "second.toml").read_text()
        + f'\n[reactor]\ngrace = 0.4\nhooks = "ops=webhook:{reports.url}"\n'
    )
    config = f"{reference}:{second}"
    migrated = run_reactor("migrate", env=reactor_env(database_url, REACTOR_CONFIG=config))
    assert migrated.returncode == 0, migrated.stderr
    return config


@pytest.mark.parametrize(
    "secrets",
    [
        {"REACTOR_WEBHOOK_SECRET_OPS": ANALYSIS_KEY},
        {"REACTOR_WEBHOOK_SECRET": ANALYSIS_KEY},
        # Pair A has its own now; the name without the pair would still be B's to read.
        {
            "REACTOR_WEBHOOK_SECRET_OPS": ANALYSIS_KEY,
            "REACTOR_WEBHOOK_SECRET_REACTOR_OPS": "x" * 24,
        },
    ],
)
def test_a_key_two_pairs_would_read_stops_the_start(
    database_url: str, both_name_ops: str, secrets: dict[str, str]
) -> None:
    env = reactor_env(database_url, REACTOR_CONFIG=both_name_ops, **secrets)
    for command in ("run", "status"):
        result = run_reactor(command, env=env)
        assert result.returncode == 2, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert f"pairs reactor and {REPORTS} both have" in line
        assert "set REACTOR_WEBHOOK_SECRET_<PAIR>_<HOOK> for each" in line
        assert next(iter(secrets)) in line
        assert ANALYSIS_KEY not in line


def test_each_pairs_receiver_gets_calls_signed_with_its_own_pairs_key(
    database_url: str,
    both_name_ops: str,
    receivers: tuple[Receiver, Receiver],
    spawn: Spawn,
) -> None:
    env = reactor_env(
        database_url,
        REACTOR_CONFIG=both_name_ops,
        REACTOR_GRACE_SECONDS="0.3",
        REACTOR_WEBHOOK_SECRET_REACTOR_OPS=ANALYSIS_KEY,
        REACTOR_WEBHOOK_SECRET_REACTOR_REPORTS_OPS=REPORTS_KEY,
    )
    proc = spawn("run", env=env)
    analysis, reports = receivers
    with psycopg.connect(database_url, autocommit=True) as conn:
        job_id = a_job_for_each_pair_once_listening(conn, proc)
        wait_for(lambda: analysis.calls and reports.calls, what="a call to each receiver")
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    now = time.time()
    for receiver, own, other in (
        (analysis, ANALYSIS_KEY, REPORTS_KEY),
        (reports, REPORTS_KEY, ANALYSIS_KEY),
    ):
        for header, body in receiver.calls:
            assert json.loads(body)["hook"] == "ops"
            assert verify_signature(own, header, body, now=now)
            assert not verify_signature(other, header, body, now=now)
    # Which pair's run each call is for: a job of the reference pair, a report of the other.
    assert all(json.loads(body)["job_id"] == str(job_id) for _, body in analysis.calls)
    assert all(json.loads(body)["job_id"] != str(job_id) for _, body in reports.calls)
    assert ANALYSIS_KEY not in stderr
    assert REPORTS_KEY not in stderr
