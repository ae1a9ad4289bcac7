"""The reactor over HTTP, served by aiohttp on two addresses.

- ``REACTOR_HTTP_ADDR``: the probes and the metrics, ``/healthz``, ``/readyz`` and ``/metrics``.
  An orchestrator and a scraper reach them, so a container binds them to every interface.
- ``REACTOR_DASHBOARD_ADDR``: the operator's page, ``/`` with ``/api/status``, ``/login`` and
  the actions (:mod:`reactor.ops.dashboard`). It shows job ids, errors and the topology, so it stays
  on loopback unless the operator puts it elsewhere, and answers only to the Host names it
  knows (:class:`reactor.ops.dashboard.HostAllowlist`).

The probes only read memory: :meth:`Reactor.health` (which the health checks keep current) and
the metrics registry. None touches the database, so a slow or absent database can make
``/readyz`` say 503 but never makes a probe hang. The page reads the database through its own
cache, one ``status`` every few seconds at most, on a bounded wait.

Both servers run on the reactor's own event loop, so neither may let a client hold what the
loop needs: :mod:`reactor.ops.accept` bounds the connections, the time each stage of a request
may take (head, body, answers left unread), the requests sent ahead of their answers, and the
body size of each.

:func:`serving` and :func:`serving_page` bind on entry, so a port that is taken fails at
startup, and close on exit, after the reactor has drained. Neither installs a signal handler
(``reactor run`` owns SIGTERM).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

import anyio
import anyio.abc
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import choose_encoder

from reactor.ops.accept import MAX_BODY_BYTES, FloodLog, listening, show
from reactor.ops.admission import MAX_CONNECTIONS, MAX_PER_PEER, Door
from reactor.ops.dashboard import Dashboard, HostAllowlist, install
from reactor.runtime.replica import Replica
from reactor.runtime.service import Reactor
from reactor.settings.config import Settings
from reactor.telemetry.metrics import DropReason

log = logging.getLogger("reactor.http")


class Exposed(Protocol):
    """What a replica's metrics give the servers: the registry /metrics encodes, and the
    counter of the connections they dropped."""

    @property
    def registry(self) -> CollectorRegistry: ...
    @property
    def http_dropped(self) -> Counter: ...


class Counted(Protocol):
    """Whose metrics count a server's dropped connections."""

    @property
    def metrics(self) -> Exposed: ...


class Probed(Counted, Protocol):
    """What the probes read: a pair's reactor, or a replica of several pairs."""

    def health(self) -> tuple[bool, bool, str]: ...


_NO_CACHE = {"Cache-Control": "no-store"}


# -- the applications --------------------------------------------------------------------------


def probes_app(replica: Callable[[], Probed | None], *, starting: bool = False) -> web.Application:
    """``/healthz``, ``/readyz`` and ``/metrics`` for whichever replica ``replica`` gives (503
    while there is none). ``starting``: none yet means the process is still checking the
    database, alive but not ready (``reactor run``'s first seconds); otherwise none runs (the
    demo's outage)."""
    reason = "starting: checking the database" if starting else "no replica running"

    def absent() -> web.Response:
        return web.json_response(
            {"status": "unhealthy", "ready": False, "reason": reason},
            status=503,
            headers=_NO_CACHE,
        )

    async def healthz(request: web.Request) -> web.Response:
        reactor = replica()
        if reactor is None and starting:
            return web.json_response({"status": "starting"}, headers=_NO_CACHE)
        if reactor is None:
            return absent()
        alive, _, reason = reactor.health()
        if alive:
            return web.json_response({"status": "alive"}, headers=_NO_CACHE)
        return web.json_response(
            {"status": "unhealthy", "reason": reason}, status=503, headers=_NO_CACHE
        )

    async def readyz(request: web.Request) -> web.Response:
        reactor = replica()
        if reactor is None:
            return absent()
        _, ready, reason = reactor.health()
        return web.json_response(
            {"ready": ready, "reason": reason}, status=200 if ready else 503, headers=_NO_CACHE
        )

    async def metrics(request: web.Request) -> web.Response:
        reactor = replica()
        if reactor is None:
            return absent()
        # Prometheus text by default; OpenMetrics when the scraper asks for it.
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(
            body=encode(reactor.metrics.registry),
            headers={"Content-Type": content_type, **_NO_CACHE},
        )

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


