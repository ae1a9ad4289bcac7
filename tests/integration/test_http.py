"""``/healthz``, ``/readyz`` and ``/metrics`` of a reactor running in-process, including readiness
going to 503 while PostgreSQL is down and back to 200 when it returns, with nobody's help; and
what the HTTP servers let a client hold: the deadlines on a request's head and body and on
answers left unread, the cap on requests sent ahead of their answers, the caps on connections
and the place a new peer takes when all are taken, the loop's handling of a flood of failed
accept() calls."""

from __future__ import annotations

import asyncio
import json
import logging
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import anyio
import anyio.abc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reactor.errors import ConfigError
from reactor.ops import accept, http
from reactor.ops.admission import KEPT_FOR_NEW_PEERS
from reactor.ops.dashboard.routes import Served
from reactor.runtime.service import Reactor
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.acceptance.test_cli import assert_one_clean_line
from tests.conftest import Server
from tests.integration.conftest import StartReactor
from tests.integration.test_dashboard import TOKEN, page_of
from tests.polling import wait_for
from tests.ports import free_port, http_status

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


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def dropped(reactor: Served, server: str, reason: str) -> float:
    value: float = reactor.metrics.http_dropped.labels(server, reason)._value.get()
    return value


async def closed_by_server(stream: anyio.abc.SocketStream) -> None:
    """Return once the server has closed ``stream`` (EOF or a reset); data is ignored."""
    try:
        while await stream.receive():
            pass
    except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
        return


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
        served = samples(text)
        # Counters start at zero, labelled ones for every label value.
        for source in ("timer", "scan"):
            assert served[("reactor_runs_recorded_total", (("source", source),))] == 0
        for result in ("accepted", "rejected"):
            assert served[("reactor_notifications_total", (("result", result),))] == 0
        assert served[("reactor_record_errors_total", ())] == 0
        assert served[("reactor_listener_up", ())] == 1
        assert ("reactor_notification_queue_usage", ()) in served
        # What the alert rules compare with (deploy/prometheus/alerts.yml).
        assert served[("reactor_trim_horizon_seconds", ())] == reactor.settings.trim_horizon
        assert served[("reactor_mode", (("mode", "listen"),))] == 1
        assert served[("reactor_mode", (("mode", "poll"),))] == 0
        for server in ("probes", "page"):
            for reason in ("limit", "peer_limit", "head_timeout"):
                labels = (("reason", reason), ("server", server))
                assert served[("reactor_http_connections_dropped_total", labels)] == 0

        # OpenMetrics for a scraper that asks for it.
        headers = {"Accept": "application/openmetrics-text; version=1.0.0"}
        async with session.get(f"{base}/metrics", headers=headers) as response:
            assert response.headers["Content-Type"].startswith("application/openmetrics-text")
            assert (await response.text()).rstrip().endswith("# EOF")

        # The page is on an address of its own: the probes' server has none of it.
        for path in ("/nothing", "/", "/api/status", "/login"):
            status, _ = await get(session, f"{base}{path}")
            assert status == 404, path
        async with session.post(f"{base}/actions/hooks/retry", data={"id": "1"}) as response:
            assert response.status == 404

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


