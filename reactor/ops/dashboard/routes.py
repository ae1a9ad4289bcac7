"""The page's handlers on aiohttp: ``/``, ``/api/status``, sign-in and out, and the actions,
each admitted by :mod:`.guard` before any body is read."""

from __future__ import annotations

import functools
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from urllib.parse import urlencode

from aiohttp import hdrs, web

from reactor import db
from reactor.core.payload import parse_payload
from reactor.errors import UsageError
from reactor.ops.dashboard.guard import COOKIE, HEADERS, HostAllowlist, Who
from reactor.ops.dashboard.signin import SignIn
from reactor.ops.dashboard.source import Snapshot, StatusSource
from reactor.ops.dashboard.view import render_page, replica_view
from reactor.runtime.view import PairView
from reactor.settings.config import Settings
from reactor.telemetry import redact
from reactor.telemetry.metrics import Metrics

log = logging.getLogger("reactor.dashboard")

# Outcomes of actions, shown once on the page the browser is sent back to.
_NOTES = 64


class Served(Protocol):
    """A running pair as the page reaches it (:class:`reactor.runtime.service.Reactor`): the
    view it publishes, its queries, and the two things an action asks of it."""

    @property
    def settings(self) -> Settings:
        """The pair's settings."""
        ...

    @property
    def database(self) -> db.Database:
        """The pair's queries."""
        ...

    @property
    def metrics(self) -> Metrics:
        """The pair's metrics (the page's dropped connections are counted there)."""
        ...

    def view(self) -> PairView:
        """What the page shows of the pair, read now."""
        ...

    def request_scan(self) -> None:
        """Scan soon (a job set aside was released: it is due)."""
        ...

    def wake_hooks(self) -> None:
        """Claim hook rows now (some were re-queued)."""
        ...


@dataclass(frozen=True)
class Shown:
    """One pair as the page shows it: its name (None in a replica of one pair), the reactor
    whose memory the page shows (None while none runs), where its report is read and its
    actions go (None: the reactor's own queries), and its report."""

    name: str | None
    replica: Callable[[], Served | None]
    database: db.Database | None
    source: StatusSource

    def queries(self) -> db.Database | None:
        """Where the page reads and acts: its own database, else the replica's; None while
        neither exists."""
        if self.database is not None:
            return self.database
        reactor = self.replica()
        return None if reactor is None else reactor.database


