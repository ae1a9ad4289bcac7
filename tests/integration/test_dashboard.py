"""The operator's page in-process: one ``status`` however many tabs, probes that never wait on
it, and the actions' doors (Bearer, 403 without the token, 409 for a row that is not there)."""

from __future__ import annotations

from typing import Any

import aiohttp
import anyio
import pytest

from reactor import dashboard, http, status
from tests.integration.conftest import StartReactor

pytestmark = pytest.mark.anyio

TOKEN = "integration-token-0123456789"


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
                expected = status.as_json(await status.collect(conn, reactor.settings))
            assert set(document) == {*expected, "replica"}
            assert document["verdict"]["state"] == "ok"
            assert document["replica"]["id"] == reactor.replica_id
            assert page.source.collections == 1


async def test_a_hung_database_never_holds_a_probe(
    start_reactor: StartReactor, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def hang(*args: Any, **kwargs: Any) -> Any:
        await anyio.sleep_forever()

    async with start_reactor() as reactor:
        page = dashboard.for_reactor(reactor)
        page.source.timeout = 1.0
        monkeypatch.setattr(status, "collect", hang)
        async with (
            http.serving_page(page, ("127.0.0.1", 0)) as bound,
            aiohttp.ClientSession() as session,
        ):
            assert bound is not None
            base = f"http://{bound[0]}:{bound[1]}"
            async with anyio.create_task_group() as tg:

                async def open_page() -> None:
                    async with session.get(base + "/") as response:
                        assert response.status == 200
                        assert "did not answer within 1 s" in await response.text()

                tg.start_soon(open_page)
                await anyio.sleep(0.1)
                with anyio.fail_after(0.5):
                    async with session.get(base + "/healthz") as response:
                        assert response.status == 200
            async with session.get(base + "/api/status") as response:
                assert response.status == 503  # no report yet; the replica's view is there
                assert (await response.json())["replica"]["id"] == reactor.replica_id


async def test_the_actions_doors(start_reactor: StartReactor) -> None:
    for token in (None, TOKEN):
        async with start_reactor(dashboard_token=token) as reactor:
            page = dashboard.for_reactor(reactor)
            async with (
                http.serving_page(page, ("127.0.0.1", 0)) as bound,
                aiohttp.ClientSession() as session,
            ):
                assert bound is not None
                url = f"http://{bound[0]}:{bound[1]}/actions/hooks/retry"
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
