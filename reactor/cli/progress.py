"""Progress of long operator commands: a bar on a terminal, periodic log lines elsewhere.

``reactor sweep --once`` after a restore, or the reconcile pass that ends ``reactor migrate``,
can walk millions of jobs. On a terminal the operator sees a live count with rows per second; in
a container or under cron the same figures arrive as a log line every few seconds.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from reactor.cli import extras

log = logging.getLogger(__name__)

# How often a log line reports progress when there is no terminal to draw on.
LOG_EVERY_S = 5.0


@contextmanager
def counting(what: str, unit: str) -> Iterator[Callable[[int], None]]:
    """Yield ``update(done)``: report ``done`` units of ``what`` so far, with the rate."""
    # A bar needs rich (the cli extra); without it a terminal gets the log lines too.
    if sys.stderr.isatty() and extras.installed("rich"):
        with _bar(what, unit) as update:
            yield update
    else:
        yield _log_lines(what, unit)


@contextmanager
def _bar(what: str, unit: str) -> Iterator[Callable[[int], None]]:
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    started = time.monotonic()
    columns = (
        SpinnerColumn(),
        TextColumn(f"{what}: {{task.completed:,.0f}} {unit}"),
        TextColumn("{task.fields[rate]:,.0f}/s"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=None, rate=0.0)

        def update(done: int) -> None:
            rate = done / max(time.monotonic() - started, 1e-9)
            bar.update(task, completed=done, rate=rate)

        yield update


def _log_lines(what: str, unit: str) -> Callable[[int], None]:
    started = time.monotonic()
    last = started

    def update(done: int) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last < LOG_EVERY_S:
            return
        last = now
        log.info(
            f"{what}: in progress",
            extra={unit: done, "per_second": round(done / max(now - started, 1e-9))},
        )

    return update