class Dashboard:
    """The page's state in one process: each pair's report, the sessions, the throttle and the
    notes.

    ``replica`` gives the reactor whose memory the page shows (None while none runs: the
    demo's outage, or ``reactor run`` checking the database); the report and the actions go
    through ``database``, or the replica's own when that is None. A replica of several pairs
    shows one at a time (:meth:`of_pairs`): ``?pair=NAME`` chooses it, the first by default,
    and the page links to the others.
    """

    def __init__(
        self,
        settings: Settings,
        database: db.Database | None,
        replica: Callable[[], Served | None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.signin = SignIn(settings, clock=clock)
        self.auth = self.signin.auth
        self.throttle = self.signin.throttle
        self._token = settings.dashboard_token
        self._notes: OrderedDict[str, tuple[str, bool]] = OrderedDict()
        # The reactor whose metrics count the page's dropped connections: the first pair's.
        self.replica = replica
        self.shown: dict[str | None, Shown] = {}
        self._show(None, replica, database)

    @classmethod
    def of_pairs(
        cls,
        settings: Settings,
        replicas: Mapping[str, Callable[[], Served | None]],
        *,
        absent: Callable[[str], str],
        clock: Callable[[], float] = time.monotonic,
    ) -> Dashboard:
        """The page of a replica that serves several pairs, each read through its reactor;
        ``absent(name)`` says why a pair has none (not started yet, or not served)."""
        names = list(replicas)
        page = cls(settings, None, replicas[names[0]], clock=clock)
        page.shown = {}
        for name in names:
            page._show(name, replicas[name], None, absent=functools.partial(absent, name))
        return page

    def _show(
        self,
        name: str | None,
        replica: Callable[[], Served | None],
        database: db.Database | None,
        *,
        absent: Callable[[], str] | None = None,
    ) -> None:
        source = StatusSource(self.settings, lambda: None)
        if absent is not None:
            source.absent = absent
        shown = Shown(name, replica, database, source)
        source.queries = shown.queries
        self.shown[name] = shown

    @property
    def source(self) -> StatusSource:
        """The first pair's report (the only one's, in a replica of one pair)."""
        return next(iter(self.shown.values())).source

    def _pair(self, request: web.Request) -> Shown:
        # The pair a request is about: ``pair`` in its query, the first when it names none.
        if len(self.shown) == 1:
            return next(iter(self.shown.values()))
        name = request.query.get("pair")
        if name is None:
            return next(iter(self.shown.values()))
        shown = self.shown.get(name)
        if shown is None:
            raise web.HTTPNotFound(
                text=f"no pair {name[:64]!r} here; pairs: {', '.join(map(str, self.shown))}\n",
                headers=HEADERS,
            )
        return shown

    def _acting(self, shown: Shown) -> db.Database:
        database = shown.queries()
        if database is None:
            raise UsageError("no replica runs yet: the database is being checked; try again")
        return database

    def add_routes(self, app: web.Application) -> None:
        """Serve the page, the document and the actions on ``app``."""
        app.router.add_get("/", self.page)
        app.router.add_get("/api/status", self.api_status)
        app.router.add_get("/login", self.signin.login_form)
        app.router.add_post("/login", self.signin.login)
        app.router.add_post("/logout", self.signin.logout)
        app.router.add_post("/actions/hooks/retry", self.retry_hooks)
        app.router.add_post("/actions/hooks/cancel", self.cancel_hooks)
        app.router.add_post("/actions/set-aside/release", self.release_set_aside)

    async def document(self, shown: Shown | None = None) -> tuple[Snapshot, dict[str, Any]]:
        """What /api/status serves for ``shown`` (the first pair by default): the report with
        this replica's view added, and in a replica of several pairs, which pair it is."""
        shown = shown or next(iter(self.shown.values()))
        snapshot = await shown.source.get()
        body: dict[str, Any] = dict(snapshot.document or {})
        served = shown.replica()
        body["replica"] = replica_view(None if served is None else served.view())
        if shown.name is not None:
            body["pair"] = shown.name
            body["pairs"] = list(self.shown)
        if snapshot.error is not None:
            body["error"] = snapshot.error
        return snapshot, body

    async def api_status(self, request: web.Request) -> web.Response:
        """``GET /api/status``: the document as JSON; 503 when no report could be read yet."""
        snapshot, body = await self.document(self._pair(request))
        response = web.json_response(body, status=200 if snapshot.document else 503)
        return self._masked(response)

    async def page(self, request: web.Request) -> web.Response:
        """``GET /``: the page."""
        shown = self._pair(request)
        snapshot, body = await self.document(shown)
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
            now=shown.source.clock(),
            pair=shown.name,
            pairs=[name for name in self.shown if name is not None],
        )
        response = web.Response(text=html, content_type="text/html", headers=HEADERS)
        return self._masked(response)

    async def retry_hooks(self, request: web.Request) -> web.Response:
        """``POST /actions/hooks/retry`` with ``id`` fields: ``reactor hooks retry ID...``."""
        # `reactor hooks`' own module, which brings rich for its tables: loaded by the first
        # action rather than at start (a replica is ready before anyone acts).
        from reactor.hooks import ops as hook_ops

        who, shown, ids = await self._hook_ids(request)
        changes = await self._acting(shown).retry_hooks(ids)
        message = hook_ops.judge_changes(
            changes, verb="re-queued", allowed=hook_ops.RETRYABLE, result="pending"
        )
        served = shown.replica()
        if served is not None:
            served.wake_hooks()  # due now: no need to wait for the runner's next look
        return self._done(request, who, "hooks retry", {"hook_ids": ids}, message)

    async def cancel_hooks(self, request: web.Request) -> web.Response:
        """``POST /actions/hooks/cancel`` with ``id`` fields: ``reactor hooks cancel ID...``."""
        from reactor.hooks import ops as hook_ops

        who, shown, ids = await self._hook_ids(request)
        changes = await self._acting(shown).cancel_hooks(ids)
        message = hook_ops.judge_changes(
            changes, verb="cancelled", allowed=hook_ops.CANCELLABLE, result="cancelled"
        )
        return self._done(request, who, "hooks cancel", {"hook_ids": ids}, message)

    async def _hook_ids(self, request: web.Request) -> tuple[Who, Shown, list[int]]:
        """Who sent a hook action, of which pair, and the hook rows its ``id`` fields name."""
        from reactor.hooks import ops as hook_ops

        who = self.signin.admit(request)
        shown = self._pair(request)
        form = await self.signin.form(request, who)
        return who, shown, hook_ops.parse_ids([str(v) for v in form.getall("id", [])])

    async def release_set_aside(self, request: web.Request) -> web.Response:
        """``POST /actions/set-aside/release`` with ``job_id``: try that job again now."""
        who = self.signin.admit(request)
        shown = self._pair(request)
        form = await self.signin.form(request, who)
        job_id = str(form.get("job_id", ""))
        database = self._acting(shown)
        # A job id of the install's type, in its canonical form, as a notification's is read.
        job = parse_payload(job_id, database.install.id_type)
        if job is None:
            raise UsageError(f"{job_id[:64]!r} is not a job id") from None
        released = await database.release_set_aside_job(job)
        if not released:
            raise UsageError(f"job {job} is not set aside; nothing was released")
        served = shown.replica()
        if served is not None:
            served.request_scan()  # it is due: the scan takes it at once
        message = f"released job {job}: it is tried again now"
        return self._done(request, who, "set-aside release", {"job_id": job}, message)

    def _done(
        self, request: web.Request, who: Who, action: str, touched: dict[str, Any], message: str
    ) -> web.Response:
        shown = self._pair(request)
        shown.source.invalidate()
        log.info(
            "dashboard action",
            extra={
                "action": action,
                **({"pair": shown.name} if shown.name is not None else {}),
                **touched,
                "result": message,
                "by": who,
                "client": request.remote,
            },
        )
        if who == "bearer":
            return web.json_response({"message": message}, headers=HEADERS)
        raise web.HTTPSeeOther(self._back(shown, self._note(message, ok=True)), headers=HEADERS)

    def refused(self, request: web.Request, error: UsageError) -> web.Response:
        """An action the database turned down (unknown ids, a row in the wrong state)."""
        message = str(error)
        log.info("dashboard action refused", extra={"path": request.path, "result": message})
        if request.headers.get("Authorization"):
            return web.json_response({"error": message}, status=409, headers=HEADERS)
        shown = self._pair(request)
        raise web.HTTPSeeOther(self._back(shown, self._note(message, ok=False)), headers=HEADERS)

    @staticmethod
    def _back(shown: Shown, note: str) -> str:
        # The page of the pair acted on, with the action's outcome.
        query = {"note": note} if shown.name is None else {"pair": shown.name, "note": note}
        return "/?" + urlencode(query)

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
            headers=HEADERS,
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


def for_reactor(reactor: Served) -> Dashboard:
    """The page of one running replica, read through its own pool."""
    return Dashboard(reactor.settings, reactor.database, lambda: reactor)
