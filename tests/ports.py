"""A free local port, what answers on one, and a reactor process serving there: for the tests
that start a server of the reactor's and ask it over HTTP."""

from __future__ import annotations

import signal
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.polling import wait_for


def free_port() -> int:
    """A port nothing listens on now (the system's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_status(url: str) -> int | None:
    """The status of GET ``url``, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            code: int = response.status
            return code
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def http_get(port: int, path: str, timeout: float = 10) -> tuple[int, str]:
    """(status, body) of GET ``path`` on 127.0.0.1:``port``, whatever its status."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def metrics_text(port: int) -> str:
    """What /metrics on ``port`` says."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text: str = response.read().decode()
        return text


@contextmanager
def serving(
    command: list[str], env: dict[str, str], log_path: Path, ready: str | None = None
) -> Iterator[subprocess.Popen[str]]:
    """The reactor process ``command`` starts, its output in ``log_path``, while the block runs
    (from when ``ready``, a URL, answers 200, if given); then stopped with SIGTERM, on which it
    must exit 0."""
    with log_path.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=log, text=True)
    try:
        if ready is not None:
            wait_for(lambda: http_status(ready) == 200 or proc.poll() is not None, 60)
            assert proc.poll() is None, log_path.read_text(encoding="utf-8")
        yield proc
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log_path.read_text(encoding="utf-8")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
