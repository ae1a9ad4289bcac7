"""Traces on a real PostgreSQL: the spans of the scan, the record statements, the reconcile and
the hooks, the traceparent a real webhook receiver gets, and no secret in any span.

Spans go to the SDK's in-memory exporter through :func:`reactor.telemetry.tracing.use`, so no global
TracerProvider is installed and the other tests of the worker trace nothing.
"""

from __future__ import annotations

import json
import socket
import textwrap
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import psycopg
import pytest
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from reactor.hooks import HookCall, WebhookHook
from reactor.hooks.signature import SIGNATURE_HEADER, verify_signature
from reactor.install import REFERENCE_INSTALL
from reactor.runtime.replica import open_replica
from reactor.runtime.service import Reactor
from reactor.settings.config import Settings
from reactor.settings.pairs import Pair
from reactor.telemetry import tracing
from tests import hookmods
from tests.helpers import finish, new_job, python_without_otel
from tests.integration.conftest import StartReactor
from tests.integration.support import add_job, scalar, serving
from tests.polling import eventually

pytestmark = pytest.mark.anyio


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    try:
        yield exporter
    finally:
        tracing.use(None)
        provider.shutdown()


@pytest.fixture(autouse=True)
def _reset_hooks() -> None:
    hookmods.reset()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    """The span's attributes, sequences as lists."""
    found = dict(span.attributes or {})
    return {k: list(v) if isinstance(v, tuple) else v for k, v in found.items()}


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    found: int = span.context.span_id
    return found


def outbox(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT hook, status, attempts FROM reactor.hook_outbox ORDER BY hook"
    ).fetchall()


def _due(conn: psycopg.Connection[Any], count: int) -> list[str]:
    return [
        str(add_job(conn, status="complete", results={"ok": i}, age=30)[0]) for i in range(count)
    ]


@asynccontextmanager
async def idle_reactor(database_url: str) -> AsyncIterator[Reactor]:
    """A reactor that is not running: no timer races its scan, which the test calls."""
    settings = Settings(database_url=database_url, grace=0.5, http_addr=None)
    pair = Pair(REFERENCE_INSTALL, settings)
    async with open_replica(settings, [pair]) as replica:
        yield replica.reactors[pair.name]


