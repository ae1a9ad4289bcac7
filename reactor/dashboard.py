"""The page an operator opens at 3 a.m.: ``/``, and ``/api/status`` beside it.

Everything the page shows is one document: ``reactor status --json`` (:func:`status.as_json`)
with a ``replica`` key added for what only this process knows (its LISTEN state, its view of
who is live, its lateness histogram, the last jobs it settled). ``/api/status`` serves that
document and the page is rendered from it, server-side, with no script: a person and a machine
read the same thing.

The database pays for at most one ``status`` every :data:`REPORT_TTL` seconds, however many
tabs refresh: :class:`StatusSource` keeps the last report, and one collection at a time runs
under its lock, bounded by :data:`REPORT_TIMEOUT`; a database that does not answer gives the
last report back with the reason. /healthz and /readyz never come here.

Acting (retry or cancel hook rows, release a job set aside: the statements of ``reactor hooks
retry|cancel`` and ``reactor sweep``) needs ``REACTOR_DASHBOARD_TOKEN``; see :class:`Auth`.
Without it the page has no buttons, and every POST is refused with 403.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import secrets
import time
import urllib.parse
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import anyio
import psycopg
from aiohttp import hdrs, web
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from reactor import db, hook_ops, redact, status
from reactor.config import Settings
from reactor.errors import ReactorError, UsageError
from reactor.listener import parse_payload
from reactor.metrics import Metrics

if TYPE_CHECKING:
    from multidict import MultiDictProxy

    from reactor.service import Reactor

log = logging.getLogger(__name__)

# How long one report serves every request; the page refreshes itself every REFRESH_SECONDS.
REPORT_TTL = 2.0
# The most one collection may take, waiting for a pool connection included.
REPORT_TIMEOUT = 5.0
REFRESH_SECONDS = 5

# A signed-in browser stays signed in this long, or until the process restarts.
SESSION_SECONDS = 12 * 3600.0
COOKIE = "reactor_dashboard"

# Outcomes of actions, shown once on the page the browser is sent back to.
_NOTES = 64


# -- the report --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """What one request is served: the last report (None before any answered) and, when the
    latest attempt failed, why."""

    document: dict[str, Any] | None
    error: str | None
    taken_at: float  # monotonic time of the attempt
    document_at: float | None  # monotonic time the document was collected


class StatusSource:
    """The ``status`` report for the page, collected at most once every ``ttl`` seconds."""

    def __init__(
        self,
        settings: Settings,
        queries: Callable[[], db.Database | None],
        *,
        ttl: float = REPORT_TTL,
        timeout: float = REPORT_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        # Where the report is read: the pooled queries of the install shown (None: not yet).
        self.queries = queries
        self.ttl = ttl
        self.timeout = timeout
        self.clock = clock
        self.collections = 0  # how many times the database was asked
        self._last: Snapshot | None = None
        self._lock = anyio.Lock()

    def invalidate(self) -> None:
        """Forget the report: an action changed what it says."""
        self._last = None

    async def get(self) -> Snapshot:
        """The report, fresh within ``ttl``; waits at most ``timeout`` for it."""
        last = self._last
        if last is not None and self.clock() - last.taken_at < self.ttl:
            return last
        with anyio.move_on_after(self.timeout):
            async with self._lock:
                last = self._last
                if last is not None and self.clock() - last.taken_at < self.ttl:
                    return last  # collected while this request waited for the lock
                self._last = await self._collect()
                return self._last
        # Another request's collection holds the lock past the bound: the database is slow.
        return self._failed(f"the database did not answer within {self.timeout:g} s")

    async def _collect(self) -> Snapshot:
        self.collections += 1
        started = self.clock()
        database = self.queries()
        if database is None:
            return self._failed("no replica runs yet: the database is being checked")
        try:
            with anyio.fail_after(self.timeout):
                async with database.pool.connection(timeout=self.timeout) as conn:
                    report = await status.collect(conn, database.install, self.settings)
        except TimeoutError:
            return self._failed(f"the database did not answer within {self.timeout:g} s")
        except (ReactorError, psycopg.Error, OSError) as error:
            return self._failed(db.first_line(error) or type(error).__name__)
        return Snapshot(status.as_json(report), None, started, started)

    def _failed(self, reason: str) -> Snapshot:
        last = self._last
        return Snapshot(
            None if last is None else last.document,
            redact.scrub(reason),
            self.clock(),
            None if last is None else last.document_at,
        )


# -- what only this replica knows --------------------------------------------------------------


def lateness_buckets(metrics: Metrics) -> list[tuple[float, int]]:
    """(upper bound in seconds, count in that bucket alone) of the lateness histogram; the last
    bound is infinity."""
    cumulative: list[tuple[float, float]] = []
    for family in metrics.lateness.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                cumulative.append((float(sample.labels["le"]), sample.value))
    cumulative.sort()
    buckets, below = [], 0.0
    for bound, count in cumulative:
        buckets.append((bound, int(count - below)))
        below = count
    return buckets


def replica_view(reactor: Reactor | None) -> dict[str, Any] | None:
    """This replica's own state, from memory only; None where no replica runs (the demo's
    outage)."""
    if reactor is None:
        return None
    listener = reactor.listener
    _, ready, reason = reactor.health()
    live = sorted(reactor.membership.live)
    return {
        "id": reactor.replica_id,
        "mode": reactor.settings.mode,
        "ready": ready,
        "reason": reason,
        "listener": None
        if listener is None
        else {
            "state": listener.state,
            "proven": listener.proven,
            "problem": listener.problem,
            "reconnects": max(0, listener.connections - 1),
        },
        "polling": reactor.polling,
        "trigger": reactor.vitals.trigger,
        "live": live,
        # Rendezvous hashing splits the jobs evenly between the live replicas it sees; before
        # its first heartbeat a replica claims every job.
        "share": 1.0 / len(live) if reactor.replica_id in live else 1.0,
        "deadlines": len(reactor.queue),
        "lateness": [
            {"le": None if bound == float("inf") else bound, "count": count}
            for bound, count in lateness_buckets(reactor.metrics)
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
            for s in reversed(reactor.recorder.recent)
        ],
    }


# -- signing in, and what a POST must carry ----------------------------------------------------


Who = Literal["bearer", "cookie"]

# The most sessions held at once; past it the oldest is signed out. A person signs in a few
# times a day, so only a script signing in in a loop gets near it.
MAX_SESSIONS = 1024


class Auth:
    """Who may act, for a process whose operator set ``token`` (None: nobody may).

    - A script sends ``Authorization: Bearer <token>``. A browser never adds that header on
      its own, so another site cannot make one send it: no CSRF token is needed.
    - A person posts the token once to ``/login`` and gets a session cookie: HttpOnly (no
      script reads it), SameSite=Strict (no other site's page sends it along), Secure when the
      page is reached over HTTPS. Its value is a random id this process holds in memory with its
      expiry: signing out deletes it, so a copy of the cookie is worthless from then on, and a
      restart signs everyone out. The token itself is never stored in it.
    - A POST carried by that cookie must also carry a form token, an HMAC of the session under
      a key made at random when the process starts, which only this process's pages hold; and
      it must come from the page itself: ``Sec-Fetch-Site`` same-origin when the browser sends
      it, and ``Origin``, when present, naming the host the request was sent to.

    Every comparison of a secret is in constant time (``hmac.compare_digest``), of digests of
    equal length; sessions are looked up by their digest, so the lookup's timing depends on
    nothing a client chose.
    """

    def __init__(
        self,
        token: str | None,
        *,
        lifetime: float = SESSION_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        self._token = None if token is None else _digest(token.encode())
        self._key = secrets.token_bytes(32)
        self.lifetime = lifetime
        self.clock = clock
        self.max_sessions = max_sessions
        # digest of the session id -> when it expires, oldest first (every session lives as
        # long, so issue order is expiry order).
        self._sessions: OrderedDict[bytes, float] = OrderedDict()

    @property
    def enabled(self) -> bool:
        """True when actions are possible at all (REACTOR_DASHBOARD_TOKEN is set)."""
        return self._token is not None

    def token_ok(self, presented: str) -> bool:
        """True when ``presented`` is the token."""
        if self._token is None:
            return False
        return hmac.compare_digest(_digest(presented.encode()), self._token)

    def issue(self) -> str:
        """A new session's cookie value."""
        now = self.clock()
        self._forget_expired(now)
        value = secrets.token_urlsafe(32)
        self._sessions[_digest(value.encode())] = now + self.lifetime
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return value

    def session_ok(self, value: str | None) -> bool:
        """True for a cookie value :meth:`issue` made that has neither expired nor ended."""
        if not self.enabled or not value:
            return False
        expires = self._sessions.get(_digest(value.encode()))
        return expires is not None and self.clock() < expires

    def end(self, value: str | None) -> None:
        """Sign the session ``value`` out: its cookie is refused from now on."""
        if value:
            self._sessions.pop(_digest(value.encode()), None)

    @property
    def sessions(self) -> int:
        """How many sessions are held (expired ones included until the next sign-in)."""
        return len(self._sessions)

    def form_token(self, session: str) -> str:
        """The CSRF token the pages of ``session`` carry in their forms."""
        return self._mac("form", session)

    def form_ok(self, session: str, presented: str) -> bool:
        """True when ``presented`` is ``session``'s form token."""
        return hmac.compare_digest(presented.encode(), self.form_token(session).encode())

    def _mac(self, purpose: str, text: str) -> str:
        return hmac.new(self._key, f"{purpose}:{text}".encode(), hashlib.sha256).hexdigest()

    def _forget_expired(self, now: float) -> None:
        while self._sessions:
            expires = next(iter(self._sessions.values()))
            if expires > now:
                return
            self._sessions.popitem(last=False)


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


# A wrong token this many times within FAILURE_WINDOW from one address, and that address is
# refused (429) until the oldest of those failures is FAILURE_WINDOW old.
MAX_FAILURES = 5
FAILURE_WINDOW = 60.0
# The most addresses remembered; past it the one whose last failure is oldest is forgotten.
MAX_CLIENTS = 4096


class Throttle:
    """Failed presentations of the token, per client address, within a sliding window; pure
    (``now`` is passed in).

    An address with ``limit`` failures inside ``window`` seconds is refused until the oldest of
    them leaves the window. Each address is counted on its own: one client's success or
    failure changes nobody else's count. Memory is bounded by ``max_clients`` addresses of
    at most ``limit`` times each.
    """

    def __init__(
        self,
        *,
        limit: int = MAX_FAILURES,
        window: float = FAILURE_WINDOW,
        max_clients: int = MAX_CLIENTS,
    ) -> None:
        self.limit = limit
        self.window = window
        self.max_clients = max_clients
        # address -> the times of its recent failures, oldest first; the address whose last
        # failure is oldest comes first.
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def wait(self, client: str, now: float) -> float | None:
        """Seconds until ``client`` may try again, or None when it may now."""
        times = self._recent(client, now)
        if times is None or len(times) < self.limit:
            return None
        return times[0] + self.window - now

    def failed(self, client: str, now: float) -> float | None:
        """Count a failure of ``client``; returns :meth:`wait` after it."""
        times = self._recent(client, now)
        if times is None:
            times = self._failures[client] = deque(maxlen=self.limit)
        times.append(now)
        self._failures.move_to_end(client)
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)
        return self.wait(client, now)

    def succeeded(self, client: str) -> None:
        """``client`` presented the token: its failures are forgotten, nobody else's."""
        self._failures.pop(client, None)

    @property
    def clients(self) -> int:
        """How many addresses are remembered."""
        return len(self._failures)

    def _recent(self, client: str, now: float) -> deque[float] | None:
        times = self._failures.get(client)
        if times is None:
            return None
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[client]
            return None
        return times