def page_app(page: Dashboard, hosts: HostAllowlist) -> web.Application:
    """The operator's page, answering to the Host names of ``hosts`` only."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    install(app, page, hosts)
    return app


# -- serving ---------------------------------------------------------------------------------


def _door(server: str, replica: Callable[[], Counted | None]) -> Door[Any]:
    """A door whose drops are counted in the metrics of the replica shown, and a flood of
    connections over the cap logged once in a while."""

    def report(count: int) -> None:
        log.warning(
            "HTTP connections refused: too many open",
            extra={
                "server": server,
                "limit": MAX_CONNECTIONS,
                "per_peer": MAX_PER_PEER,
                "times": count,
            },
        )

    over_cap = FloodLog(report)

    def dropped(reason: DropReason) -> None:
        reactor = replica()
        if reactor is not None:
            reactor.metrics.http_dropped.labels(server, reason).inc()
        if reason in ("limit", "peer_limit"):
            over_cap.seen()

    return Door(server, dropped=dropped)


@asynccontextmanager
async def serving(
    reactor: Reactor, addr: tuple[str, int] | None
) -> AsyncIterator[tuple[str, int] | None]:
    """Serve ``reactor``'s probes and metrics on ``addr`` (None: disabled) while the block runs;
    yields the bound (host, port), which tells a caller that asked for port 0 where it landed.

    A port that cannot be bound raises ConfigError naming REACTOR_HTTP_ADDR.
    """
    async with serving_probes(lambda: reactor, addr) as bound:
        yield bound


@asynccontextmanager
async def serving_probes(
    replica: Callable[[], Probed | None], addr: tuple[str, int] | None, *, starting: bool = False
) -> AsyncIterator[tuple[str, int] | None]:
    """:func:`serving` for whichever replica ``replica`` gives (see :func:`probes_app`)."""
    if addr is None:
        yield None
        return
    door = _door("probes", replica)
    app = probes_app(replica, starting=starting)
    async with listening(app, addr, variable="REACTOR_HTTP_ADDR", door=door) as bound:
        assert bound is not None  # not optional: a port that is taken raised
        log.info("serving /healthz, /readyz and /metrics", extra={"http_addr": show(*bound)})
        yield bound


@asynccontextmanager
async def serving_page(
    page: Dashboard,
    addr: tuple[str, int] | None,
    *,
    variable: str = "REACTOR_DASHBOARD_ADDR",
    counted: Callable[[], Counted | None] | None = None,
    optional: bool = False,
) -> AsyncIterator[tuple[str, int] | None]:
    """Serve the operator's page on ``addr`` (None: disabled) while the block runs; yields the
    bound (host, port). A port that cannot be bound raises ConfigError naming ``variable``;
    but ``optional`` (``addr`` is the default, not the operator's choice), one that is taken
    logs a warning and yields None: the page is not worth a replica. Connections dropped are
    counted in ``counted``'s metrics (by default the page's first pair's replica).

    The page answers to loopback names, the host it is bound to, and the host of
    REACTOR_DASHBOARD_URL; any other Host gets 421.
    """
    if addr is None:
        yield None
        return
    hosts = HostAllowlist.for_page(addr[0], page.settings.dashboard_host)
    door = _door("page", counted or page.replica)
    app = page_app(page, hosts)
    async with listening(app, addr, variable=variable, door=door, optional=optional) as bound:
        if bound is None:
            log.warning(
                "not serving the operator's page: its default address is taken, most likely "
                f"by another replica on this host; set {variable} to serve it elsewhere",
                extra={"dashboard_addr": show(*addr)},
            )
            yield None
            return
        log.info(
            "serving the operator's page",
            extra={
                "dashboard_addr": show(*bound),
                "page": page.settings.dashboard_url or page_url(*bound),
                "page_actions": page.auth.enabled,
            },
        )
        yield bound


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


@asynccontextmanager
async def serving_replica(
    settings: Settings, replica: Callable[[], Replica | None], pairs: Sequence[str] = ()
) -> AsyncIterator[None]:
    """What ``reactor run`` serves: the probes on REACTOR_HTTP_ADDR and the page on
    REACTOR_DASHBOARD_ADDR (unless its default address is taken), each when set, from before
    ``replica`` gives the replica (the database is being checked: the probes say starting)
    until the block ends. With several ``pairs`` the page shows one at a time, chosen by
    name."""

    def pair(name: str | None) -> Callable[[], Reactor | None]:
        def shown() -> Reactor | None:
            running = replica()
            if running is None:
                return None
            return running.only if name is None else running.reactors.get(name)

        return shown

    def absent(name: str) -> str:
        running = replica()
        if running is not None and name in running.broken:
            return f"this pair is not served: {running.broken[name]}"
        return "no replica runs yet: the database is being checked"

    page = (
        Dashboard.of_pairs(settings, {name: pair(name) for name in pairs}, absent=absent)
        if len(pairs) > 1
        else Dashboard(settings, None, pair(None))
    )
    async with (
        serving_probes(replica, settings.http_addr, starting=True),
        serving_page(
            page,
            settings.dashboard_addr,
            counted=replica,
            optional=not settings.dashboard_addr_chosen,
        ),
    ):
        yield


def page_url(host: str, port: int) -> str:
    """The address of the page served on (host, port), as a browser on this host writes it."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://{show(host, port)}/"
