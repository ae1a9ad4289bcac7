"""Two ``reactor run`` processes on one host and one database, with the page's default address:
both run and become ready, and the one that finds the page's address taken says so once and
runs without it. An address the operator chose that is taken still stops startup."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from reactor.settings.config import Settings
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.acceptance.test_cli import assert_one_clean_line
from tests.polling import wait_for
from tests.ports import free_port, http_status, serving

PAGE_TAKEN = "not serving the operator's page"
PAGE_SERVED = "serving the operator's page"
_DEFAULT = Settings().dashboard_addr
assert _DEFAULT is not None
DEFAULT_PAGE: tuple[str, int] = _DEFAULT


def default_page_env(database_url: str, probes: int, **variables: str) -> dict[str, str]:
    """A replica's environment with its probes on ``probes`` and the page's address unset."""
    env = reactor_env(database_url, REACTOR_HTTP_ADDR=f"127.0.0.1:{probes}", **variables)
    del env["REACTOR_DASHBOARD_ADDR"]
    return env


def replica(env: dict[str, str], log_path: Path) -> AbstractContextManager[subprocess.Popen[str]]:
    """``reactor run`` while the block runs; stopped with SIGTERM (exit 0) after it."""
    return serving([sys.executable, "-m", "reactor", "run"], env, log_path)


def messages(log_path: Path) -> list[dict[str, Any]]:
    lines = log_path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def about_the_page(log_path: Path) -> list[dict[str, Any]]:
    return [r for r in messages(log_path) if r["message"].startswith((PAGE_TAKEN, PAGE_SERVED))]


def page_was_free() -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(DEFAULT_PAGE)
        except OSError:
            return False
    return True


def test_two_replicas_with_the_default_page_address_both_run(
    database_url: str, tmp_path: Path
) -> None:
    # Another program on this host may hold the page's default address already; then both
    # replicas run without the page, which is the point as well.
    free = page_was_free()
    probes = [free_port(), free_port()]
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    ready = [f"http://127.0.0.1:{port}/readyz" for port in probes]
    with replica(default_page_env(database_url, probes[0]), logs[0]) as first:
        wait_for(lambda: about_the_page(logs[0]) or first.poll() is not None, 60)
        assert first.poll() is None, logs[0].read_text(encoding="utf-8")
        with replica(default_page_env(database_url, probes[1]), logs[1]) as second:
            for url, proc, log_path in zip(ready, (first, second), logs, strict=True):
                wait_for(lambda: http_status(url) == 200 or proc.poll() is not None, 60)  # noqa: B023
                assert proc.poll() is None, log_path.read_text(encoding="utf-8")
            # The default address, set explicitly, is the operator's choice: taken, it stops
            # startup as any other.
            chosen = reactor_env(
                database_url, REACTOR_DASHBOARD_ADDR=f"{DEFAULT_PAGE[0]}:{DEFAULT_PAGE[1]}"
            )
            refused = run_reactor("run", env=chosen)
            line = assert_one_clean_line(refused, 2)
            assert "REACTOR_DASHBOARD_ADDR=127.0.0.1:9188: cannot listen" in line
            # Both stay ready meanwhile.
            assert [http_status(url) for url in ready] == [200, 200]
    first_said, second_said = (about_the_page(path) for path in logs)
    if free:
        assert [(r["level"], r["message"]) for r in first_said] == [("info", PAGE_SERVED)]
    else:
        assert [r["level"] for r in first_said] == ["warning"]
    assert [r["level"] for r in second_said] == ["warning"], second_said
    (warning,) = second_said
    assert warning["message"].startswith(PAGE_TAKEN)
    assert "REACTOR_DASHBOARD_ADDR" in warning["message"]
    assert warning["dashboard_addr"] == "127.0.0.1:9188"