# The names a browser on the reactor's own host uses for it; loopback cannot be pointed
# elsewhere by a DNS answer.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


class HostAllowlist:
    """The Host headers the page answers: loopback names, the address it is configured on, and
    the host of REACTOR_DASHBOARD_URL; pure.

    This is what defeats DNS rebinding: a site the operator visits can point its own name at
    127.0.0.1 and have the browser read the page through an ``ssh -L`` tunnel, but the request
    then carries that site's name as its Host. Names are compared, not ports: a rebinding
    changes the name, and proxies differ in whether they pass a port on.
    """

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(_host_name(name) for name in names)

    @classmethod
    def for_page(cls, addr_host: str | None, url_host: str | None) -> HostAllowlist:
        """Loopback, plus the host the page is bound to (unless a wildcard) and the URL's."""
        names = set(LOOPBACK_NAMES)
        if addr_host is not None and addr_host not in _WILDCARDS:
            names.add(addr_host)
        if url_host is not None:
            names.add(url_host)
        return cls(names)

    def allows(self, host_header: str | None) -> bool:
        """True when a request whose Host header is ``host_header`` is for this page."""
        if not host_header:
            return False
        name = split_host(host_header)
        return name is not None and _host_name(name) in self.names


def split_host(header: str) -> str | None:
    """The name in a Host header (``name``, ``name:port``, ``[v6]`` or ``[v6]:port``), or None
    when it is none of those."""
    header = header.strip()
    if header.startswith("["):
        name, bracket, rest = header[1:].partition("]")
        if not bracket or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return name
    name, colon, port = header.partition(":")
    if colon and not port.isdigit():
        return None
    return name


