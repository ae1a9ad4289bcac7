"""Follow-up hooks on a real PostgreSQL: backoff, parking, replicas, webhook, notify."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import psycopg
import pytest
from aiohttp import web

from reactor.hooks import IDEMPOTENCY_HEADER, SIGNATURE_HEADER, backoff_delay
from tests import hookmods
from tests.helpers import client_save, finish, new_job
from tests.integration.conftest import StartReactor, eventually

pytestmark = pytest.mark.anyio


def outbox(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """(hook, status, attempts, last_error) of every outbox row."""
    return conn.execute(
        "SELECT hook, status, attempts, last_error FROM reactor.hook_outbox ORDER BY hook"
    ).fetchall()


@pytest.fixture(autouse=True)
def _reset_hooks() -> None:
    hookmods.reset()


async def test_fails_twice_then_succeeds_with_backoff(
    database_url: str, start_reactor: StartReactor
) -> None:
    backoff = 0.2
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(
            grace=0.1, hooks="judge=python:tests.hookmods:flaky", hook_backoff=backoff
        ):
            finish(conn, new_job(conn)[0])
            await eventually(lambda: outbox(conn) and outbox(conn)[0][1] == "done")
        assert outbox(conn) == [("judge", "done", 3, None)]
    attempts = [(attempt, at) for _, attempt, at in hookmods.calls]
    assert [a for a, _ in attempts] == [1, 2, 3]
    # Retry n waits at least base * 2**(n-1): the jitter only adds.
    assert attempts[1][1] - attempts[0][1] >= backoff * 0.95
    assert attempts[2][1] - attempts[1][1] >= 2 * backoff * 0.95


def test_backoff_grows_and_is_capped() -> None:
    assert 1.0 <= backoff_delay(1, 1.0) <= 2.0
    assert 8.0 <= backoff_delay(4, 1.0) <= 9.0
    assert backoff_delay(40, 1.0) == 600.0
    assert backoff_delay(3, 0.0) == 0.0


async def test_always_failing_hook_is_parked(
    database_url: str, start_reactor: StartReactor
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(
            grace=0.1,
            hooks="judge=python:tests.hookmods:always_fail",
            hook_backoff=0.05,
            hook_max_attempts=3,
        ) as reactor:
            finish(conn, new_job(conn)[0])
            await eventually(lambda: outbox(conn) and outbox(conn)[0][1] == "failed")
            assert reactor.metrics.hook_outcomes.labels("judge", "failed")._value.get() == 1
            assert reactor.metrics.hook_outcomes.labels("judge", "retry")._value.get() == 2
        ((hook, status, attempts, error),) = outbox(conn)
        assert (hook, status, attempts) == ("judge", "failed", 3)
        assert error == "RuntimeError: judge says no"
    assert len(hookmods.calls) == 3


async def test_client_saved_runs_get_no_hooks(
    database_url: str, start_reactor: StartReactor
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(grace=0.3, hooks="judge=python:tests.hookmods:count") as reactor:
            saved, _ = new_job(conn)
            finish(conn, saved)
            client_save(conn, saved)
            finish(conn, new_job(conn)[0])
            await eventually(lambda: hookmods.done)
            await eventually(lambda: len(reactor.deadlines) == 0)
        assert len(outbox(conn)) == 1


async def test_two_replicas_run_each_hook_once(
    database_url: str, start_reactor: StartReactor
) -> None:
    hooks = "judge=python:tests.hookmods:count,ops=python:tests.hookmods:count"
    jobs = 60
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with (
            start_reactor(grace=0.3, hooks=hooks),
            start_reactor(grace=0.3, hooks=hooks),
        ):
            for _ in range(jobs):
                finish(conn, new_job(conn)[0])
            # Done in the database, not just returned: the settle follows the call.
            await eventually(
                lambda: [row[1] for row in outbox(conn)] == ["done"] * (2 * jobs), timeout=30
            )
    assert len(hookmods.done) == 2 * jobs
    assert set(hookmods.done.values()) == {1}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
async def webhook_server() -> AsyncIterator[tuple[str, list[web.Request], list[bytes], list[int]]]:
    """A real HTTP server; answers with the statuses queued in the last list (else 200)."""
    requests: list[web.Request] = []
    bodies: list[bytes] = []
    statuses: list[int] = []

    async def handle(request: web.Request) -> web.Response:
        requests.append(request)
        bodies.append(await request.read())
        return web.Response(status=statuses.pop(0) if statuses else 200)

    app = web.Application()
    app.router.add_post("/judge", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/judge", requests, bodies, statuses
    finally:
        await runner.cleanup()


async def test_webhook_is_signed_and_retried(
    database_url: str,
    start_reactor: StartReactor,
    webhook_server: tuple[str, list[web.Request], list[bytes], list[int]],
) -> None:
    url, requests, bodies, statuses = webhook_server
    statuses.extend([503, 429])  # both retried; then 200
    secret = "s3cret-key"
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(
            grace=0.1, hooks=f"judge=webhook:{url}", webhook_secret=secret, hook_backoff=0.05
        ):
            job_id, run_id = new_job(conn)
            finish(conn, job_id)
            await eventually(lambda: outbox(conn) and outbox(conn)[0][1] == "done")
    assert len(requests) == 3
    for request, body in zip(requests, bodies, strict=True):
        fields = dict(part.split("=", 1) for part in request.headers[SIGNATURE_HEADER].split(","))
        assert abs(int(fields["t"]) - time.time()) < 60
        signed = fields["t"].encode() + b"." + body
        assert fields["v1"] == hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
        assert request.headers[IDEMPOTENCY_HEADER] == f"{run_id}:{job_id}:judge"
    payloads = [json.loads(body) for body in bodies]
    assert [p["attempt"] for p in payloads] == [1, 2, 3]
    assert {p["run_id"] for p in payloads} == {str(run_id)}


async def test_webhook_4xx_is_permanent(
    database_url: str,
    start_reactor: StartReactor,
    webhook_server: tuple[str, list[web.Request], list[bytes], list[int]],
) -> None:
    url, requests, _, statuses = webhook_server
    statuses.append(404)
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(grace=0.1, hooks=f"judge=webhook:{url}"):
            finish(conn, new_job(conn)[0])
            await eventually(lambda: outbox(conn) and outbox(conn)[0][1] == "failed")
        ((_, _, attempts, error),) = outbox(conn)
    assert attempts == 1
    assert "HTTP 404" in error
    assert len(requests) == 1


async def test_notify_hook_reaches_a_listener(
    database_url: str, start_reactor: StartReactor
) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as listener:
        await listener.execute("LISTEN judge_me")
        with psycopg.connect(database_url, autocommit=True) as conn:
            async with start_reactor(grace=0.1, hooks="judge=notify:judge_me"):
                job_id, run_id = new_job(conn)
                finish(conn, job_id)
                with anyio.fail_after(10):
                    async for notify in listener.notifies():
                        payload = json.loads(notify.payload)
                        break
                await eventually(lambda: outbox(conn) and outbox(conn)[0][1] == "done")
    assert payload["run_id"] == str(run_id)
    assert payload["job_id"] == str(job_id)
    assert payload["hook"] == "judge"
    assert payload["idempotency_key"] == f"{run_id}:{job_id}:judge"