async def test_the_scan_span_holds_its_record_statements(
    database_url: str, spans: InMemorySpanExporter
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        due = _due(conn, 3)
    async with idle_reactor(database_url) as reactor:
        assert await reactor.scan(rearm=True) == 3
    (scan,) = named(spans, "reactor.scan")
    assert attrs(scan) == {"reactor.rearm": True, "reactor.recorded": 3}
    assert scan.status.status_code is StatusCode.UNSET
    records = [s for s in named(spans, "reactor.record") if parent_of(s) == span_id(scan)]
    assert len(records) == 1
    record = attrs(records[0])
    assert sorted(record.pop("reactor.job_ids")) == sorted(due)
    assert record == {
        "reactor.source": "scan",
        "reactor.limit": 500,
        "reactor.jobs.count": 3,
        "reactor.recorded": 3,
    }
    # The scan is the root of its trace: the statement shares its trace id.
    assert scan.parent is None
    assert records[0].context is not None
    assert scan.context is not None
    assert records[0].context.trace_id == scan.context.trace_id


async def test_a_big_batch_is_counted_not_listed(
    database_url: str, spans: InMemorySpanExporter
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        _due(conn, tracing.JOB_IDS_SHOWN + 15)
    async with idle_reactor(database_url) as reactor:
        await reactor.scan(rearm=False)
    (record,) = [attrs(s) for s in named(spans, "reactor.record")]
    assert record["reactor.jobs.count"] == tracing.JOB_IDS_SHOWN + 15
    assert "reactor.job_ids" not in record


async def test_the_timer_records_in_a_span_of_its_own(
    database_url: str, start_reactor: StartReactor, spans: InMemorySpanExporter
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(grace=0.2):
            job_id, _ = new_job(conn)
            finish(conn, job_id)

            def timer_records() -> list[ReadableSpan]:
                found = named(spans, "reactor.record")
                return [s for s in found if attrs(s)["reactor.source"] == "timer"]

            (record,) = await eventually(timer_records)
    assert attrs(record) == {
        "reactor.source": "timer",
        "reactor.jobs.count": 1,
        "reactor.job_ids": [str(job_id)],
        "reactor.recorded": 1,
    }
    assert record.parent is None


async def test_a_failed_statement_is_an_error_span_and_its_parts_follow(
    database_url: str, spans: InMemorySpanExporter
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "ALTER TABLE analysis_runs ADD CONSTRAINT no_flagged CHECK (NOT results ? 'flagged')"
        )
        bad = str(add_job(conn, status="complete", results={"flagged": True}, age=60)[0])
        _due(conn, 4)
        async with idle_reactor(database_url) as reactor:
            assert await reactor.scan(rearm=False) == 4
        (scan,) = named(spans, "reactor.scan")
        assert scalar(conn, "SELECT count(*) FROM analysis_runs") == 4
    records = [s for s in named(spans, "reactor.record") if parent_of(s) == span_id(scan)]
    failed = [s for s in records if s.status.status_code is StatusCode.ERROR]
    for span in failed:
        assert span.status.description is not None
        assert span.status.description.startswith("CheckViolation: ")
        (event,) = span.events
        assert event.name == "exception"
        assert event.attributes is not None
        assert event.attributes["exception.type"] == "psycopg.errors.CheckViolation"
        assert "no_flagged" in str(event.attributes["exception.message"])
    # The whole batch (its jobs unknown until it returns), then the part holding the rejected
    # job alone, which names it.
    assert [attrs(s).get("reactor.job_ids") for s in failed] == [None, [bad]]
    assert sum(attrs(s).get("reactor.recorded", 0) for s in records) == 4
    assert attrs(scan)["reactor.recorded"] == 4


async def test_reconcile_steps_are_spans(
    database_url: str, start_reactor: StartReactor, spans: InMemorySpanExporter
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        finish(conn, new_job(conn)[0])
        async with start_reactor(reconcile_interval=60.0):
            steps = await eventually(lambda: named(spans, "reactor.reconcile"))
    step = attrs(steps[0])
    assert step["reactor.outcome"] in ("stepped", "completed", "idle", "busy")
    assert isinstance(step["reactor.found"], int)
    assert steps[0].status.status_code is StatusCode.UNSET


async def test_hook_attempts_carry_their_outcome_and_a_failure_its_error(
    database_url: str, start_reactor: StartReactor, spans: InMemorySpanExporter
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(
            grace=0.1,
            hooks="judge=python:tests.hookmods:always_fail,ops=python:tests.hookmods:count",
            hook_backoff=0.05,
            hook_max_attempts=2,
        ):
            job_id, run_id = new_job(conn)
            finish(conn, job_id)
            await eventually(lambda: len(named(spans, "reactor.hook")) == 3)
        assert outbox(conn) == [("judge", "failed", 2), ("ops", "done", 1)]
    hooks = sorted(
        named(spans, "reactor.hook"),
        key=lambda s: (attrs(s)["reactor.hook"], attrs(s)["reactor.attempt"]),
    )
    common = {"reactor.hook_kind": "python", "reactor.run_id": str(run_id)}
    common["reactor.job_id"] = str(job_id)
    assert [attrs(s) for s in hooks] == [
        {**common, "reactor.hook": "judge", "reactor.attempt": 1, "reactor.outcome": "retry"},
        {**common, "reactor.hook": "judge", "reactor.attempt": 2, "reactor.outcome": "failed"},
        {**common, "reactor.hook": "ops", "reactor.attempt": 1, "reactor.outcome": "done"},
    ]
    assert [(s.status.status_code, s.status.description) for s in hooks] == [
        (StatusCode.ERROR, "RuntimeError: judge says no"),
        (StatusCode.ERROR, "RuntimeError: judge says no"),
        (StatusCode.UNSET, None),
    ]


# -- webhooks -------------------------------------------------------------------------------------


@dataclass
class Receiver:
    """A real HTTP server on the loopback: answers the queued statuses, then 200."""

    base: str
    received: list[tuple[str, dict[str, str], bytes, float]] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = Receiver(f"http://127.0.0.1:{port}")

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        state.received.append((request.path, dict(request.headers), body, time.time()))
        return web.Response(status=state.answers.pop(0) if state.answers else 200)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    async with serving(app, port):
        yield state


def traceparent(span: ReadableSpan) -> str:
    context = span.context
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


async def test_a_webhook_carries_its_attempts_traceparent_and_stays_signed(
    database_url: str,
    start_reactor: StartReactor,
    spans: InMemorySpanExporter,
    receiver: Receiver,
) -> None:
    receiver.answers.append(503)
    secret = "s3cret-key"
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(
            grace=0.1,
            hooks=f"judge=webhook:{receiver.base}/judge",
            webhook_secret=secret,
            hook_backoff=0.05,
        ):
            finish(conn, new_job(conn)[0])
            await eventually(lambda: len(named(spans, "reactor.hook")) == 2)
    attempts = sorted(named(spans, "reactor.hook"), key=lambda s: attrs(s)["reactor.attempt"])
    assert [len(receiver.received), len(attempts)] == [2, 2]
    for (path, headers, body, at), span in zip(receiver.received, attempts, strict=True):
        assert path == "/judge"
        # Each attempt's own span is the parent the receiver continues from.
        assert headers["traceparent"] == traceparent(span)
        # The header is not part of what is signed: the signature still verifies.
        assert verify_signature(secret, headers[SIGNATURE_HEADER], body, now=at)
        assert attrs(span)["reactor.hook_kind"] == "webhook"
    assert [attrs(s)["http.response.status_code"] for s in attempts] == [503, 200]
    assert [attrs(s)["reactor.outcome"] for s in attempts] == ["retry", "done"]
    assert attempts[0].status.status_code is StatusCode.ERROR
    assert attempts[0].status.description == f"RuntimeError: HTTP 503 from {receiver.base}/judge"
    assert attempts[1].status.status_code is StatusCode.UNSET


async def test_a_webhook_sends_the_receiver_no_baggage_of_the_embedding_app(
    spans: InMemorySpanExporter, receiver: Receiver
) -> None:
    # The app embedding the reactor runs it inside its own context, baggage and all; the
    # default propagators would send that baggage (here an e-mail address) to the receiver.
    from opentelemetry import baggage, context

    token = context.attach(baggage.set_baggage("user.email", "alice@example.com"))
    try:
        async with aiohttp.ClientSession() as session:
            hook = WebhookHook(
                "judge", "webhook:x", f"{receiver.base}/judge", None, lambda: session
            )
            call = HookCall(run_id="r", job_id="j", hook="judge", attempt=1, idempotency_key="k")
            with tracing.span("reactor.hook"):
                await hook(call)
    finally:
        context.detach(token)
    ((_, headers, _, _),) = receiver.received
    sent = {name.lower() for name in headers}
    assert "traceparent" in sent
    assert "baggage" not in sent
    assert "alice@example.com" not in json.dumps(headers)


async def test_a_webhook_sends_no_traceparent_while_tracing_is_off(
    database_url: str, start_reactor: StartReactor, receiver: Receiver
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(grace=0.1, hooks=f"judge=webhook:{receiver.base}/judge"):
            finish(conn, new_job(conn)[0])
            await eventually(lambda: outbox(conn) == [("judge", "done", 1)])
    ((_, headers, _, _),) = receiver.received
    assert "traceparent" not in {name.lower() for name in headers}


# -- secrets --------------------------------------------------------------------------------------

SHARED_SECRET = "shared-Planted-1"
OWN_SECRET = "own-Planted-2"
URL_PASSWORD = "pw-Planted-3"
URL_TOKEN = "tok-Planted-4"
PLANTED = (SHARED_SECRET, OWN_SECRET, URL_PASSWORD, URL_TOKEN)


async def leaks(call: HookCall) -> None:
    """A hook whose error quotes every secret, and a URL with credentials."""
    raise RuntimeError(
        f"refused {SHARED_SECRET} {OWN_SECRET} at http://u:{URL_PASSWORD}@h/x?t={URL_TOKEN}"
    )


def _span_text(exported: Sequence[ReadableSpan]) -> str:
    """Everything a span carries that a person or a backend sees, as text."""
    parts: list[str] = []
    for span in exported:
        parts += [span.name, str(span.status.description), json.dumps(dict(span.attributes or {}))]
        for event in span.events:
            parts.append(json.dumps(dict(event.attributes or {})))
    return "\n".join(parts)


async def test_no_span_carries_a_planted_secret(
    database_url: str,
    start_reactor: StartReactor,
    spans: InMemorySpanExporter,
    receiver: Receiver,
) -> None:
    authority = receiver.base.replace("http://", f"http://user:{URL_PASSWORD}@")
    hooks = (
        f"judge=webhook:{authority}/judge?token={URL_TOKEN},"
        f"gone=webhook:{authority}/gone?token={URL_TOKEN},"
        "leaky=python:tests.integration.test_tracing:leaks"
    )
    receiver.answers.append(500)
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(
            grace=0.1,
            hooks=hooks,
            webhook_secret=SHARED_SECRET,
            webhook_secrets={"REACTOR_WEBHOOK_SECRET_JUDGE": OWN_SECRET},
            hook_max_attempts=1,
        ):
            finish(conn, new_job(conn)[0])
            await eventually(lambda: len(named(spans, "reactor.hook")) == 3)
    exported = spans.get_finished_spans()
    text = _span_text(exported)
    assert "leaky" in text
    assert "RuntimeError: refused *** ***" in text
    for secret in PLANTED:
        assert secret not in text
    # Nor in a header the receiver got besides the signature's own.
    for _, headers, _, _ in receiver.received:
        assert not any(s in v for s in PLANTED for v in headers.values())


# -- without the extra ----------------------------------------------------------------------------

_SCRIPT = textwrap.dedent(
    """
    import importlib.abc, json, sys

    if sys.argv[2] == "absent":
        class Absent(importlib.abc.MetaPathFinder):
            # What an install without the otel extra looks like to an import.
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "opentelemetry":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None
        sys.meta_path.insert(0, Absent())

    import anyio
    import psycopg
    # The console script's module, imported as the console script imports it: what it imports
    # is in the sys.modules this script prints last.
    from reactor.cli import commands as cli  # noqa: F401
    from reactor.settings.config import Settings
    from reactor.install import REFERENCE_INSTALL
    from reactor.settings.pairs import Pair
    from reactor.runtime.replica import open_replica
    from tests import hookmods

    JOB = (
        "INSERT INTO analysis_jobs (id, run_id, status, doc_html, results, updated_at) VALUES"
        " (gen_random_uuid(), gen_random_uuid(), 'complete', '<p/>', '[1]',"
        " now() - %s::interval)"
    )

    async def main():
        settings = Settings(database_url=sys.argv[1], grace=0.1, http_addr=None,
                            hooks="judge=python:tests.hookmods:count")
        with psycopg.connect(sys.argv[1], autocommit=True) as conn:
            conn.execute(JOB, ("1 minute",))
            async with (
                open_replica(settings, [Pair(REFERENCE_INSTALL, settings)]) as replica,
                replica.running(),
            ):
                with anyio.fail_after(20):
                    while not hookmods.done:
                        await anyio.sleep(0.02)
                # And the timer path too.
                conn.execute(JOB, ("0 seconds",))
                with anyio.fail_after(20):
                    while len(hookmods.done) < 2:
                        await anyio.sleep(0.02)


    anyio.run(main)
    print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")))
    """
)


@pytest.mark.parametrize(
    ("extra", "environment"),
    [
        ("installed", {}),
        ("absent", {}),
        ("absent", {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}),
    ],
    ids=["installed-not-asked", "absent", "absent-but-asked"],
)
def test_nothing_from_opentelemetry_is_imported_unless_asked(
    database_url: str, extra: str, environment: dict[str, str]
) -> None:
    result = python_without_otel(
        "-c", _SCRIPT, database_url, extra, environ=environment, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
    if environment:
        # Asked for traces without the extra: said once, and the reactor works as before.
        assert result.stderr.count("OpenTelemetry is not installed") == 1