def _host_name(name: str) -> str:
    # A trailing dot names the same host (an absolute name).
    return name.strip("[]").lower().removesuffix(".")


def cross_site(headers: Mapping[str, str], host: str) -> str | None:
    """Why a POST with ``headers``, sent to ``host``, did not come from this page; None when
    nothing says it came from elsewhere."""
    site = headers.get("Sec-Fetch-Site")
    if site is not None and site != "same-origin":
        return f"Sec-Fetch-Site is {site}"
    origin = headers.get("Origin")
    if origin is None:
        return None
    if origin == "null" or urllib.parse.urlsplit(origin).netloc.lower() != host.lower():
        return "Origin names another site"
    return None


# -- the page ----------------------------------------------------------------------------------


_ENV = Environment(
    loader=PackageLoader("reactor", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _duration(seconds: float | None) -> str:
    return "-" if seconds is None else status.duration(max(0.0, seconds))


def _bound(seconds: float | None) -> str:
    if seconds is None:
        return "more"
    if seconds < 1:
        return f"{seconds * 1000:g} ms"
    return status.duration(seconds)


def _tick(seconds: float | None) -> str:
    # The chart's axis: short enough for 17 buckets side by side.
    if seconds is None:
        return "more"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    if seconds < 60:
        return f"{seconds:g}s"
    return f"{seconds / 60:g}m"


_ENV.filters["duration"] = _duration
_ENV.filters["bound"] = _bound
_ENV.filters["short"] = lambda text: str(text)[:8]
_ENV.filters["time"] = lambda iso: "-" if iso is None else str(iso)[:19].replace("T", " ")


@dataclass(frozen=True)
class Bar:
    """One bar of the lateness chart, in SVG user units."""

    x: float
    y: float
    width: float
    height: float
    count: int
    label: str


CHART_WIDTH = 640
CHART_HEIGHT = 120


def bars(buckets: Sequence[Mapping[str, Any]]) -> list[Bar]:
    """The lateness chart's bars, one per bucket, scaled to the fullest; pure."""
    if not buckets:
        return []
    width = CHART_WIDTH / len(buckets)
    top = max(int(b["count"]) for b in buckets) or 1
    drawn = []
    for index, bucket in enumerate(buckets):
        count = int(bucket["count"])
        height = 0.0 if not count else max(2.0, CHART_HEIGHT * count / top)
        label = _tick(bucket["le"])
        drawn.append(Bar(index * width + 2, CHART_HEIGHT - height, width - 4, height, count, label))
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
    return "due now" if left <= 0 else f"in about {status.duration(left)}"


def render_page(
    snapshot: Snapshot,
    replica: dict[str, Any] | None,
    *,
    actions: Literal["none", "sign in", "yes"],
    form_token: str | None,
    note: tuple[str, bool] | None,
    now: float,
) -> str:
    """The page's HTML, from the document alone (and how this request may act)."""
    document = snapshot.document
    template = _ENV.get_template("dashboard.html")
    return template.render(
        doc=document,
        error=snapshot.error,
        stale=None if snapshot.document_at is None else now - snapshot.document_at,
        replica=replica,
        bars=bars(replica["lateness"]) if replica else [],
        chart_width=CHART_WIDTH,
        chart_height=CHART_HEIGHT,
        next_reconcile=next_reconcile(document) if document else "",
        actions=actions,
        form_token=form_token,
        note=note,
        refresh=REFRESH_SECONDS,
    )


def render_login(*, refused: bool, enabled: bool, wait: float | None = None) -> str:
    """The sign-in page; ``wait``: seconds until this client may try again."""
    return _ENV.get_template("login.html").render(
        refused=refused, enabled=enabled, wait=None if wait is None else math.ceil(wait)
    )


# -- the handlers ------------------------------------------------------------------------------


_HEADERS = {
    "Cache-Control": "no-store",
    # No script, no frames, no requests anywhere else; forms post only back here.
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # Not no-referrer: under it a browser sends "Origin: null" even for the page's own forms.
    "Referrer-Policy": "same-origin",
}


class Dashboard:
    """The page's state in one process: the report, the sessions, the throttle and the notes.

    ``replica`` gives the reactor whose memory the page shows (None while none runs: the
    demo's outage, or ``reactor run`` checking the database); the report and the actions go
    through ``database``, or the replica's own when that is None.
    """

    def __init__(
        self,
        settings: Settings,
        database: db.Database | None,
        replica: Callable[[], Reactor | None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.database = database
        self.replica = replica
        self.clock = clock
        self.source = StatusSource(settings, self.queries)
        self.auth = Auth(settings.dashboard_token, clock=clock)
        self.throttle = Throttle()
        self._token = settings.dashboard_token
        self._notes: OrderedDict[str, tuple[str, bool]] = OrderedDict()

    def queries(self) -> db.Database | None:
        """Where the page reads and acts: its own database, else the replica's; None while
        neither exists."""
        if self.database is not None:
            return self.database
        reactor = self.replica()
        return None if reactor is None else reactor.database

    def _acting(self) -> db.Database:
        database = self.queries()
        if database is None:
            raise UsageError("no replica runs yet: the database is being checked; try again")
        return database

    def add_routes(self, app: web.Application) -> None:
        """Serve the page, the document and the actions on ``app``."""
        app.router.add_get("/", self.page)
        app.router.add_get("/api/status", self.api_status)
        app.router.add_get("/login", self.login_form)
        app.router.add_post("/login", self.login)
        app.router.add_post("/logout", self.logout)
        app.router.add_post("/actions/hooks/retry", self.retry_hooks)
        app.router.add_post("/actions/hooks/cancel", self.cancel_hooks)
        app.router.add_post("/actions/set-aside/release", self.release_set_aside)

    async def document(self) -> tuple[Snapshot, dict[str, Any]]:
        """What /api/status serves: the report with this replica's view added."""
        snapshot = await self.source.get()
        body: dict[str, Any] = dict(snapshot.document or {})
        body["replica"] = replica_view(self.replica())
        if snapshot.error is not None:
            body["error"] = snapshot.error
        return snapshot, body

    async def api_status(self, request: web.Request) -> web.Response:
        """``GET /api/status``: the document as JSON; 503 when no report could be read yet."""
        snapshot, body = await self.document()
        response = web.json_response(body, status=200 if snapshot.document else 503)
        return self._masked(response)

    async def page(self, request: web.Request) -> web.Response:
        """``GET /``: the page."""
        snapshot, body = await self.document()
        session = request.cookies.get(COOKIE)
        signed_in = self.auth.session_ok(session)
        actions: Literal["none", "sign in", "yes"] = "none"
        if self.auth.enabled:
            actions = "yes" if signed_in else "sign in"
        note = self._notes.get(request.query.get("note", ""))
        html = render_page(
            snapshot,
            body["replica"],
            actions=actions,
            form_token=self.auth.form_token(session) if signed_in and session else None,
            note=note,
            now=self.source.clock(),
        )
        response = web.Response(text=html, content_type="text/html", headers=_HEADERS)
        return self._masked(response)

    async def login_form(self, request: web.Request) -> web.Response:
        """``GET /login``: the form that takes the token."""
        html = render_login(refused=False, enabled=self.auth.enabled)
        return web.Response(text=html, content_type="text/html", headers=_HEADERS)

    async def login(self, request: web.Request) -> web.Response:
        """``POST /login``: the token in, a session cookie out."""
        self._same_site(request)
        client = _client(request)
        wait = self.throttle.wait(client, self.clock())
        if wait is not None:
            return self._login_page(429, wait=wait)
        # The one body read before anyone is known; the application bounds its size.
        form = await request.post()
        presented = form.get("token")
        if not isinstance(presented, str) or not self.auth.token_ok(presented):
            self._wrong_token(request, client, "sign-in")
            return self._login_page(403)
        self.throttle.succeeded(client)
        log.info("dashboard sign-in", extra={"client": client})
        response = web.HTTPSeeOther("/", headers=_HEADERS)
        response.set_cookie(
            COOKIE,
            self.auth.issue(),
            max_age=int(self.auth.lifetime),
            path="/",
            httponly=True,
            samesite="Strict",
            # Behind a proxy that ends TLS the request here is plain HTTP: REACTOR_DASHBOARD_URL
            # says the browser's side is HTTPS.
            secure=request.secure or self.settings.dashboard_https,
        )
        raise response

    async def logout(self, request: web.Request) -> web.Response:
        """``POST /logout``: end the session, here and in the browser."""
        who = self._admit(request)
        await self._form(request, who)
        self.auth.end(request.cookies.get(COOKIE))
        response = web.HTTPSeeOther("/", headers=_HEADERS)
        response.del_cookie(COOKIE, path="/")
        raise response

    async def retry_hooks(self, request: web.Request) -> web.Response:
        """``POST /actions/hooks/retry`` with ``id`` fields: ``reactor hooks retry ID...``."""
        who = self._admit(request)
        form = await self._form(request, who)
        ids = hook_ops.parse_ids([str(v) for v in form.getall("id", [])])
        changes = await self._acting().retry_hooks(ids)
        message = hook_ops.judge_changes(
            changes, verb="re-queued", allowed=hook_ops.RETRYABLE, result="pending"
        )
        reactor = self.replica()
        if reactor is not None and reactor.hook_runner is not None:
            reactor.hook_runner.wake()  # due now: no need to wait for the runner's next look
        return self._done(request, who, "hooks retry", {"hook_ids": ids}, message)

    async def cancel_hooks(self, request: web.Request) -> web.Response:
        """``POST /actions/hooks/cancel`` with ``id`` fields: ``reactor hooks cancel ID...``."""
        who = self._admit(request)
        form = await self._form(request, who)
        ids = hook_ops.parse_ids([str(v) for v in form.getall("id", [])])
        changes = await self._acting().cancel_hooks(ids)
        message = hook_ops.judge_changes(
            changes, verb="cancelled", allowed=hook_ops.CANCELLABLE, result="cancelled"
        )
        return self._done(request, who, "hooks cancel", {"hook_ids": ids}, message)

    async def release_set_aside(self, request: web.Request) -> web.Response:
        """``POST /actions/set-aside/release`` with ``job_id``: try that job again now."""
        who = self._admit(request)
        form = await self._form(request, who)
        job_id = str(form.get("job_id", ""))
        database = self._acting()
        # A job id of the install's type, in its canonical form, as a notification's is read.
        job = parse_payload(job_id, database.install.id_type)
        if job is None:
            raise UsageError(f"{job_id[:64]!r} is not a job id") from None
        released = await database.release_set_aside_job(job)
        if not released:
            raise UsageError(f"job {job} is not set aside; nothing was released")
        reactor = self.replica()
        if reactor is not None:
            reactor.request_scan()  # it is due: the scan takes it at once
        message = f"released job {job}: it is tried again now"
        return self._done(request, who, "set-aside release", {"job_id": job}, message)

    def _same_site(self, request: web.Request) -> None:
        if not self.auth.enabled:
            raise _forbidden("the page is read-only: REACTOR_DASHBOARD_TOKEN is not set")
        problem = cross_site(request.headers, request.host)
        if problem is not None:
            log.warning(
                "dashboard POST refused: not from the page",
                extra={"client": request.remote, "path": request.path, "reason": problem},
            )
            raise _forbidden(f"refused: {problem}")

    def _admit(self, request: web.Request) -> Who:
        """Who sent ``request``, from its headers alone: nothing of the body is read before the
        sender is known, so a stranger cannot make the process read or parse one."""
        self._same_site(request)
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            client = _client(request)
            wait = self.throttle.wait(client, self.clock())
            if wait is not None:
                raise _too_many(wait)
            if self.auth.token_ok(presented.strip()):
                self.throttle.succeeded(client)
                return "bearer"
            self._wrong_token(request, client, "bearer")
            raise _forbidden("refused: wrong token")
        if not self.auth.session_ok(request.cookies.get(COOKIE)):
            raise _forbidden("refused: sign in at /login first")
        return "cookie"

    async def _form(
        self, request: web.Request, who: Who
    ) -> MultiDictProxy[str | bytes | bytearray | web.FileField]:
        """The body of an admitted POST (at most the application's client_max_size; 413
        beyond it), with its form token checked when a session cookie carried it."""
        form = await request.post()
        if who == "cookie":
            session = request.cookies.get(COOKIE, "")
            csrf = form.get("csrf")
            if not isinstance(csrf, str) or not self.auth.form_ok(session, csrf):
                raise _forbidden("refused: the form is stale or not from this page; reload it")
        return form

    def _wrong_token(self, request: web.Request, client: str, via: str) -> None:
        """Log and count a wrong token from ``client``; never the token."""
        wait = self.throttle.failed(client, self.clock())
        log.warning(
            "dashboard token refused",
            extra={"client": client, "path": request.path, "via": via},
        )
        if wait is not None:
            # Once per lockout: the attempts it refuses are not logged, so a client that keeps
            # guessing cannot fill the log either.
            log.warning(
                "dashboard sign-in throttled",
                extra={
                    "client": client,
                    "failures": self.throttle.limit,
                    "window_s": self.throttle.window,
                    "retry_after_s": math.ceil(wait),
                },
            )

    def _login_page(self, status: int, *, wait: float | None = None) -> web.Response:
        html = render_login(refused=status == 403, enabled=self.auth.enabled, wait=wait)
        headers = dict(_HEADERS)
        if wait is not None:
            headers["Retry-After"] = str(math.ceil(wait))
        return web.Response(text=html, status=status, content_type="text/html", headers=headers)

    def _done(
        self, request: web.Request, who: Who, action: str, touched: dict[str, Any], message: str
    ) -> web.Response:
        self.source.invalidate()
        log.info(
            "dashboard action",
            extra={
                "action": action,
                **touched,
                "result": message,
                "by": who,
                "client": request.remote,
            },
        )
        if who == "bearer":
            return web.json_response({"message": message}, headers=_HEADERS)
        raise web.HTTPSeeOther(f"/?note={self._note(message, ok=True)}", headers=_HEADERS)

    def refused(self, request: web.Request, error: UsageError) -> web.Response:
        """An action the database turned down (unknown ids, a row in the wrong state)."""
        message = str(error)
        log.info("dashboard action refused", extra={"path": request.path, "result": message})
        if request.headers.get("Authorization"):
            return web.json_response({"error": message}, status=409, headers=_HEADERS)
        raise web.HTTPSeeOther(f"/?note={self._note(message, ok=False)}", headers=_HEADERS)

    def _note(self, message: str, *, ok: bool) -> str:
        key = secrets.token_urlsafe(9)
        self._notes[key] = (message, ok)
        while len(self._notes) > _NOTES:
            self._notes.popitem(last=False)
        return key

    def _masked(self, response: web.Response) -> web.Response:
        # Nothing the page shows holds the token; if a stored error ever quoted it, it is
        # masked on the way out all the same.
        if self._token and response.text and self._token in response.text:
            response.text = response.text.replace(self._token, redact.MASK)
        return response


def _client(request: web.Request) -> str:
    """The address a request came from: the peer of the connection. Behind a proxy that is
    the proxy's, so its clients share one count: no header a client writes is believed."""
    return request.remote or "unknown"


def _too_many(wait: float) -> web.HTTPTooManyRequests:
    return web.HTTPTooManyRequests(
        text="refused: too many wrong tokens from this address; try again later\n",
        headers={**_HEADERS, "Retry-After": str(math.ceil(wait))},
    )


def _forbidden(reason: str) -> web.HTTPForbidden:
    return web.HTTPForbidden(text=reason + "\n", headers=_HEADERS)


@web.middleware
async def usage_errors(
    request: web.Request, handler: Callable[[web.Request], Any]
) -> web.StreamResponse:
    """Turn an action's UsageError into the page's note (or a 409 for a script)."""
    try:
        response: web.StreamResponse = await handler(request)
    except UsageError as error:
        dashboard: Dashboard = request.app[DASHBOARD]
        return dashboard.refused(request, error)
    return response


DASHBOARD = web.AppKey("dashboard", Dashboard)
HOSTS = web.AppKey("hosts", HostAllowlist)


@web.middleware
async def right_host(
    request: web.Request, handler: Callable[[web.Request], Any]
) -> web.StreamResponse:
    """421 for a request whose Host is not one the page answers to (DNS rebinding)."""
    if not request.app[HOSTS].allows(request.headers.get(hdrs.HOST)):
        raise web.HTTPMisdirectedRequest(
            text="this page answers to localhost and its configured address only; to reach it "
            "by another name, set REACTOR_DASHBOARD_URL to the address you open it at\n",
            headers=_HEADERS,
        )
    response: web.StreamResponse = await handler(request)
    return response


def install(app: web.Application, dashboard: Dashboard, hosts: HostAllowlist) -> None:
    """Put ``dashboard``'s routes, its Host check and its error handling on ``app``."""
    app[DASHBOARD] = dashboard
    app[HOSTS] = hosts
    app.middlewares.append(right_host)
    app.middlewares.append(usage_errors)
    dashboard.add_routes(app)


def for_reactor(reactor: Reactor) -> Dashboard:
    """The page of one running replica, read through its own pool."""
    return Dashboard(reactor.settings, reactor.database, lambda: reactor)


__all__ = [
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
    "render_page",
    "replica_view",
    "split_host",
]
