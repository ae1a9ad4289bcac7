"""The page's HTML, rendered server-side from the report document and this replica's own view,
with no script: the lateness chart's bars, the next reconcile in words, the sign-in form."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlencode

from reactor.ops.dashboard.source import Snapshot
from reactor.runtime.view import PairView
from reactor.runtime.view import lateness_buckets as lateness_buckets

if TYPE_CHECKING:
    from jinja2 import Environment

# The page refreshes itself this often.
REFRESH_SECONDS = 5


def replica_view(view: PairView | None) -> dict[str, Any] | None:
    """This replica's own state, from the view its pair publishes (memory only); None where no
    replica runs (the demo's outage)."""
    if view is None:
        return None
    listener = view.listener
    live = sorted(view.live)
    return {
        "id": view.replica_id,
        "mode": view.mode,
        "ready": view.ready,
        "reason": view.reason,
        "listener": None
        if listener is None
        else {
            "state": listener.state,
            "proven": listener.proven,
            "problem": listener.problem,
            "reconnects": listener.reconnects,
        },
        "polling": view.polling,
        "trigger": view.trigger,
        "live": live,
        # Rendezvous hashing splits the jobs evenly between the live replicas it sees; before
        # its first heartbeat a replica claims every job.
        "share": 1.0 / len(live) if view.replica_id in live else 1.0,
        "deadlines": view.deadlines,
        "lateness": [
            {"le": None if bound == float("inf") else bound, "count": count}
            for bound, count in view.lateness
        ],
        "recent": [
            {
                "job_id": s.job_id,
                "run_id": s.run_id,
                "outcome": s.outcome,
                "source": s.source,
                "lateness_seconds": s.lateness,
                "at": s.at.isoformat(),
            }
            for s in reversed(view.recent)
        ],
    }


def duration(seconds: float) -> str:
    """``seconds`` in words, as ``reactor status`` writes them."""
    # Imported when the page renders: the report's package brings rich (its terminal
    # rendering), which a replica need not load before it is ready.
    from reactor.status import duration as in_words

    return in_words(seconds)


@cache
def _templates() -> Environment:
    # Loaded at the page's first request, not at start: jinja2 is a tenth of what `reactor
    # run` imports, and a replica is ready (and many never show the page) before anyone looks.
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    env = Environment(
        loader=PackageLoader("reactor", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["duration"] = _duration
    env.filters["bound"] = _bound
    env.filters["short"] = lambda text: str(text)[:8]
    env.filters["time"] = lambda iso: "-" if iso is None else str(iso)[:19].replace("T", " ")
    return env


def _duration(seconds: float | None) -> str:
    return "-" if seconds is None else duration(max(0.0, seconds))


def _bound(seconds: float | None) -> str:
    if seconds is None:
        return "more"
    if seconds < 1:
        return f"{seconds * 1000:g} ms"
    return duration(seconds)


def _tick(seconds: float | None) -> str:
    # The chart's axis: short enough for 17 buckets side by side.
    if seconds is None:
        return "more"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    if seconds < 60:
        return f"{seconds:g}s"
    return f"{seconds / 60:g}m"


@dataclass(frozen=True)
class Bar:
    """One bar of the lateness chart, in SVG user units."""

    x: float
    y: float
    width: float
    height: float
    count: int
    label: str


CHART_WIDTH_PX = 640
CHART_HEIGHT_PX = 120


def bars(buckets: Sequence[Mapping[str, Any]]) -> list[Bar]:
    """The lateness chart's bars, one per bucket, scaled to the fullest; pure."""
    if not buckets:
        return []
    width = CHART_WIDTH_PX / len(buckets)
    top = max(int(b["count"]) for b in buckets) or 1
    drawn = []
    for index, bucket in enumerate(buckets):
        count = int(bucket["count"])
        height = 0.0 if not count else max(2.0, CHART_HEIGHT_PX * count / top)
        label = _tick(bucket["le"])
        drawn.append(
            Bar(index * width + 2, CHART_HEIGHT_PX - height, width - 4, height, count, label)
        )
    return drawn


def next_reconcile(document: Mapping[str, Any]) -> str:
    """When the next reconcile pass is due, in words, from the report alone."""
    reconcile = document.get("reconcile")
    if reconcile is None:
        return "no reconcile in this schema (run `reactor migrate`)"
    interval = reconcile["interval_seconds"]
    if not interval:
        return "turned off here (REACTOR_RECONCILE_INTERVAL_SECONDS=0)"
    if reconcile["in_progress"]:
        return "a pass is running now"
    if reconcile["requested"]:
        return "asked for: starts at a replica's next step"
    last = reconcile["last_pass"]
    if last is None:
        return "the first pass starts at a replica's next step"
    finished = datetime.fromisoformat(last["finished_at"])
    checked = datetime.fromisoformat(document["checked_at"])
    left = interval - (checked - finished).total_seconds()
    return "due now" if left <= 0 else f"in about {duration(left)}"


def render_page(
    snapshot: Snapshot,
    replica: dict[str, Any] | None,
    *,
    actions: Literal["none", "sign in", "yes"],
    form_token: str | None,
    note: tuple[str, bool] | None,
    now: float,
    pair: str | None = None,
    pairs: Sequence[str] = (),
) -> str:
    """The page's HTML, from the document alone (and how this request may act); ``pair``:
    the pair shown, one of ``pairs`` in a replica of several (None: the replica's only one)."""
    document = snapshot.document
    template = _templates().get_template("dashboard.html")
    return template.render(
        doc=document,
        error=snapshot.error,
        stale=None if snapshot.document_at is None else now - snapshot.document_at,
        replica=replica,
        bars=bars(replica["lateness"]) if replica else [],
        chart_width=CHART_WIDTH_PX,
        chart_height=CHART_HEIGHT_PX,
        next_reconcile=next_reconcile(document) if document else "",
        actions=actions,
        form_token=form_token,
        note=note,
        refresh=REFRESH_SECONDS,
        pair=pair,
        pairs=pairs,
        # What each of the page's own links and forms carries, so they stay on this pair.
        pair_query="" if pair is None else "?" + urlencode({"pair": pair}),
    )


def render_login(*, refused: bool, enabled: bool, wait: float | None = None) -> str:
    """The sign-in page; ``wait``: seconds until this client may try again."""
    return (
        _templates()
        .get_template("login.html")
        .render(refused=refused, enabled=enabled, wait=None if wait is None else math.ceil(wait))
    )
