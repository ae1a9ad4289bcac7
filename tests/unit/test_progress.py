"""reactor.cli.progress: without a terminal, long commands report as periodic log lines."""

from __future__ import annotations

import logging
import sys
import time

import pytest

from reactor.cli import progress


def test_without_a_terminal_it_logs_every_few_seconds(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    caplog.set_level(logging.INFO, logger="reactor.cli.progress")
    with progress.counting("sweep: reconcile pass", "jobs") as update:
        for done in range(0, 30_000, 1000):
            clock[0] += 1.0  # a step a second: a line every LOG_EVERY_S steps
            update(done)
    lines = [r for r in caplog.records if r.name == "reactor.cli.progress"]
    assert len(lines) == int(30 / progress.LOG_EVERY_S)
    assert all(r.getMessage() == "sweep: reconcile pass: in progress" for r in lines)
    assert lines[0].jobs == 4000  # type: ignore[attr-defined]
    assert lines[0].per_second == 800  # type: ignore[attr-defined]
