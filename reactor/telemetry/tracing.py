"""Traces of the reactor's work, when OpenTelemetry is installed and asked for.

The ``backstop-reactor[otel]`` extra installs the OpenTelemetry API and SDK and the OTLP
exporter over HTTP. Tracing is then on when one of these holds, in this order:

1. The app (or ``opentelemetry-instrument``, or whatever embeds the reactor) installed a
   TracerProvider of its own: the reactor's spans go there, and the reactor configures nothing.
2. ``OTEL_TRACES_EXPORTER`` names exporters (comma-separated: ``otlp``, ``console``, or any
   installed ``opentelemetry_traces_exporter`` entry point): the reactor installs an SDK
   TracerProvider that sends its spans to them in batches.
3. ``OTEL_TRACES_EXPORTER`` is unset and ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
   ``OTEL_EXPORTER_OTLP_ENDPOINT`` is: the same, with the ``otlp`` exporter.

``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` keeps the reactor from installing
one. Unlike the SDK's own auto-configuration, the reactor does not trace merely because the
extra is installed: an image built with it must not start sending spans to ``localhost:4318``
until someone says where they go. ``otlp`` follows ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` or
``OTEL_EXPORTER_OTLP_PROTOCOL``: ``http/protobuf``, the default, which the extra installs, or
``grpc``, which needs ``opentelemetry-exporter-otlp-proto-grpc``. The SDK and the exporters read
everything else as usual (endpoint, headers, sampler, ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES``); ``service.name`` is ``backstop-reactor`` unless they name one.

Without the extra, and while tracing is off, nothing from OpenTelemetry is imported: ``span``
is a no-op and ``inject_traceparent`` adds nothing. ``reactor run`` and ``reactor sweep`` call
:func:`configure` at startup, so a misspelt exporter fails there. Embedded, the first span reads
the environment unless the app called :func:`configure` itself (a misspelt exporter is then
logged, and tracing stays off); a provider the app installs later is picked up from then on.

Where spans go is a value, :class:`Tracing`: the process owns one, :data:`PROCESS`, which the
module's functions (:func:`span`, :func:`current`, :func:`configure`, ...) act on, and whoever
is given another (a test, an app that keeps its provider to itself, the hooks of
:mod:`reactor.hooks`) traces through that one instead. Nothing else holds state.

No attribute carries a secret: call sites pass ids, names, kinds, counts and outcomes, never a
hook's spec or URL, and error descriptions and exception messages go through
:func:`reactor.telemetry.redact.scrub` (hooks scrub theirs with every configured secret first).
Exceptions are recorded with their type and message, without a stack trace.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import sys
from collections.abc import Collection, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any

from reactor.errors import ConfigError
from reactor.telemetry import redact

if TYPE_CHECKING:
    from opentelemetry.trace import Span as OtelSpan
    from opentelemetry.trace import Tracer, TracerProvider

log = logging.getLogger(__name__)

Attribute = str | bool | int | float | Sequence[str] | Sequence[int] | Sequence[float]

# A record statement lists its jobs' ids up to this many; past it, only their count.
JOB_IDS_SHOWN = 10

SERVICE_NAME = "backstop-reactor"
_SCOPE = "reactor"
_ENTRY_POINTS = "opentelemetry_traces_exporter"
_OTLP_BY_PROTOCOL = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}
_OTLP_PACKAGES = {
    "otlp_proto_http": "opentelemetry-exporter-otlp-proto-http",
    "otlp_proto_grpc": "opentelemetry-exporter-otlp-proto-grpc",
}


class Span:
    """What a :func:`span` block is given: attributes and an error status to set. While
    tracing is off it holds nothing, and every method does nothing."""

    __slots__ = ("_span",)

    def __init__(self, span: OtelSpan | None = None) -> None:
        self._span = span

    def set(
        self, attributes: Mapping[str, Attribute | None] | None = None, /, **more: Attribute | None
    ) -> Span:
        """Set ``attributes`` as named, and each of ``more`` as ``reactor.<keyword>``; None
        values are left out."""
        if self._span is not None:
            self._span.set_attributes(_attributes(attributes, more))
        return self

    def error(self, description: str | None) -> Span:
        """Mark the span failed, with ``description`` (scrubbed); None leaves it as it is."""
        if self._span is not None and description is not None:
            trace = _module("opentelemetry.trace")
            self._span.set_status(trace.Status(trace.StatusCode.ERROR, _scrubbed(description)))
        return self

    def exception(self, error: BaseException) -> Span:
        """Record ``error`` (type and scrubbed message) and mark the span failed."""
        if self._span is not None:
            described, kind = _described(error), type(error).__name__
            self._span.add_event(
                "exception",
                {"exception.type": _qualified(type(error)), "exception.message": described},
            )
            self.error(f"{kind}: {described}" if described else kind)
        return self


_OFF = Span()


class Tracing:
    """Where the reactor's spans go, and whether tracing is on: the rules of the module
    docstring for one value. ``provider``: send them there (a test, an app that keeps its
    provider to itself); None: as the environment and the app's global provider say."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        # The tracer once tracing is on; None while it is off.
        self._tracer: Tracer | None = None
        # Whether the environment was read (and a provider installed, if it asked for one).
        self._configured = False
        self.use(provider)

    @contextmanager
    def span(
        self,
        name: str,
        attributes: Mapping[str, Attribute | None] | None = None,
        /,
        **more: Attribute | None,
    ) -> Iterator[Span]:
        """A span called ``name`` around the block, current inside it, with ``attributes`` as
        named and each of ``more`` as ``reactor.<keyword>`` (None values left out).

        An ``Exception`` leaving the block is recorded and sets the error status; a
        cancellation does neither. While tracing is off this is a no-op that yields a
        :class:`Span` doing nothing.
        """
        tracer = self._active()
        if tracer is None:
            yield _OFF
            return
        with tracer.start_as_current_span(
            name,
            attributes=_attributes(attributes, more),
            record_exception=False,
            set_status_on_exception=False,
        ) as current:
            traced = Span(current)
            try:
                yield traced
            except Exception as error:
                traced.exception(error)
                raise

    def current(self) -> Span:
        """The span current here (the innermost span block), or one doing nothing."""
        if self._tracer is None:
            return _OFF
        return Span(_module("opentelemetry.trace").get_current_span())

    def inject_traceparent(self, headers: MutableMapping[str, str]) -> None:
        """Add the current span's W3C ``traceparent`` to ``headers``, and nothing else; nothing
        at all while tracing is off.

        Not through the configured propagators: they default to baggage too, and an embedding
        app may add its own, which would hand a third-party receiver whatever the app's context
        carries (user ids in baggage, vendor state in tracestate). The trace context
        propagator writes the W3C headers, of which only traceparent is kept.
        """
        if self._tracer is None:
            return
        propagator = _module("opentelemetry.trace.propagation.tracecontext")
        written: dict[str, str] = {}
        propagator.TraceContextTextMapPropagator().inject(written)
        if "traceparent" in written:
            headers["traceparent"] = written["traceparent"]

    def enabled(self) -> bool:
        """True while spans are recorded somewhere."""
        return self._active() is not None

    def configure(self, environ: Mapping[str, str] | None = None) -> bool:
        """Turn tracing on as the module docstring says; True when it is on.

        Raises ConfigError when ``OTEL_TRACES_EXPORTER`` names an exporter that is not
        installed, or the OTLP protocol is unknown. With the variables set but OpenTelemetry
        not installed, it logs a warning and tracing stays off: the reactor works as before.
        """
        self._configured = True
        env = os.environ if environ is None else environ
        app = _app_tracer()
        if app is not None:
            self._tracer = app
            return True
        names = exporter_names(env)
        if not names:
            return False
        self._tracer = _installed_tracer(names)
        return self._tracer is not None

    def use(self, provider: TracerProvider | None) -> None:
        """Send the spans to ``provider`` rather than the global one; None goes back to the
        rules of the module docstring."""
        self._tracer = None if provider is None else provider.get_tracer(_SCOPE, _version())
        self._configured = provider is not None

    def _active(self) -> Tracer | None:
        if self._tracer is not None:
            return self._tracer
        if not self._configured:
            try:
                if self.configure():
                    return self._tracer
            except ConfigError as error:
                log.warning("tracing stays off", extra={"error": str(error)})
        # An app may install its provider after the reactor started.
        self._tracer = _app_tracer()
        return self._tracer