async def read_response(stream: anyio.abc.SocketStream) -> tuple[int, bytes]:
    """(status, body) of one HTTP/1.1 response read from ``stream``."""
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        buffer += await stream.receive()
    head, _, body = buffer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = {name.strip().lower(): value.strip() for name, _, value in
              (line.partition(":") for line in lines[1:])}  # fmt: skip
    while len(body) < int(fields.get("content-length", "0")):
        body += await stream.receive()
    return int(lines[0].split()[1]), body


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.mark.anyio
async def test_a_connection_without_a_request_head_is_closed_at_the_deadline(
    serve: Serve,
) -> None:
    async with serve() as (reactor, base, _):
        host, port = base.removeprefix("http://").split(":")
        started = time.monotonic()
        async with (
            await anyio.connect_tcp(host, int(port)) as silent,
            await anyio.connect_tcp(host, int(port)) as partial,
            await anyio.connect_tcp(host, int(port)) as prompt,
            await anyio.connect_tcp(host, int(port)) as later,
        ):
            await partial.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0")
            # A head in two parts, complete in time, is served, and the connection kept.
            await prompt.send(b"\r\nGET /healthz HTTP/1.1\r\n")
            await prompt.send(b"Host: 127.0.0.1\r\n\r\n")
            assert (await read_response(prompt))[0] == 200
            # A later head has its deadline too, from its first byte: not the keep-alive's.
            await later.send(HEALTHZ)
            assert (await read_response(later))[0] == 200
            await later.send(b"GET /heal")
            with anyio.fail_after(accept.HEAD_SECONDS + 5):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(closed_by_server, silent)
                    tg.start_soon(closed_by_server, partial)
                    tg.start_soon(closed_by_server, later)
            waited = time.monotonic() - started
            assert accept.HEAD_SECONDS - 0.5 <= waited < accept.HEAD_SECONDS + 5
            assert accept.HEAD_SECONDS + 5 < accept.KEEPALIVE_SECONDS
            assert dropped(reactor, "probes", "head_timeout") == 3
            # The one that sent its head in time is still open: the keep-alive governs it now.
            await prompt.send(HEALTHZ)
            assert (await read_response(prompt))[0] == 200
        assert dropped(reactor, "probes", "limit") == 0


