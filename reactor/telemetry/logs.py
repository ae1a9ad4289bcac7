"""Log records as JSON lines for machines, or short readable lines for people.

Call sites attach structured fields with ``extra={"job_id": ..., "run_id": ...}``; both formats
carry them. Exceptions are reduced to their first line unless debug logging is on, so a
driver error can never spill a connection string into the log.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


# The pair whose reactor logs, in a replica that serves several (reactor.runtime.replica sets it in
# each pair's task, whose child tasks inherit it); None: the line is the process's own.
PAIR: ContextVar[str | None] = ContextVar("reactor_pair", default=None)


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a call site attached to ``record``, and the pair that logged it."""
    found = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
    pair = PAIR.get()
    if pair is not None:
        found.setdefault("pair", pair)
    return found


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **fields_of(record),
        }
        if record.exc_info and record.exc_info[1] is not None:
            entry["error"] = _summary(record.exc_info[1])
        return json.dumps({k: _finite(v) for k, v in entry.items()}, default=str)


class ConsoleFormatter(logging.Formatter):
    """``HH:MM:SS level message key=value ...`` for a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created).strftime("%H:%M:%S.%f")[:-3]
        extra = " ".join(f"{k}={v}" for k, v in fields_of(record).items())
        line = f"{when} {record.levelname.lower():<7} {record.getMessage()}"
        if extra:
            line += f"  {extra}"
        if record.exc_info and record.exc_info[1] is not None:
            line += f"  error={_summary(record.exc_info[1])!r}"
        return line


def _finite(value: Any) -> Any:
    # NaN and Infinity are not JSON; a log line must always parse.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _summary(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def setup(level: str = "INFO", fmt: str | None = None) -> None:
    """Configure the root logger: JSON when asked or when stderr is not a terminal."""
    use_json = fmt == "json" or (fmt is None and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if use_json else ConsoleFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The pool logs every failed reconnect attempt with a traceback; ours say it once, shorter.
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