# The process's: what ``reactor run`` configures at startup, and what the functions below use.
PROCESS = Tracing()
span = PROCESS.span
current = PROCESS.current
inject_traceparent = PROCESS.inject_traceparent
enabled = PROCESS.enabled
configure = PROCESS.configure
use = PROCESS.use


def jobs(job_ids: Collection[str]) -> dict[str, Attribute]:
    """``reactor.jobs.count``, and ``reactor.job_ids`` while there are at most
    :data:`JOB_IDS_SHOWN` of them: a batch of thousands would make every span huge."""
    shown: dict[str, Attribute] = {"reactor.jobs.count": len(job_ids)}
    if len(job_ids) <= JOB_IDS_SHOWN:
        shown["reactor.job_ids"] = list(job_ids)
    return shown


def _installed_tracer(names: Sequence[str]) -> Tracer | None:
    # An SDK provider sending to the exporters ``names``, installed as the global one; None
    # (and a warning) when OpenTelemetry is not installed.
    try:
        trace = importlib.import_module("opentelemetry.trace")
        sdk = importlib.import_module("opentelemetry.sdk.trace")
        export = importlib.import_module("opentelemetry.sdk.trace.export")
        resources = importlib.import_module("opentelemetry.sdk.resources")
    except ImportError:
        log.warning(
            "OTEL_* variables ask for traces, but OpenTelemetry is not installed (install "
            "backstop-reactor[otel]); tracing stays off",
            extra={"exporters": ",".join(names)},
        )
        return None
    exporters = [_exporter_class(name) for name in names]
    resource = resources.Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(resources.Resource({"service.name": SERVICE_NAME}))
    provider = sdk.TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(export.BatchSpanProcessor(exporter()))
    trace.set_tracer_provider(provider)
    log.info("tracing on", extra={"exporters": ",".join(names)})
    tracer: Tracer = provider.get_tracer(_SCOPE, _version())
    return tracer


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The exporters the environment asks the reactor to install, as entry point names
    (``otlp`` resolved to its protocol's); empty when it asks for none. Pure."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    text = environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not text:
        endpoints = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
        text = "otlp" if any(environ.get(name, "").strip() for name in endpoints) else ""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or [name.lower() for name in names] == ["none"]:
        return []
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip()
        or "http/protobuf"
    )
    resolved: list[str] = []
    for name in names:
        if name == "otlp":
            if protocol not in _OTLP_BY_PROTOCOL:
                raise ConfigError(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not an OTLP protocol for "
                    "traces; use http/protobuf or grpc"
                )
            name = _OTLP_BY_PROTOCOL[protocol]
        if name not in resolved:
            resolved.append(name)
    return resolved


