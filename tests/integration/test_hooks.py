"""Follow-up hooks on a real PostgreSQL: backoff, parking, hooks that raise SystemExit, the
drain, replicas, webhooks and their secrets, notify."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import socket
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import anyio
import psycopg
import pytest
from aiohttp import web

from reactor.hooks import IDEMPOTENCY_HEADER, HookCall
from reactor.hooks.signature import SIGNATURE_HEADER, verify_signature
from reactor.runtime.service import Reactor
from tests import hookmods
from tests.helpers import client_save, finish, new_job
from tests.integration.conftest import StartReactor
from tests.integration.support import serving
from tests.polling import eventually

pytestmark = pytest.mark.anyio


def outbox(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """(hook, status, attempts, last_error) of every outbox row."""
    return conn.execute(
        "SELECT hook, status, attempts, last_error FROM reactor.hook_outbox ORDER BY hook"
    ).fetchall()


async def first_row_becomes(conn: psycopg.Connection[Any], status: str) -> None:
    """Wait until the outbox's first row (by hook name) has ``status``."""
    await eventually(lambda: bool(outbox(conn)) and outbox(conn)[0][1] == status)


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
            await first_row_becomes(conn, "done")
        assert outbox(conn) == [("judge", "done", 3, None)]
    attempts = [(attempt, at) for _, attempt, at in hookmods.calls]
    assert [a for a, _ in attempts] == [1, 2, 3]
    # Retry n waits at least base * 2**(n-1): the jitter only adds.
    assert attempts[1][1] - attempts[0][1] >= backoff * 0.95
    assert attempts[2][1] - attempts[1][1] >= 2 * backoff * 0.95


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
            await first_row_becomes(conn, "failed")
            assert reactor.metrics.hook_outcomes.labels("judge", "failed")._value.get() == 1
            assert reactor.metrics.hook_outcomes.labels("judge", "retry")._value.get() == 2
        ((hook, status, attempts, error),) = outbox(conn)
        assert (hook, status, attempts) == ("judge", "failed", 3)
        assert error == "RuntimeError: judge says no"
    assert len(hookmods.calls) == 3


# Hooks of this module, as tests.integration.test_hooks:NAME.


async def exits(call: HookCall) -> None:
    """What a library that calls sys.exit() does to its caller."""
    hookmods.calls.append((call.idempotency_key, call.attempt, time.monotonic()))
    raise SystemExit(3)


async def interrupted(call: HookCall) -> None:
    """A KeyboardInterrupt raised by the hook's own code, not by a signal to the reactor."""
    hookmods.calls.append((call.idempotency_key, call.attempt, time.monotonic()))
    raise KeyboardInterrupt


async def hangs(call: HookCall) -> None:
    """Starts, then waits until it is cancelled."""
    hookmods.calls.append((call.idempotency_key, call.attempt, time.monotonic()))
    await anyio.sleep_forever()