@pytest.mark.anyio
async def test_connections_past_the_caps_are_closed_at_once(serve: Serve) -> None:
    """One peer address holds at most its own cap; peers holding connections share all but the
    kept places, which go to peers holding none; past all of them, even a new peer waits."""
    async with serve() as (reactor, base, session), AsyncExitStack() as stack:
        host, port = base.removeprefix("http://").split(":")

        async def connect(peer: str) -> anyio.abc.SocketStream:
            return await anyio.connect_tcp(host, int(port), local_host=peer)

        async def hold(peer: str) -> anyio.abc.SocketStream:
            stream = await stack.enter_async_context(await connect(peer))
            await stream.send(HEALTHZ)
            assert (await read_response(stream))[0] == 200  # admitted, and kept alive
            return stream

        async def refused(peer: str) -> None:
            started = time.monotonic()
            async with await connect(peer) as over:
                with anyio.fail_after(accept.HEAD_SECONDS / 2):
                    await closed_by_server(over)
            assert time.monotonic() - started < accept.HEAD_SECONDS / 2

        async def answered(peer: str) -> None:
            async with await connect(peer) as stream:
                await stream.send(HEALTHZ)
                assert (await read_response(stream))[0] == 200

        held = [await hold("127.0.1.1") for _ in range(accept.MAX_PER_PEER)]
        await refused("127.0.1.1")
        assert dropped(reactor, "probes", "peer_limit") == 1
        await answered("127.0.0.1")  # another peer is not held back by it
        # Five more peers at their caps take what peers holding connections may share.
        shared = accept.MAX_CONNECTIONS - KEPT_FOR_NEW_PEERS
        for n in range(2, 2 + shared // accept.MAX_PER_PEER - 1):
            held += [await hold(f"127.0.1.{n}") for _ in range(accept.MAX_PER_PEER)]
        assert len(held) == shared
        # A new peer takes a kept place, but its second connection would be a shared one.
        held.append(await hold("127.0.2.1"))
        await refused("127.0.2.1")
        assert dropped(reactor, "probes", "limit") == 1
        # The other kept places, one per new peer; then none is left: a new peer takes the
        # oldest place of the peer that holds the most, which is cut at once.
        held += [await hold(f"127.0.2.{n}") for n in range(2, KEPT_FOR_NEW_PEERS + 1)]
        assert len(held) == accept.MAX_CONNECTIONS
        await answered("127.0.3.1")
        with anyio.fail_after(accept.HEAD_SECONDS / 2):
            await closed_by_server(held.pop(0))
        assert dropped(reactor, "probes", "made_room") == 1
        # Its peer holds one fewer, and cannot take the place back while all are taken.
        await answered("127.0.3.2")
        await refused("127.0.1.1")
        assert dropped(reactor, "probes", "limit") == 2
        assert dropped(reactor, "probes", "peer_limit") == 1
        # Those held are served as before.
        await held[0].send(HEALTHZ)
        assert (await read_response(held[0]))[0] == 200
        # A place freed is a place taken.
        await held.pop().aclose()

        async def healthy() -> bool:
            try:
                return (await get(session, f"{base}/healthz"))[0] == 200
            except aiohttp.ClientError:
                return False

        await until(healthy, 5)


@pytest.mark.anyio
async def test_requests_sent_ahead_of_their_answers_are_capped(serve: Serve) -> None:
    async with serve() as (reactor, base, _):
        host, port = base.removeprefix("http://").split(":")
        async with await anyio.connect_tcp(host, int(port)) as stream:
            # As many as one may send ahead: each answered, in order, and the connection kept.
            await stream.send(HEALTHZ * accept.MAX_PIPELINED)
            buffered = b""
            with anyio.fail_after(5):
                while buffered.count(b"HTTP/1.1 200 ") < accept.MAX_PIPELINED:
                    buffered += await stream.receive()
            await stream.send(HEALTHZ)
            assert (await read_response(stream))[0] == 200
        async with await anyio.connect_tcp(host, int(port)) as stream:
            # One more, and the connection is closed: none of them is answered.
            await stream.send(HEALTHZ * (accept.MAX_PIPELINED + 1))
            with anyio.fail_after(5):
                await closed_by_server(stream)
        assert dropped(reactor, "probes", "pipelined") == 1


async def trickle(stream: anyio.abc.SocketStream, every: float) -> None:
    """Send ``stream`` a byte every ``every`` seconds until the server closes it."""
    try:
        while True:
            await stream.send(b"x")
            await anyio.sleep(every)
    except (anyio.BrokenResourceError, ConnectionError):
        return


async def trickled_until_closed(host: str, port: int, head: bytes) -> float:
    """Send ``head`` (which declares a body) to (host, port), then its body a byte every 0.2 s:
    the seconds until the server closed the connection."""
    started = time.monotonic()
    async with await anyio.connect_tcp(host, port) as stream:
        await stream.send(head)
        with anyio.fail_after(accept.BODY_SECONDS + 5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(trickle, stream, 0.2)
                await closed_by_server(stream)
                tg.cancel_scope.cancel()
    return time.monotonic() - started


@pytest.mark.anyio
async def test_a_trickled_body_is_closed_at_its_deadline(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(accept, "BODY_SECONDS", 1.0)
    async with serve() as (reactor, base, _):
        host, port = base.removeprefix("http://").split(":")
        head = HEALTHZ.replace(b"\r\n\r\n", b"\r\nContent-Length: 1000\r\n\r\n")
        waited = await trickled_until_closed(host, int(port), head)
        chunked = HEALTHZ.replace(b"\r\n\r\n", b"\r\nTransfer-Encoding: chunked\r\n\r\n")
        waited_chunked = await trickled_until_closed(host, int(port), chunked + b"400\r\n")
        assert dropped(reactor, "probes", "body_timeout") == 2
    for seconds in (waited, waited_chunked):
        assert accept.BODY_SECONDS - 0.1 <= seconds < accept.BODY_SECONDS + 5


@pytest.mark.anyio
async def test_a_form_trickled_to_the_page_is_closed_at_its_deadline(
    start_reactor: StartReactor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sign-in reads its form before anyone is known: its body has a deadline too."""
    monkeypatch.setattr(accept, "BODY_SECONDS", 1.0)
    async with page_of(start_reactor, dashboard_token=TOKEN) as (page, base, _):
        host, port = base.removeprefix("http://").split(":")
        head = (
            f"POST /login HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: {base}\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\n"
        ).encode()
        waited = await trickled_until_closed(host, int(port), head)
        reactor = page.replica()
        assert reactor is not None
        assert dropped(reactor, "page", "body_timeout") == 1
    assert accept.BODY_SECONDS - 0.1 <= waited < accept.BODY_SECONDS + 5


def cut_after(sock: socket.socket, timeout: float) -> float | None:
    """Seconds until the server cut ``sock`` (a reset: an error or a hang-up, seen without
    reading a byte), or None after ``timeout``."""
    started = time.monotonic()
    poller = select.poll()
    poller.register(sock, select.POLLERR | select.POLLHUP)
    return time.monotonic() - started if poller.poll(timeout * 1000) else None


@pytest.mark.anyio
async def test_answers_left_unread_are_cut_at_the_stall_deadline(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(accept, "WRITE_STALL_SECONDS", 1.0)
    # A kernel buffer smaller than the answers: the rest waits in the process, unread.
    monkeypatch.setattr(accept, "SEND_BUFFER_BYTES", 4096)
    async with serve() as (reactor, base, session):
        host, port = base.removeprefix("http://").split(":")
        with socket.socket() as sock:
            # A window shut after a kilobyte: the answers stay with the server, which waits for
            # the peer to take them, a connection's place and all.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            sock.connect((host, int(port)))
            metrics = HEALTHZ.replace(b"/healthz", b"/metrics")
            sock.sendall(metrics * accept.MAX_PIPELINED)
            waited = await anyio.to_thread.run_sync(cut_after, sock, accept.KEEPALIVE_SECONDS)
        assert dropped(reactor, "probes", "write_stall") == 1
        # One who reads is answered as before.
        assert (await get(session, f"{base}/healthz"))[0] == 200
    assert waited is not None
    assert accept.WRITE_STALL_SECONDS - 0.1 <= waited < accept.WRITE_STALL_SECONDS + 5


@pytest.mark.anyio
async def test_a_flood_of_failed_accepts_is_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()
    passed_on: list[dict[str, Any]] = []

    def before(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        passed_on.append(context)

    loop.set_exception_handler(before)
    failed = {"message": accept.ACCEPT_FAILED, "exception": OSError(24, "Too many open files")}
    try:
        with caplog.at_level(logging.INFO, logger="reactor.http"):
            with accept.accept_errors_counted(interval=3600):
                for _ in range(10_000):
                    loop.call_exception_handler(failed)
                loop.call_exception_handler({"message": "something else"})
                lines = [r for r in caplog.records if r.name == "reactor.http"]
                assert [(r.levelname, getattr(r, "times", None)) for r in lines] == [("ERROR", 1)]
                assert "Too many open files" in getattr(lines[0], "error", "")
            # On the way out, what was held back is reported in one line.
            lines = [r for r in caplog.records if r.name == "reactor.http"]
            assert [getattr(r, "times", None) for r in lines] == [1, 9_999]
        # Anything else goes where it went before, and the handler is put back.
        assert passed_on == [{"message": "something else"}]
        assert loop.get_exception_handler() is before
    finally:
        loop.set_exception_handler(None)


def test_reactor_run_serves_http(database_url: str) -> None:
    port, page = free_port(), free_port()
    env = reactor_env(
        database_url,
        REACTOR_HTTP_ADDR=f"127.0.0.1:{port}",
        REACTOR_DASHBOARD_ADDR=f"127.0.0.1:{page}",
    )
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
        # Each address serves its own: the page on one, the probes on the other.
        assert http_status(f"http://127.0.0.1:{port}/") == 404
        assert http_status(f"http://127.0.0.1:{port}/api/status") == 404
        assert http_status(f"http://127.0.0.1:{page}/") == 200
        assert http_status(f"http://127.0.0.1:{page}/api/status") == 200
        assert http_status(f"http://127.0.0.1:{page}/healthz") == 404
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 0, stderr
        records = {record["message"]: record for record in map(json.loads, stderr.splitlines())}
        assert records["serving /healthz, /readyz and /metrics"]["http_addr"] == f"127.0.0.1:{port}"
        shown = records["serving the operator's page"]
        assert shown["page"] == f"http://127.0.0.1:{page}/"
        assert shown["page_actions"] is False
        for closed in (port, page):  # closed on exit
            assert http_status(f"http://127.0.0.1:{closed}/") is None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("variable", ["REACTOR_HTTP_ADDR", "REACTOR_DASHBOARD_ADDR"])
def test_reactor_run_with_a_taken_port_is_one_line_exit_2(database_url: str, variable: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = reactor_env(database_url, **{variable: f"127.0.0.1:{port}"})
        line = assert_one_clean_line(run_reactor("run", env=env), 2)
    assert f"{variable}=127.0.0.1:{port}" in line
