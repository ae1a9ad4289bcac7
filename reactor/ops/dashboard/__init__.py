"""The page an operator opens at 3 a.m.: ``/``, and ``/api/status`` beside it.

Everything the page shows is one document: ``reactor status --json`` (:func:`status.as_json`)
with a ``replica`` key added for what only this process knows (its LISTEN state, its view of
who is live, its lateness histogram, the last jobs it settled). ``/api/status`` serves that
document and the page is rendered from it, server-side, with no script: a person and a machine
read the same thing.

The database pays for at most one ``status`` every :data:`REPORT_TTL_S` seconds, however many
tabs refresh: :class:`StatusSource` keeps the last report, and one collection at a time runs
under its lock, bounded by :data:`REPORT_TIMEOUT_S`; a database that does not answer gives the
last report back with the reason. /healthz and /readyz never come here.

Acting (retry or cancel hook rows, release a job set aside: the statements of ``reactor hooks
retry|cancel`` and ``reactor sweep``) needs ``REACTOR_DASHBOARD_TOKEN``; see :class:`Auth`.
Without it the page has no buttons, and every POST is refused with 403.

The package's rooms: :mod:`.source` collects the report, :mod:`.guard` decides who may act and
which requests are the page's own, :mod:`.signin` holds sign-in and the admission of an action
at the door, :mod:`.view` renders the page from the document, and :mod:`.routes` serves it all
with aiohttp.
"""

from __future__ import annotations

from reactor.ops.dashboard.guard import (
    COOKIE,
    FAILURE_WINDOW_S,
    MAX_FAILURES,
    Auth,
    HostAllowlist,
    Throttle,
    cross_site,
    split_host,
)
from reactor.ops.dashboard.routes import Dashboard, for_reactor, install
from reactor.ops.dashboard.source import REPORT_TIMEOUT_S, REPORT_TTL_S, Snapshot, StatusSource
from reactor.ops.dashboard.view import (
    bars,
    lateness_buckets,
    next_reconcile,
    render_login,
    render_page,
    replica_view,
)

__all__ = [
    "COOKIE",
    "FAILURE_WINDOW_S",
    "MAX_FAILURES",
    "REPORT_TIMEOUT_S",
    "REPORT_TTL_S",
    "Auth",
    "Dashboard",
    "HostAllowlist",
    "Snapshot",
    "StatusSource",
    "Throttle",
    "bars",
    "cross_site",
    "for_reactor",
    "install",
    "lateness_buckets",
    "next_reconcile",
    "render_login",
    "render_page",
    "replica_view",
    "split_host",
]