@pytest.mark.parametrize(
    ("hook", "error"), [("exits", "SystemExit: 3"), ("interrupted", "KeyboardInterrupt")]
)
async def test_a_hook_raising_a_base_exception_fails_its_attempt_not_the_replica(
    database_url: str, start_reactor: StartReactor, hook: str, error: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(
            grace=0.1,
            hooks=f"judge=python:tests.integration.test_hooks:{hook},"
            "ops=python:tests.hookmods:count",
            hook_backoff=0.05,
            hook_max_attempts=2,
        ) as reactor:
            finish(conn, new_job(conn)[0])
            await eventually(lambda: [row[1] for row in outbox(conn)] == ["failed", "done"])
            outcomes = reactor.metrics.hook_outcomes
            assert outcomes.labels("judge", "retry")._value.get() == 1  # with its backoff
            assert outcomes.labels("judge", "failed")._value.get() == 1
            # The replica is still there, and runs what comes next.
            finish(conn, new_job(conn)[0])
            await eventually(
                lambda: [row[1] for row in outbox(conn)] == ["failed", "failed", "done", "done"]
            )
        judge = [row for row in outbox(conn) if row[0] == "judge"]
    assert judge == [("judge", "failed", 2, error), ("judge", "failed", 2, error)]
    tries = [at for key, _, at in hookmods.calls if key.endswith(":judge")]
    assert len(tries) == 4
    assert tries[1] - tries[0] >= 0.05 * 0.95  # retried on the schedule, not at once


async def test_a_drain_that_runs_out_still_hands_the_hook_back(
    database_url: str, start_reactor: StartReactor
) -> None:
    # The runner's own cancellation is no failure of the hook: it must still reach the hook,
    # and the row go back for the next replica, its attempt uncounted.
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(
            grace=0.1, drain=0.2, hooks="judge=python:tests.integration.test_hooks:hangs"
        ) as reactor:
            finish(conn, new_job(conn)[0])
            await eventually(lambda: hookmods.calls)
        assert outbox(conn) == [("judge", "pending", 0, None)]
        assert reactor.metrics.hook_outcomes.labels("judge", "released")._value.get() == 1
        assert reactor.metrics.hook_outcomes.labels("judge", "retry")._value.get() == 0


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
            await eventually(lambda: len(reactor.queue) == 0)
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


@dataclass
class Received:
    """One request the receiver got, as it arrived."""

    path: str
    method: str
    headers: dict[str, str]
    body: bytes
    at: float  # the receiver's wall clock, unix seconds


@dataclass
class Receiver:
    """A real HTTP server. POST /judge answers with the queued (status, headers), else 200;
    anything to /elsewhere answers 200, so a followed redirect would look delivered."""

    url: str
    elsewhere: str
    received: list[Received] = field(default_factory=list)
    answers: list[tuple[int, dict[str, str]]] = field(default_factory=list)

    def at(self, path: str) -> list[Received]:
        return [r for r in self.received if r.path == path]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    state = Receiver(f"{base}/judge", f"{base}/elsewhere")

    async def handle(request: web.Request) -> web.Response:
        state.received.append(
            Received(
                request.path, request.method, dict(request.headers), await request.read(),
                time.time(),
            )
        )  # fmt: skip
        if request.path == "/judge" and state.answers:
            status, headers = state.answers.pop(0)
            return web.Response(status=status, headers=headers)
        return web.Response(status=200)

    app = web.Application()
    app.router.add_route("*", "/judge", handle)
    app.router.add_route("*", "/elsewhere", handle)
    async with serving(app, port):
        yield state


SECRET = "s3cret-key"


def signing_webhook(
    start_reactor: StartReactor, receiver: Receiver
) -> AbstractAsyncContextManager[Reactor]:
    """A reactor whose judge hook posts to ``receiver``, signed with SECRET, retried quickly."""
    return start_reactor(
        grace=0.1, hooks=f"judge=webhook:{receiver.url}", webhook_secret=SECRET, hook_backoff=0.05
    )


def signed(secret: str, header: str, body: bytes) -> int:
    """The signature check written from docs/hooks.md alone: returns t, fails the test on a
    mismatch."""
    match = re.fullmatch(r"t=(\d+),v1=([0-9a-f]{64})", header)
    assert match, header
    t = match.group(1)
    expected = hmac.new(secret.encode(), t.encode() + b"." + body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(expected, match.group(2))
    return int(t)


async def test_webhook_is_signed_with_a_timestamp_and_retried(
    database_url: str, start_reactor: StartReactor, receiver: Receiver
) -> None:
    # 401 and 404 are what a receiver mid-deploy or mid-key-rotation answers: retried too.
    receiver.answers.extend([(503, {}), (429, {}), (404, {}), (401, {})])
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with signing_webhook(start_reactor, receiver):
            job_id, run_id = new_job(conn)
            finish(conn, job_id)
            await first_row_becomes(conn, "done")
        assert outbox(conn) == [("judge", "done", 5, None)]
    calls = receiver.at("/judge")
    assert len(calls) == 5
    for call in calls:
        header = call.headers[SIGNATURE_HEADER]
        t = signed(SECRET, header, call.body)
        assert abs(call.at - t) < 5  # signed when sent, by the sender's clock
        assert verify_signature(SECRET, header, call.body, now=call.at)
        # The same request replayed after the tolerance is refused.
        assert not verify_signature(SECRET, header, call.body, now=call.at + 301)
        assert call.headers[IDEMPOTENCY_HEADER] == f"{run_id}:{job_id}:judge"
    payloads = [json.loads(call.body) for call in calls]
    assert [p["attempt"] for p in payloads] == [1, 2, 3, 4, 5]
    assert {p["run_id"] for p in payloads} == {str(run_id)}


async def test_webhook_410_is_permanent(
    database_url: str, start_reactor: StartReactor, receiver: Receiver
) -> None:
    receiver.answers.append((410, {}))
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(grace=0.1, hooks=f"judge=webhook:{receiver.url}"):
            finish(conn, new_job(conn)[0])
            await first_row_becomes(conn, "failed")
        ((_, _, attempts, error),) = outbox(conn)
    assert attempts == 1
    assert error == f"HTTP 410 from {receiver.url}"
    assert len(receiver.received) == 1


async def test_a_301_parks_the_row_and_is_not_followed(
    database_url: str, start_reactor: StartReactor, receiver: Receiver
) -> None:
    receiver.answers.append((301, {"Location": f"{receiver.elsewhere}?token=zz-planted-9"}))
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(
            grace=0.1, hooks=f"judge=webhook:{receiver.url}", hook_backoff=0.05
        ):
            finish(conn, new_job(conn)[0])
            await first_row_becomes(conn, "failed")
        ((_, _, attempts, error),) = outbox(conn)
    # Followed, the POST would have become a GET to /elsewhere, answered 200: a false "done".
    assert receiver.at("/elsewhere") == []
    assert [r.method for r in receiver.received] == ["POST"]
    assert attempts == 1
    assert error == (
        f"HTTP 301 from {receiver.url} (a redirect to {receiver.elsewhere}; redirects are not "
        "followed)"
    )


async def test_a_307_is_retried_and_never_sends_the_body_elsewhere(
    database_url: str, start_reactor: StartReactor, receiver: Receiver
) -> None:
    receiver.answers.append((307, {"Location": receiver.elsewhere}))
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with signing_webhook(start_reactor, receiver):
            finish(conn, new_job(conn)[0])
            await first_row_becomes(conn, "done")
        assert [row[2] for row in outbox(conn)] == [2]
    # Followed, the signed body would have gone to the redirect's target at the first attempt.
    assert receiver.at("/elsewhere") == []
    calls = receiver.at("/judge")
    assert [(r.method, json.loads(r.body)["attempt"]) for r in calls] == [("POST", 1), ("POST", 2)]


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
                await first_row_becomes(conn, "done")
    assert payload["run_id"] == str(run_id)
    assert payload["job_id"] == str(job_id)
    assert payload["hook"] == "judge"
    assert payload["idempotency_key"] == f"{run_id}:{job_id}:judge"


# -- per-hook webhook secrets ---------------------------------------------------------------------

SHARED_SECRET = "shared-Wk3-secret"
JUDGE_SECRET = "judge-Zq8-secret"
OPS_SECRET = "ops-Mv5-secret"


async def leaks(call: HookCall) -> None:
    """A hook whose error message quotes every webhook secret."""
    raise RuntimeError(f"keys {JUDGE_SECRET}, {OPS_SECRET} and {SHARED_SECRET} refused")


async def test_each_webhook_signs_with_its_own_secret_or_the_shared_one(
    database_url: str,
    start_reactor: StartReactor,
    receiver: Receiver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    secrets = {"judge": JUDGE_SECRET, "ops-diag": OPS_SECRET, "audit": SHARED_SECRET}
    hooks = ",".join(f"{name}=webhook:{receiver.elsewhere}" for name in secrets)
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(
            grace=0.1,
            hooks=f"{hooks},leaky=python:tests.integration.test_hooks:leaks",
            webhook_secret=SHARED_SECRET,
            webhook_secrets={
                "REACTOR_WEBHOOK_SECRET_JUDGE": JUDGE_SECRET,
                "REACTOR_WEBHOOK_SECRET_OPS_DIAG": OPS_SECRET,
            },
            hook_max_attempts=1,
        ):
            finish(conn, new_job(conn)[0])
            await eventually(
                lambda: sorted(row[1] for row in outbox(conn)) == ["done"] * 3 + ["failed"]
            )
        stored = {hook: (status, error) for hook, status, _, error in outbox(conn)}
    signed_by = {}
    for call in receiver.at("/elsewhere"):
        hook = json.loads(call.body)["hook"]
        header = call.headers[SIGNATURE_HEADER]
        signed_by[hook] = [
            name
            for name, secret in secrets.items()
            if verify_signature(secret, header, call.body, now=call.at)
        ]
    # judge and ops-diag under secrets of their own; audit, which has none, under the shared one.
    assert signed_by == {"judge": ["judge"], "ops-diag": ["ops-diag"], "audit": ["audit"]}
    # Masked in stored errors, and never logged.
    assert stored["leaky"] == ("failed", "RuntimeError: keys ***, *** and *** refused")
    logged = caplog.text + " ".join(str(r.__dict__) for r in caplog.records)
    for secret in secrets.values():
        assert secret not in logged
