"""``/healthz``, ``/readyz`` and ``/metrics`` of a reactor running in-process, including readiness
going to 503 while PostgreSQL is down and back to 200 when it returns, with nobody's help."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import aiohttp
import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reactor import http
from reactor.errors import ConfigError
from reactor.service import Reactor
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.acceptance.test_cli import assert_one_clean_line, wait_for
from tests.conftest import Server
from tests.integration.conftest import StartReactor

Serve = Callable[..., AbstractAsyncContextManager[tuple[Reactor, str, aiohttp.ClientSession]]]


@pytest.fixture
def serve(start_reactor: StartReactor) -> Serve:
    """``async with serve(**settings) as (reactor, base_url, session)``: a reactor with its HTTP
    server on a free port of 127.0.0.1, and a client session."""

    @asynccontextmanager
    async def start(
        **overrides: Any,
    ) -> AsyncIterator[tuple[Reactor, str, aiohttp.ClientSession]]:
        async with (
            start_reactor(**overrides) as reactor,
            http.serving(reactor, ("127.0.0.1", 0)) as bound,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        ):
            assert bound is not None
            host, port = bound
            yield reactor, f"http://{host}:{port}", session

    return start


async def until(check: Callable[[], Awaitable[bool]], within: float) -> None:
    """Poll ``check`` until true: readiness lives in another task's state, with no event to wait
    for from outside, as an orchestrator's probe sees it."""
    with anyio.fail_after(within):
        while not await check():  # noqa: ASYNC110 -- polling from outside is the point
            await anyio.sleep(0.05)


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url) as response:
        if response.content_type == "application/json":
            return response.status, await response.json()
        return response.status, await response.text()


@pytest.mark.anyio
async def test_health_ready_and_metrics(serve: Serve) -> None:
    async with serve() as (reactor, base, session):
        assert await get(session, f"{base}/healthz") == (200, {"status": "alive"})

        async def ready() -> bool:
            status, _ = await get(session, f"{base}/readyz")
            return status == 200

        # Ready once the health check has seen the database and a delivery probe came back.
        await until(ready, 15)
        assert await get(session, f"{base}/readyz") == (200, {"ready": True, "reason": "ok"})

        async with session.get(f"{base}/metrics") as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            text = await response.text()
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        # Counters start at zero, labelled ones for every label value.
        for source in ("timer", "scan"):
            assert samples[("reactor_runs_recorded_total", (("source", source),))] == 0
        for result in ("accepted", "rejected"):
            assert samples[("reactor_notifications_total", (("result", result),))] == 0
        assert samples[("reactor_record_errors_total", ())] == 0
        assert samples[("reactor_listener_up", ())] == 1
        assert ("reactor_notification_queue_usage", ()) in samples
        # What the alert rules compare with (deploy/prometheus/alerts.yml).
        assert samples[("reactor_trim_horizon_seconds", ())] == reactor.settings.trim_horizon
        assert samples[("reactor_mode", (("mode", "listen"),))] == 1
        assert samples[("reactor_mode", (("mode", "poll"),))] == 0

        # OpenMetrics for a scraper that asks for it.
        headers = {"Accept": "application/openmetrics-text; version=1.0.0"}
        async with session.get(f"{base}/metrics", headers=headers) as response:
            assert response.headers["Content-Type"].startswith("application/openmetrics-text")
            assert (await response.text()).rstrip().endswith("# EOF")

        status, _ = await get(session, f"{base}/nothing")
        assert status == 404

        reactor.stop()
        assert await get(session, f"{base}/readyz") == (503, {"ready": False, "reason": "stopping"})
        status, _ = await get(session, f"{base}/healthz")
        assert status == 503


@pytest.mark.anyio
async def test_readiness_follows_the_database(serve: Serve, server: Server) -> None:
    embedded = server.embedded
    if embedded is None:
        pytest.skip("needs a PostgreSQL whose process the tests own")
    async with serve(probe_interval=0.5, probe_timeout=0.5) as (reactor, base, session):
        reasons: list[str] = []

        async def ready() -> bool:
            status, body = await get(session, f"{base}/readyz")
            if status != 200:
                assert (status, body["ready"]) == (503, False), body
                reasons.append(body["reason"])
            return status == 200

        async def unreachable() -> bool:
            return not await ready() and reasons[-1] == "database unreachable"

        await until(ready, 15)
        reasons.clear()
        try:
            # The server's own stop blocks; the reactor keeps running meanwhile. The listener
            # notices first (its connection drops), then the pool's next check.
            await anyio.to_thread.run_sync(embedded.stop)
            await until(unreachable, 30)
            assert all(
                reason in ("database unreachable", "waiting for the first delivery probe")
                or reason.startswith("LISTEN connection down: ")
                for reason in reasons
            ), reasons
            # Not ready is not dead: a database outage must not get the process restarted.
            assert (await get(session, f"{base}/healthz"))[0] == 200
        finally:
            await anyio.to_thread.run_sync(embedded.start)
        # The reactor recovers on its own: pool, LISTEN connection and delivery probe.
        await until(ready, 60)
        assert reactor.database_ok is True


@pytest.mark.anyio
async def test_taken_port_is_a_config_error(start_reactor: StartReactor) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with start_reactor() as reactor:
            with pytest.raises(ConfigError, match=rf"REACTOR_HTTP_ADDR=127\.0\.0\.1:{port}"):
                async with http.serving(reactor, ("127.0.0.1", port)):
                    pass


@pytest.mark.anyio
async def test_disabled_serves_nothing(start_reactor: StartReactor) -> None:
    async with start_reactor() as reactor, http.serving(reactor, None) as bound:
        assert bound is None


@pytest.mark.anyio
async def test_serve_http_in_a_task_group(start_reactor: StartReactor) -> None:
    async with start_reactor() as reactor, anyio.create_task_group() as tg:
        bound = await tg.start(http.serve_http, reactor, ("127.0.0.1", 0))
        host, port = bound
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://{host}:{port}/healthz") as response,
        ):
            assert response.status == 200
        tg.cancel_scope.cancel()
    with socket.socket() as probe:
        assert probe.connect_ex((host, port)) != 0  # closed with its task group


def free_port() -> int:
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


def test_reactor_run_serves_http(database_url: str) -> None:
    port = free_port()
    env = reactor_env(database_url, REACTOR_HTTP_ADDR=f"127.0.0.1:{port}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "reactor", "run"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Generous: on a loaded machine, start-up (imports, checks, LISTEN, probe) takes a while.
        wait_for(
            lambda: http_status(f"http://127.0.0.1:{port}/readyz") == 200 or proc.poll(),
            timeout=60,
        )
        assert proc.poll() is None, proc.communicate()[1]
        assert http_status(f"http://127.0.0.1:{port}/healthz") == 200
        assert http_status(f"http://127.0.0.1:{port}/metrics") == 200
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 0, stderr
        messages = [json.loads(line)["message"] for line in stderr.splitlines()]
        assert "serving /healthz, /readyz and /metrics" in messages
        assert http_status(f"http://127.0.0.1:{port}/healthz") is None  # closed on exit
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_reactor_run_with_a_taken_port_is_one_line_exit_2(database_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = reactor_env(database_url, REACTOR_HTTP_ADDR=f"127.0.0.1:{port}")
        line = assert_one_clean_line(run_reactor("run", env=env), 2)
    assert f"REACTOR_HTTP_ADDR=127.0.0.1:{port}" in line
