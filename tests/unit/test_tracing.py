"""When the reactor traces, read from the standard OTEL_* variables, and what the facade does.

Installing a TracerProvider is once per process, so each case that installs one runs in a
subprocess of its own.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator

import pytest

from reactor.errors import ConfigError
from reactor.telemetry import tracing
from tests.helpers import python_without_otel


@pytest.mark.parametrize(
    ("environ", "names"),
    [
        ({}, []),
        ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp_proto_http"]),
        ({"OTEL_TRACES_EXPORTER": "otlp, console"}, ["otlp_proto_http", "console"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp_proto_http"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp_proto_http"]),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            ["otlp_proto_grpc"],
        ),
        (
            {
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            ["otlp_proto_http"],
        ),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, []),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_SDK_DISABLED": "TRUE"}, []),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "false"}, ["console"]),
        ({"OTEL_TRACES_EXPORTER": "  "}, []),
    ],
)
def test_which_exporters_the_environment_asks_for(
    environ: dict[str, str], names: list[str]
) -> None:
    assert tracing.exporter_names(environ) == names


def test_an_unknown_otlp_protocol_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="http/protobuf or grpc"):
        tracing.exporter_names({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "x"})


@pytest.fixture
def _fresh() -> Iterator[None]:
    tracing.use(None)
    yield
    tracing.use(None)


@pytest.mark.usefixtures("_fresh")
def test_an_exporter_nobody_installed_is_a_config_error_that_names_it() -> None:
    with pytest.raises(ConfigError, match="'zipkin-typo' trace exporter"):
        tracing.configure({"OTEL_TRACES_EXPORTER": "zipkin-typo"})
    with pytest.raises(ConfigError, match="install opentelemetry-exporter-otlp-proto-grpc"):
        tracing.configure({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})


@pytest.mark.usefixtures("_fresh")
def test_off_the_facade_does_nothing() -> None:
    assert not tracing.configure({})
    headers: dict[str, str] = {}
    with tracing.span("reactor.test", tracing.jobs(["a"]), source="x") as span:
        span.set(recorded=1).error("no").exception(RuntimeError("no"))
        tracing.current().set(outcome="done")
        tracing.inject_traceparent(headers)
    assert headers == {}
    assert not tracing.enabled()


@pytest.mark.usefixtures("_fresh")
def test_a_tracing_value_of_its_own_leaves_the_process_alone() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    own = tracing.Tracing(provider)
    assert not tracing.configure({})  # the process's stays off
    headers: dict[str, str] = {}
    try:
        with own.span("reactor.own", hook="judge") as span:
            span.set(outcome="done")
            own.inject_traceparent(headers)
            with tracing.span("reactor.process"):
                tracing.current().set(outcome="lost")
    finally:
        provider.shutdown()
    assert own.enabled()
    assert not tracing.enabled()
    (recorded,) = exporter.get_finished_spans()
    assert recorded.name == "reactor.own"
    assert dict(recorded.attributes or {}) == {"reactor.hook": "judge", "reactor.outcome": "done"}
    assert headers["traceparent"].split("-")[2] == f"{recorded.context.span_id:016x}"


@pytest.mark.usefixtures("_fresh")
def test_only_the_traceparent_leaves_whatever_the_apps_context_carries() -> None:
    # An embedding app's context: baggage (the default propagators send it) and a tracestate.
    from opentelemetry import baggage, context, trace
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()
    tracing.use(provider)
    parent = trace.SpanContext(
        trace_id=0x1234,
        span_id=0x5678,
        is_remote=True,
        trace_flags=trace.TraceFlags(1),
        trace_state=trace.TraceState([("vendor", "account-42")]),
    )
    carried = baggage.set_baggage("user.email", "alice@example.com")
    carried = trace.set_span_in_context(trace.NonRecordingSpan(parent), carried)
    token = context.attach(carried)
    try:
        headers: dict[str, str] = {"Content-Type": "application/json"}
        with tracing.span("reactor.hook"):
            tracing.inject_traceparent(headers)
            own = trace.get_current_span().get_span_context()
    finally:
        context.detach(token)
        provider.shutdown()
    assert headers == {
        "Content-Type": "application/json",
        "traceparent": f"00-{own.trace_id:032x}-{own.span_id:016x}-01",
    }
    assert own.trace_id == 0x1234  # the app's trace goes on


def test_job_ids_are_listed_up_to_ten_then_only_counted() -> None:
    ten = [str(n) for n in range(10)]
    assert tracing.jobs(ten) == {"reactor.jobs.count": 10, "reactor.job_ids": ten}
    assert tracing.jobs([*ten, "10"]) == {"reactor.jobs.count": 11}


_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from reactor.telemetry import tracing

    case = sys.argv[1]
    if case == "app":
        # The app installed its own provider before the reactor looked.
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    on = tracing.configure()
    if case == "later":
        with tracing.span("before"):
            pass
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    with tracing.span("reactor.test", hook="judge") as span:
        span.set(outcome="done")
    result = {
        "on": on,
        "modules": sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"),
    }
    if case in ("app", "later"):
        from opentelemetry import trace
        result["same_provider"] = trace.get_tracer_provider() is provider
        result["spans"] = [s.name for s in exporter.get_finished_spans()]
    sys.stderr.write(json.dumps(result) + "\\n")
    """
)


def _run(case: str, **environ: str) -> tuple[dict[str, object], str]:
    result = python_without_otel("-c", _SCRIPT, case, environ=environ)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stderr.strip().splitlines()[-1]), result.stdout


def test_the_console_exporter_from_the_environment() -> None:
    result, stdout = _run("env", OTEL_TRACES_EXPORTER="console")
    assert result["on"] is True
    exported = json.loads(stdout)  # one span
    assert exported["name"] == "reactor.test"
    assert exported["attributes"] == {"reactor.hook": "judge", "reactor.outcome": "done"}
    assert exported["resource"]["attributes"]["service.name"] == "backstop-reactor"


def test_the_service_name_from_the_environment_wins() -> None:
    _, stdout = _run("env", OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="judge-sidecar")
    assert json.loads(stdout)["resource"]["attributes"]["service.name"] == "judge-sidecar"


def test_nothing_is_imported_while_the_environment_asks_for_nothing() -> None:
    for environ in ({}, {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}):
        result, stdout = _run("env", **environ)
        assert result == {"on": False, "modules": []}
        assert stdout == ""


def test_a_provider_the_app_installed_is_used_and_kept() -> None:
    result, stdout = _run("app", OTEL_TRACES_EXPORTER="console")
    assert result["on"] is True
    assert result["same_provider"] is True
    assert result["spans"] == ["reactor.test"]
    assert stdout == ""  # the reactor installed no console exporter of its own


def test_a_provider_the_app_installs_later_gets_the_spans_from_then_on() -> None:
    result, _ = _run("later")
    assert result["on"] is False
    assert result["spans"] == ["reactor.test"]


def test_reactor_run_fails_fast_on_an_exporter_nobody_installed() -> None:
    environ = {
        "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
        "OTEL_TRACES_EXPORTER": "jaeger-typo",
    }
    result = python_without_otel("-m", "reactor", "run", environ=environ)
    assert result.returncode == 2, result.stderr
    assert "'jaeger-typo' trace exporter" in result.stderr
