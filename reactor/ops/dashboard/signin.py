"""Who may act on the page, at the door of each request: signing in and out with
REACTOR_DASHBOARD_TOKEN, and admitting an action by its bearer token, or by its session cookie
and its form's token. :mod:`.guard` decides (sessions, tokens, the throttle); this is its
aiohttp side, and :mod:`.routes` calls it before any action reads its body.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web

from reactor.ops.dashboard.guard import COOKIE, HEADERS, Auth, Throttle, Who, cross_site
from reactor.ops.dashboard.view import render_login
from reactor.settings.config import Settings

if TYPE_CHECKING:
    from multidict import MultiDictProxy

log = logging.getLogger("reactor.dashboard")


class SignIn:
    """The page's sign-in: its sessions (:class:`Auth`), its throttle of wrong tokens, and the
    handlers of ``/login`` and ``/logout``."""

    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self.auth = Auth(settings.dashboard_token, clock=clock)
        self.throttle = Throttle()

    async def login_form(self, request: web.Request) -> web.Response:
        """``GET /login``: the form that takes the token."""
        html = render_login(refused=False, enabled=self.auth.enabled)
        return web.Response(text=html, content_type="text/html", headers=HEADERS)

    async def login(self, request: web.Request) -> web.Response:
        """``POST /login``: the token in, a session cookie out."""
        self._same_site(request)
        client = client_of(request)
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
        response = web.HTTPSeeOther("/", headers=HEADERS)
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
        who = self.admit(request)
        await self.form(request, who)
        self.auth.end(request.cookies.get(COOKIE))
        response = web.HTTPSeeOther("/", headers=HEADERS)
        response.del_cookie(COOKIE, path="/")
        raise response

    def _same_site(self, request: web.Request) -> None:
        if not self.auth.enabled:
            raise forbidden("the page is read-only: REACTOR_DASHBOARD_TOKEN is not set")
        problem = cross_site(request.headers, request.host)
        if problem is not None:
            log.warning(
                "dashboard POST refused: not from the page",
                extra={"client": request.remote, "path": request.path, "reason": problem},
            )
            raise forbidden(f"refused: {problem}")

    def admit(self, request: web.Request) -> Who:
        """Who sent ``request``, from its headers alone: nothing of the body is read before the
        sender is known, so a stranger cannot make the process read or parse one."""
        self._same_site(request)
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            client = client_of(request)
            wait = self.throttle.wait(client, self.clock())
            if wait is not None:
                raise too_many(wait)
            if self.auth.token_ok(presented.strip()):
                self.throttle.succeeded(client)
                return "bearer"
            self._wrong_token(request, client, "bearer")
            raise forbidden("refused: wrong token")
        if not self.auth.session_ok(request.cookies.get(COOKIE)):
            raise forbidden("refused: sign in at /login first")
        return "cookie"

    async def form(
        self, request: web.Request, who: Who
    ) -> MultiDictProxy[str | bytes | bytearray | web.FileField]:
        """The body of an admitted POST (at most the application's client_max_size; 413
        beyond it), with its form token checked when a session cookie carried it."""
        form = await request.post()
        if who == "cookie":
            session = request.cookies.get(COOKIE, "")
            csrf = form.get("csrf")
            if not isinstance(csrf, str) or not self.auth.form_ok(session, csrf):
                raise forbidden("refused: the form is stale or not from this page; reload it")
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
        headers = dict(HEADERS)
        if wait is not None:
            headers["Retry-After"] = str(math.ceil(wait))
        return web.Response(text=html, status=status, content_type="text/html", headers=headers)


def client_of(request: web.Request) -> str:
    """The address a request came from: the peer of the connection. Behind a proxy that is
    the proxy's, so its clients share one count: no header a client writes is believed."""
    return request.remote or "unknown"


def too_many(wait: float) -> web.HTTPTooManyRequests:
    """429 for a client locked out by the throttle, saying when to try again."""
    return web.HTTPTooManyRequests(
        text="refused: too many wrong tokens from this address; try again later\n",
        headers={**HEADERS, "Retry-After": str(math.ceil(wait))},
    )


def forbidden(reason: str) -> web.HTTPForbidden:
    """403 with ``reason`` as its one line."""
    return web.HTTPForbidden(text=reason + "\n", headers=HEADERS)
