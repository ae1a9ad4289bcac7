"""What ``reactor demo`` shows: the live view while it runs, and the summary it ends with,
counted from the database (:func:`reactor.testing.audit.verdict`). :mod:`reactor.demo.run` plays
the story.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import anyio
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from reactor.runtime.service import Reactor
from reactor.telemetry.metrics import Metrics
from reactor.testing import audit

# The sweep this replaces ran every 30 s, so a rescued run waited 15 s past its grace on average.
_SWEEP_TICK_S = 30.0


@dataclass
class Scoreboard:
    """What the live view shows."""

    jobs: int
    replica_count: int
    finished: int = 0
    tab_saves: int = 0
    phase: str = "starting"
    events: list[str] = field(default_factory=list)
    replicas: list[Reactor] = field(default_factory=list)
    metrics: list[Metrics] = field(default_factory=list)

    def note(self, event: str) -> None:
        self.events = [*self.events[-5:], f"{time.strftime('%H:%M:%S')}  {event}"]

    def recorded(self) -> int:
        return int(
            sum(m.recorded.labels(s)._value.get() for m in self.metrics for s in ("timer", "scan"))
        )

    def render(self) -> Group:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column(justify="right")
        table.add_row("phase", self.phase)
        table.add_row("jobs finished by the worker", f"{self.finished} / {self.jobs}")
        table.add_row("runs saved by browser tabs", str(self.tab_saves))
        table.add_row("deadlines the reactor holds", str(sum(len(r.queue) for r in self.replicas)))
        table.add_row("runs recorded by the reactor", str(self.recorded()))
        return Group(table, Text("\n".join(self.events), style="dim"))


async def refresh(live: Live, board: Scoreboard) -> None:
    """Redraw ``live`` from ``board`` eight times a second, until cancelled."""
    while True:
        live.update(board.render())
        await anyio.sleep(0.125)


def report(
    console: Console, verdicts: dict[str, audit.Verdict], elapsed: float, as_json: bool
) -> None:
    """Print the verdict of each pair: a table, or one JSON line with ``as_json``."""
    several = len(verdicts) > 1
    if as_json:
        if several:
            by_pair = {name: v.as_dict() for name, v in verdicts.items()}
            print(json.dumps({"pairs": by_pair, "seconds": round(elapsed, 1)}))
        else:
            (v,) = verdicts.values()
            print(json.dumps({**v.as_dict(), "seconds": round(elapsed, 1)}))
        return

    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1000:.1f} ms"

    for name, v in verdicts.items():
        title = f"what the database says of pair {name}" if several else "what the database says"
        table = Table(title=title, show_header=False)
        table.add_column(style="bold")
        table.add_column(justify="right")
        table.add_row("jobs", str(v.jobs))
        table.add_row("saved by browser tabs", str(v.saved_by_client))
        table.add_row("recorded by the reactor", str(v.saved_by_worker))
        table.add_row(_NO_RUN, str(v.needed_no_run))
        for label in ("lost", "dup", "clobbered", "early", "wrong"):
            count = getattr(v, label)
            table.add_row(_LABELS[label], f"[{'green' if count == 0 else 'red'}]{count}[/]")
        table.add_row(
            "lateness p50 / p99 / max",
            f"{ms(v.lateness_p50)} / {ms(v.lateness_p99)} / {ms(v.lateness_max)}",
        )
        console.print(table)
    if all(v.clean for v in verdicts.values()):
        p50 = ms(next(iter(verdicts.values())).lateness_p50)
        if several:
            p50 = ", ".join(f"{ms(v.lateness_p50)} ({name})" for name, v in verdicts.items())
        each = " in each pair" if several else ""
        console.print(
            f"Every finished job that no tab saved got its run exactly once{each}, without "
            f"touching a tab's save, even across an outage of every replica. The reactor "
            f"wrote {p50} after the grace window at the median (outage recovery included in "
            f"the max); a {_SWEEP_TICK_S:.0f} s sweep waits about {_SWEEP_TICK_S / 2:.0f} s. "
            f"({elapsed:.0f} s in all)"
        )
    else:
        console.print("[red]An invariant was broken; the counts above say which.[/]")


# In the demo every job finishes, and none is deleted: the ones that need no run are those its
# worker finishes with an empty verdict.
_NO_RUN = "needed no run (finished empty)"

_LABELS = {
    "lost": "lost (needed a run, got none)",
    "dup": "double writes",
    "clobbered": "tab saves overwritten",
    "early": "written before the grace ended",
    "wrong": "written for a job that needed none",
}
