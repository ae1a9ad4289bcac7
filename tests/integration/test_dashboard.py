"""The operator's page in-process: one ``status`` however many tabs, probes that never wait on
it, and the actions' doors (Bearer, 403 without the token, 409 for a row that is not there);
the Host names it answers to, the body it reads and when, the session cookie, signing out, and
the throttle on wrong tokens."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
import psycopg
import pytest

from reactor import status
from reactor.install import REFERENCE_INSTALL
from reactor.ops import accept, dashboard, http
from tests.integration.conftest import StartReactor

pytestmark = pytest.mark.anyio

TOKEN = "integration-token-0123456789"
PROXIED = "https://reactor.internal.example/"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@asynccontextmanager
async def page_of(
    start_reactor: StartReactor, **settings: Any
) -> AsyncIterator[tuple[dashboard.Dashboard, str, aiohttp.ClientSession]]:
    """(the page, its base URL, a client session) of a reactor started with ``settings``."""
    async with start_reactor(**settings) as reactor:
        page = dashboard.for_reactor(reactor)
        async with (
            http.serving_page(page, ("127.0.0.1", 0)) as bound,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        ):
            assert bound is not None
            yield page, f"http://{bound[0]}:{bound[1]}", session


async def sign_in(
    session: aiohttp.ClientSession, base: str, **headers: str
) -> tuple[str, aiohttp.ClientResponse]:
    """Sign in with the token; returns (the session cookie's value, the response)."""
    async with session.post(
        f"{base}/login", data={"token": TOKEN}, headers=headers, allow_redirects=False
    ) as response:
        assert response.status == 303, await response.text()
        return response.cookies[dashboard.COOKIE].value, response


async def form_token(session: aiohttp.ClientSession, base: str, cookie: str) -> str:
    """The CSRF token of the page a signed-in browser is served."""
    async with session.get(f"{base}/", headers={"Cookie": f"{dashboard.COOKIE}={cookie}"}) as r:
        found = re.search(r'name="csrf" value="([^"]+)"', await r.text())
    assert found is not None, "no form token: not signed in"
    return found.group(1)


async def test_many_tabs_cost_one_status(start_reactor: StartReactor) -> None:
    async with start_reactor() as reactor:
        page = dashboard.for_reactor(reactor)
        async with (
            http.serving_page(page, ("127.0.0.1", 0)) as bound,
            aiohttp.ClientSession() as session,
        ):
            assert bound is not None
            base = f"http://{bound[0]}:{bound[1]}"
            bodies: list[Any] = []

            async def tab(path: str) -> None:
                async with session.get(base + path) as response:
                    assert response.status == 200
                    bodies.append(await response.text())

            async with anyio.create_task_group() as tg:
                for _ in range(10):
                    tg.start_soon(tab, "/")
                    tg.start_soon(tab, "/api/status")
            assert page.source.collections == 1
            async with session.get(base + "/api/status") as response:
                document = await response.json()
            async with reactor.database.pool.connection() as conn:
                collected = await status.collect(conn, reactor.database.install, reactor.settings)
                expected = status.as_json(collected)
            assert set(document) == {*expected, "replica"}
            assert document["verdict"]["state"] == "ok"
            assert document["replica"]["id"] == reactor.replica_id
            assert page.source.collections == 1


async def test_the_page_says_while_the_doorbell_is_awake(
    start_reactor: StartReactor, database_url: str
) -> None:
    async with page_of(start_reactor) as (page, base, session):

        async def shown() -> str:
            page.source.invalidate()
            async with session.get(f"{base}/") as response:
                assert response.status == 200
                return await response.text()

        assert "doorbell" not in await shown()
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute(
                "INSERT INTO reactor.doorbell VALUES (%s, now() + interval '1 hour')",
                (REFERENCE_INSTALL.channel,),
            )
        assert "doorbell awake 59m" in await shown()


async def test_a_hung_database_never_holds_a_probe(
    start_reactor: StartReactor, monkeypatch: pytest.MonkeyPatch
) -> None:
    collecting = anyio.Event()

    async def hang(*args: Any, **kwargs: Any) -> Any:
        collecting.set()
        await anyio.sleep_forever()

    async with start_reactor() as reactor:
        page = dashboard.for_reactor(reactor)
        page.source.timeout = 1.0
        monkeypatch.setattr(status, "collect", hang)
        async with (
            http.serving_page(page, ("127.0.0.1", 0)) as bound,
            http.serving(reactor, ("127.0.0.1", 0)) as probes,
            aiohttp.ClientSession() as session,
        ):
            assert bound is not None
            assert probes is not None
            base = f"http://{bound[0]}:{bound[1]}"
            async with anyio.create_task_group() as tg:

                async def open_page() -> None:
                    async with session.get(base + "/") as response:
                        assert response.status == 200
                        assert "did not answer within 1 s" in await response.text()

                tg.start_soon(open_page)
                # The page's request is inside the hung collection now.
                with anyio.fail_after(5):
                    await collecting.wait()
                # One event loop serves both: the page's wait holds up no probe.
                with anyio.fail_after(0.5):
                    async with session.get(f"http://{probes[0]}:{probes[1]}/healthz") as response:
                        assert response.status == 200
            async with session.get(base + "/api/status") as response:
                assert response.status == 503  # no report yet; the replica's view is there
                assert (await response.json())["replica"]["id"] == reactor.replica_id


async def test_the_actions_doors(start_reactor: StartReactor) -> None:
    for token in (None, TOKEN):
        async with page_of(start_reactor, dashboard_token=token) as (_, base, session):
            url = f"{base}/actions/hooks/retry"
            bearer = {"Authorization": f"Bearer {TOKEN}"}
            async with session.post(url, data={"id": "4242"}, headers=bearer) as response:
                if token is None:
                    assert response.status == 403
                    assert "read-only" in await response.text()
                    continue
                assert response.status == 409
                assert "no hook row with id 4242" in (await response.json())["error"]
            wrong = {"Authorization": "Bearer not-the-token-at-all"}
            async with session.post(url, data={"id": "1"}, headers=wrong) as response:
                assert response.status == 403
            # A cookie-less form from the page's own origin still needs a session.
            async with session.post(url, data={"id": "1"}) as response:
                assert response.status == 403
                assert "sign in" in await response.text()


async def test_the_page_has_no_probes_of_its_own(start_reactor: StartReactor) -> None:
    async with page_of(start_reactor) as (_, base, session):
        for path in ("/healthz", "/readyz", "/metrics"):
            async with session.get(base + path) as response:
                assert response.status == 404, path


async def test_the_page_answers_only_to_its_own_host_names(start_reactor: StartReactor) -> None:
    async with page_of(start_reactor, dashboard_url=PROXIED) as (_, base, session):
        port = base.rpartition(":")[2]
        answered = {}
        for host in (
            f"localhost:{port}",
            "LOCALHOST",
            f"127.0.0.1:{port}",
            "[::1]",
            f"[::1]:{port}",
            "reactor.internal.example",  # REACTOR_DASHBOARD_URL's host, as a proxy passes it on
            "reactor.internal.example:443",
            "evil.example",
            f"evil.example:{port}",  # a name rebound to 127.0.0.1
            "127.0.0.1.evil.example",
            "localhost@evil.example",
            "",
        ):
            async with session.get(f"{base}/api/status", headers={"Host": host}) as response:
                answered[host] = response.status
        refused = {host for host, code in answered.items() if code == 421}
        assert refused == {
            "evil.example",
            f"evil.example:{port}",
            "127.0.0.1.evil.example",
            "localhost@evil.example",
            "",
        }, answered
        assert {answered[host] for host in answered.keys() - refused} == {200}
        # Every door, not only the document: the page and its actions too.
        for method, path in (("GET", "/"), ("GET", "/login"), ("POST", "/login")):
            async with session.request(
                method, base + path, headers={"Host": "evil.example"}, data={"token": TOKEN}
            ) as response:
                assert response.status == 421, path
                assert "REACTOR_DASHBOARD_URL" in await response.text()


async def test_without_a_proxy_url_only_loopback_names_are_answered(
    start_reactor: StartReactor,
) -> None:
    async with (
        page_of(start_reactor) as (_, base, session),
        session.get(base, headers={"Host": "reactor.internal.example"}) as response,
    ):
        assert response.status == 421


async def test_a_strangers_post_is_refused_before_its_body_is_read(
    start_reactor: StartReactor,
) -> None:
    async with page_of(start_reactor, dashboard_token=TOKEN) as (_, base, _session):
        host, port = base.removeprefix("http://").split(":")
        for path, authorization in (
            ("/actions/hooks/retry", ""),
            ("/actions/hooks/cancel", "Authorization: Bearer not-the-token-at-all\r\n"),
            ("/actions/set-aside/release", f"Cookie: {dashboard.COOKIE}=forged\r\n"),
            ("/logout", ""),
        ):
            async with await anyio.connect_tcp(host, int(port)) as stream:
                # A head announcing a megabyte, and no byte of it: the answer comes all the same.
                await stream.send(
                    f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{authorization}"
                    "Content-Type: application/x-www-form-urlencoded\r\n"
                    "Content-Length: 1048576\r\n\r\n".encode()
                )
                with anyio.fail_after(3):
                    head = await stream.receive()
            assert head.startswith(b"HTTP/1.1 403 "), (path, head[:200])


async def test_a_body_past_64_kib_is_refused(start_reactor: StartReactor) -> None:
    async with page_of(start_reactor, dashboard_token=TOKEN) as (_, base, session):
        bearer = {"Authorization": f"Bearer {TOKEN}", **FORM}
        url = f"{base}/actions/hooks/retry"
        small = "id=4242&pad=" + "x" * (accept.MAX_BODY_BYTES - 1024)
        async with session.post(url, data=small, headers=bearer) as response:
            assert response.status == 409  # read and acted on: no such hook row
        large = "id=4242&pad=" + "x" * accept.MAX_BODY_BYTES
        async with session.post(url, data=large, headers=bearer) as response:
            assert response.status == 413


async def test_the_cookie_is_secure_behind_a_tls_proxy(start_reactor: StartReactor) -> None:
    async with page_of(start_reactor, dashboard_token=TOKEN) as (_, base, session):
        _, response = await sign_in(session, base)
        assert not response.cookies[dashboard.COOKIE]["secure"]  # plain HTTP, no proxy named
    settings = {"dashboard_token": TOKEN, "dashboard_url": PROXIED}
    async with page_of(start_reactor, **settings) as (_, base, session):
        # What the proxy sends on, TLS ended: plain HTTP, with the browser's Host and Origin.
        proxied = {"Host": "reactor.internal.example", "Origin": PROXIED.rstrip("/")}
        _, response = await sign_in(session, base, **proxied)
        cookie = response.cookies[dashboard.COOKIE]
        assert cookie["secure"]
        assert cookie["httponly"]
        assert cookie["samesite"] == "Strict"


async def test_signing_out_ends_the_session_here(start_reactor: StartReactor) -> None:
    async with page_of(start_reactor, dashboard_token=TOKEN) as (page, base, session):
        cookie, _ = await sign_in(session, base)
        csrf = await form_token(session, base, cookie)
        carried = {"Cookie": f"{dashboard.COOKIE}={cookie}"}
        retry = f"{base}/actions/hooks/retry"
        async with session.post(
            retry, data={"id": "4242", "csrf": csrf}, headers=carried, allow_redirects=False
        ) as response:
            assert response.status == 303  # acted: the note says there is no such row
        async with session.post(
            f"{base}/logout", data={"csrf": csrf}, headers=carried, allow_redirects=False
        ) as response:
            assert response.status == 303
            assert response.cookies[dashboard.COOKIE].value == ""
        # A copy of the cookie kept from before is worth nothing now.
        async with session.post(
            retry, data={"id": "4242", "csrf": csrf}, headers=carried, allow_redirects=False
        ) as response:
            assert response.status == 403
            assert "sign in" in await response.text()
        async with session.get(f"{base}/", headers=carried) as response:
            assert 'name="csrf"' not in await response.text()
        assert page.auth.sessions == 0


async def test_wrong_tokens_are_logged_and_throttled_per_address(
    start_reactor: StartReactor, caplog: pytest.LogCaptureFixture
) -> None:
    # Two clients: 127.0.0.1, and 127.0.0.2 (loopback too, on Linux), each with its own count.
    other = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
    async with (
        page_of(start_reactor, dashboard_token=TOKEN) as (page, base, session),
        aiohttp.ClientSession(connector=other) as neighbour,
    ):
        wrong = "wrong-token-" + "x" * 20
        caplog.set_level(logging.INFO, logger="reactor.dashboard")
        for _ in range(dashboard.MAX_FAILURES - 1):
            async with session.post(f"{base}/login", data={"token": wrong}) as response:
                assert response.status == 403
        # The neighbour signs in: that resets nobody's count but its own.
        await sign_in(neighbour, base)
        bearer = {"Authorization": f"Bearer {wrong}"}
        async with session.post(f"{base}/actions/hooks/retry", headers=bearer) as response:
            assert response.status == 403  # the fifth
        started = time.monotonic()
        for presented in (TOKEN, wrong):
            async with session.post(f"{base}/login", data={"token": presented}) as response:
                assert response.status == 429  # even the right token, while it lasts
                wait = int(response.headers["Retry-After"])
                assert 0 < wait <= dashboard.FAILURE_WINDOW_S
                assert "try again in" in await response.text()
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        async with session.post(f"{base}/actions/hooks/retry", headers=bearer) as response:
            assert response.status == 429
            assert "Retry-After" in response.headers
        # The neighbour is not held back.
        await sign_in(neighbour, base)
        assert page.throttle.clients == 1
        assert time.monotonic() - started < dashboard.FAILURE_WINDOW_S

    def logged(message: str, *names: str) -> list[tuple[Any, ...]]:
        return [
            tuple(getattr(r, name) for name in names)
            for r in caplog.records
            if r.getMessage() == message
        ]

    first_four = [("127.0.0.1", "sign-in")] * (dashboard.MAX_FAILURES - 1)
    assert logged("dashboard token refused", "client", "via") == [
        *first_four,
        ("127.0.0.1", "bearer"),
    ]
    assert logged("dashboard sign-in throttled", "client") == [("127.0.0.1",)]
    assert logged("dashboard sign-in", "client") == [("127.0.0.2",), ("127.0.0.2",)]
    for record in caplog.records:
        shown = record.getMessage() + repr(vars(record))
        assert TOKEN not in shown
        assert wrong not in shown