def _app_tracer() -> Tracer | None:
    # Only when the app imported OpenTelemetry itself: looking must not import it.
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None or isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None
    tracer: Tracer = trace.get_tracer(_SCOPE, _version())
    return tracer


def _exporter_class(name: str) -> Any:
    found = importlib.metadata.entry_points(group=_ENTRY_POINTS, name=name)
    if not found:
        package = _OTLP_PACKAGES.get(name)
        hint = f"; install {package}" if package else ""
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER asks for the {name!r} trace exporter, which no installed "
            f"package provides{hint}"
        )
    return next(iter(found)).load()


def _attributes(
    attributes: Mapping[str, Attribute | None] | None, more: Mapping[str, Attribute | None]
) -> dict[str, Attribute]:
    found = {key: value for key, value in (attributes or {}).items() if value is not None}
    found.update({f"reactor.{key}": value for key, value in more.items() if value is not None})
    return found


def _described(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return _scrubbed(lines[0]) if lines else ""


def _scrubbed(text: str) -> str:
    return redact.scrub(text)


def _qualified(kind: type) -> str:
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _module(name: str) -> ModuleType:
    # Imported already whenever tracing is on; a dictionary lookup from then on.
    return sys.modules.get(name) or importlib.import_module(name)


def _version() -> str | None:
    try:
        return importlib.metadata.version(SERVICE_NAME)
    except importlib.metadata.PackageNotFoundError:
        return None
