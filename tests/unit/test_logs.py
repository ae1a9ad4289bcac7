"""reactor.telemetry.logs: JSON lines for machines, short lines for people, extras in both."""

from __future__ import annotations

import io
import json
import logging
import math
import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from reactor.telemetry.logs import ConsoleFormatter, JsonFormatter, fields_of

JOB = "5f0c6a2e-1b7d-4c3e-9a8f-0123456789ab"
RUN = "0e2d7a51-8c4b-4f6a-b3e1-fedcba987654"


class Capture:
    """A logger of its own writing through one formatter into a string."""

    def __init__(self, formatter: logging.Formatter, name: str) -> None:
        self.stream = io.StringIO()
        handler = logging.StreamHandler(self.stream)
        handler.setFormatter(formatter)
        self.logger = logging.getLogger(name)
        self.logger.handlers[:] = [handler]
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = False

    def lines(self) -> list[str]:
        return self.stream.getvalue().splitlines()

    def objects(self) -> list[dict[str, Any]]:
        return [strict_json(line) for line in self.lines()]


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def strict_json(line: str) -> dict[str, Any]:
    """Parse one line as RFC 8259 JSON: NaN and Infinity are refused."""
    value = json.loads(line, parse_constant=_no_constants)
    assert isinstance(value, dict)
    return value


@pytest.fixture
def as_json(request: pytest.FixtureRequest) -> Iterator[Capture]:
    capture = Capture(JsonFormatter(), f"test.logs.json.{request.node.name}")
    yield capture
    capture.logger.handlers.clear()


@pytest.fixture
def as_console(request: pytest.FixtureRequest) -> Iterator[Capture]:
    capture = Capture(ConsoleFormatter(), f"test.logs.console.{request.node.name}")
    yield capture
    capture.logger.handlers.clear()


def fail(message: str, kind: type[Exception] = RuntimeError) -> None:
    raise kind(message)


# -- JSON ----------------------------------------------------------------------------------------


def test_json_one_object_per_line_with_extras(as_json: Capture) -> None:
    as_json.logger.info("recorded run", extra={"job_id": JOB, "run_id": RUN, "source": "timer"})
    as_json.logger.warning("second", extra={"attempt": 3, "lateness_ms": 1.5})
    lines = as_json.lines()
    assert len(lines) == 2
    first, second = (strict_json(line) for line in lines)
    assert first["message"] == "recorded run"
    assert first["level"] == "info"
    assert first["logger"] == as_json.logger.name
    assert first["job_id"] == JOB
    assert first["run_id"] == RUN
    assert first["source"] == "timer"
    assert second["level"] == "warning"
    assert second["attempt"] == 3
    assert second["lateness_ms"] == 1.5
    assert "job_id" not in second


def test_json_time_is_utc_iso8601(as_json: Capture) -> None:
    as_json.logger.info("tick")
    (entry,) = as_json.objects()
    when = datetime.fromisoformat(entry["time"])
    assert when.utcoffset() is not None
    assert when.utcoffset() == UTC.utcoffset(None)
    assert abs((datetime.now(UTC) - when).total_seconds()) < 60


def test_json_has_no_logging_internals(as_json: Capture) -> None:
    as_json.logger.info("plain")
    (entry,) = as_json.objects()
    assert set(entry) == {"time", "level", "logger", "message"}


def test_json_formats_message_arguments(as_json: Capture) -> None:
    as_json.logger.info("recorded %d runs in %s", 3, "scan")
    (entry,) = as_json.objects()
    assert entry["message"] == "recorded 3 runs in scan"


def test_json_multiline_message_stays_on_one_line(as_json: Capture) -> None:
    as_json.logger.info("first\nsecond\r\nthird", extra={"payload": "a\nb"})
    lines = as_json.lines()
    assert len(lines) == 1
    entry = strict_json(lines[0])
    assert entry["message"] == "first\nsecond\r\nthird"
    assert entry["payload"] == "a\nb"


def test_json_unserialisable_extras_become_strings(as_json: Capture) -> None:
    class Thing:
        def __str__(self) -> str:
            return "thing!"

    as_json.logger.info("x", extra={"thing": Thing(), "when": datetime(2024, 1, 2, tzinfo=UTC)})
    (entry,) = as_json.objects()
    assert entry["thing"] == "thing!"
    assert entry["when"].startswith("2024-01-02")


def test_json_exception_is_one_line(as_json: Capture) -> None:
    try:
        fail("connection lost\nDETAIL: host=db password=hunter2\nHINT: retry")
    except RuntimeError:
        as_json.logger.exception("listener failed", extra={"job_id": JOB})
    lines = as_json.lines()
    assert len(lines) == 1
    entry = strict_json(lines[0])
    assert entry["error"] == "RuntimeError: connection lost"
    assert entry["job_id"] == JOB
    assert entry["level"] == "error"
    assert "Traceback" not in lines[0]
    assert "hunter2" not in lines[0]


def test_json_exception_with_empty_message(as_json: Capture) -> None:
    try:
        fail("", TimeoutError)
    except TimeoutError:
        as_json.logger.warning("slow", exc_info=True)
    (entry,) = as_json.objects()
    assert entry["error"] == "TimeoutError"


def test_json_exc_info_without_an_exception_adds_nothing(as_json: Capture) -> None:
    as_json.logger.info("no error here", exc_info=True)  # outside an except block
    (entry,) = as_json.objects()
    assert "error" not in entry


def test_json_exception_from_an_instance(as_json: Capture) -> None:
    as_json.logger.error("boom", exc_info=ValueError("  bad value\n more"))
    (entry,) = as_json.objects()
    assert entry["error"] == "ValueError: bad value"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_json_non_finite_floats_still_make_valid_json(as_json: Capture, value: float) -> None:
    as_json.logger.info("late", extra={"due_in": value})
    (line,) = as_json.lines()
    entry = strict_json(line)
    assert "due_in" in entry


# -- console -------------------------------------------------------------------------------------


def test_console_line_has_time_level_message_and_extras(as_console: Capture) -> None:
    as_console.logger.info("recorded run", extra={"job_id": JOB, "run_id": RUN})
    (line,) = as_console.lines()
    assert re.match(r"\d\d:\d\d:\d\d\.\d{3} info +recorded run", line), line
    assert f"job_id={JOB}" in line
    assert f"run_id={RUN}" in line
    assert line.index("recorded run") < line.index("job_id=") < line.index("run_id=")


def test_console_without_extras(as_console: Capture) -> None:
    as_console.logger.warning("careful")
    (line,) = as_console.lines()
    assert line.endswith("warning careful")
    assert "=" not in line


def test_console_exception_is_one_line(as_console: Capture) -> None:
    try:
        fail("first line\nsecond line")
    except RuntimeError:
        as_console.logger.exception("oops", extra={"attempt": 2})
    lines = as_console.lines()
    assert len(lines) == 1
    assert "attempt=2" in lines[0]
    assert "error='RuntimeError: first line'" in lines[0]
    assert "second line" not in lines[0]
    assert "Traceback" not in lines[0]


# -- fields_of -----------------------------------------------------------------------------------


def test_fields_of_returns_only_the_extras() -> None:
    record = logging.getLogger("test.logs.fields").makeRecord(
        "test.logs.fields",
        logging.INFO,
        __file__,
        1,
        "msg %s",
        ("x",),
        sys.exc_info(),
        extra={"job_id": JOB, "_private": 1},
    )
    record.getMessage()
    assert fields_of(record) == {"job_id": JOB}
