"""Health, metrics and the operator's page over HTTP, served by aiohttp: ``/healthz``,
``/readyz``, ``/metrics``, and ``/`` with ``/api/status`` (:mod:`reactor.dashboard`).

The probes only read memory: :meth:`Reactor.health` (which the health checks keep current) and
the metrics registry. None touches the database, so a slow or absent database can make
``/readyz`` say 503 but never makes a probe hang. The page reads the database through its own
cache, one ``status`` every few seconds at most, on a bounded wait; a slow page holds up no
probe, since aiohttp serves every request in a task of its own.

aiohttp's site runs on the event loop without a task of its own, and installs no signal
handlers (``reactor run`` owns SIGTERM). :func:`serving` binds on entry, so a port that is taken
fails at startup, and closes on exit, after the reactor has drained.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
from aiohttp import web
from prometheus_client.exposition import choose_encoder

from reactor.dashboard import Dashboard, for_reactor, install
from reactor.errors import ConfigError
from reactor.service import Reactor

log = logging.getLogger(__name__)

# How long closing may wait for requests in flight; probes answer in microseconds.
SHUTDOWN_SECONDS = 2.0

_NO_CACHE = {"Cache-Control": "no-store"}


def make_app(reactor: Reactor) -> web.Application:
    """The aiohttp application serving ``reactor``'s health, metrics and page."""
    return page_app(for_reactor(reactor))


def page_app(page: Dashboard) -> web.Application:
    """The application for ``page``; the probes answer for whichever replica it shows (503
    while there is none)."""

    def absent() -> web.Response:
        return web.json_response(
            {"status": "unhealthy", "ready": False, "reason": "no replica running"},
            status=503,
            headers=_NO_CACHE,
        )

    async def healthz(request: web.Request) -> web.Response:
        reactor = page.replica()
        if reactor is None:
            return absent()
        alive, _, reason = reactor.health()
        if alive:
            return web.json_response({"status": "alive"}, headers=_NO_CACHE)
        return web.json_response(
            {"status": "unhealthy", "reason": reason}, status=503, headers=_NO_CACHE
        )

    async def readyz(request: web.Request) -> web.Response:
        reactor = page.replica()
        if reactor is None:
            return absent()
        _, ready, reason = reactor.health()
        return web.json_response(
            {"ready": ready, "reason": reason}, status=200 if ready else 503, headers=_NO_CACHE
        )

    async def metrics(request: web.Request) -> web.Response:
        reactor = page.replica()
        if reactor is None:
            return absent()
        # Prometheus text by default; OpenMetrics when the scraper asks for it.
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(
            body=encode(reactor.metrics.registry),
            headers={"Content-Type": content_type, **_NO_CACHE},
        )

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    install(app, page)
    return app


@asynccontextmanager
async def serving(
    reactor: Reactor, addr: tuple[str, int] | None
) -> AsyncIterator[tuple[str, int] | None]:
    """Serve ``reactor`` on ``addr`` (None: disabled) while the block runs; yields the bound
    (host, port), which tells a caller that asked for port 0 where it landed.

    A port that cannot be bound raises ConfigError naming REACTOR_HTTP_ADDR.
    """
    async with serving_page(for_reactor(reactor), addr) as bound:
        yield bound


@asynccontextmanager
async def serving_page(
    page: Dashboard, addr: tuple[str, int] | None
) -> AsyncIterator[tuple[str, int] | None]:
    """:func:`serving` for a page whose replica may change (the demo's fleets)."""
    if addr is None:
        yield None
        return
    host, port = addr
    # access_log=None: probes every few seconds would drown the reactor's own log lines.
    runner = web.AppRunner(page_app(page), access_log=None, shutdown_timeout=SHUTDOWN_SECONDS)
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as error:
            # asyncio words it "error while attempting to bind on address ...: <reason>".
            reason = os.strerror(error.errno) if error.errno else str(error)
            raise ConfigError(
                f"REACTOR_HTTP_ADDR={_show(host, port)}: cannot listen: {reason}; "
                "choose another address, or set it empty to disable"
            ) from None
        bound_host, bound_port = runner.addresses[0][:2]
        log.info(
            "serving /healthz, /readyz and /metrics",
            extra={
                "http_addr": _show(bound_host, bound_port),
                "page": page_url(bound_host, bound_port),
                "page_actions": page.auth.enabled,
            },
        )
        yield bound_host, bound_port
    finally:
        # Shielded: closing must finish even when the task group around us is being cancelled.
        with anyio.move_on_after(SHUTDOWN_SECONDS + 1, shield=True):
            await runner.cleanup()


async def serve_http(
    reactor: Reactor,
    addr: tuple[str, int] | None,
    *,
    task_status: anyio.abc.TaskStatus[tuple[str, int] | None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """:func:`serving` as a task: started once bound, serves until its task group is cancelled.

    Note that an error before ``started`` reaches ``tg.start()``'s caller wrapped in an
    ExceptionGroup; ``reactor run`` uses :func:`serving` directly to keep its one-line errors.
    """
    async with serving(reactor, addr) as bound:
        task_status.started(bound)
        await anyio.sleep_forever()


def page_url(host: str, port: int) -> str:
    """The address of the page served on (host, port), as a browser on this host writes it."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://{_show(host, port)}/"


def _show(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
