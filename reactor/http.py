"""The reactor over HTTP, served by aiohttp on two addresses.

- ``REACTOR_HTTP_ADDR``: the probes and the metrics, ``/healthz``, ``/readyz`` and ``/metrics``.
  An orchestrator and a scraper reach them, so a container binds them to every interface.
- ``REACTOR_DASHBOARD_ADDR``: the operator's page, ``/`` with ``/api/status``, ``/login`` and
  the actions (:mod:`reactor.dashboard`). It shows job ids, errors and the topology, so it stays
  on loopback unless the operator puts it elsewhere, and answers only to the Host names it
  knows (:class:`reactor.dashboard.HostAllowlist`).

The probes only read memory: :meth:`Reactor.health` (which the health checks keep current) and
the metrics registry. None touches the database, so a slow or absent database can make
``/readyz`` say 503 but never makes a probe hang. The page reads the database through its own
cache, one ``status`` every few seconds at most, on a bounded wait.

Both servers run on the reactor's own event loop, so neither may let a client hold what the
loop needs: a connection must send its first request head within :data:`HEAD_SECONDS`, an idle
one is closed after :data:`KEEPALIVE_SECONDS`, at most :data:`MAX_CONNECTIONS` are open per
server and :data:`MAX_PER_PEER` per peer address, with places kept for a peer that holds none
(:class:`reactor.admission.Door`; more are closed at once, and counted), and a body is at most
:data:`MAX_BODY` bytes. Together they bound the file descriptors a stranger can take, whatever
they send, and leave the orchestrator's probes a place while one peer holds all it may.

:func:`serving` and :func:`serving_page` bind on entry, so a port that is taken fails at
startup, and close on exit, after the reactor has drained. Neither installs a signal handler
(``reactor run`` owns SIGTERM).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Protocol

import anyio
import anyio.abc
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import choose_encoder

from reactor.admission import HEAD_SECONDS as HEAD_SECONDS
from reactor.admission import MAX_CONNECTIONS as MAX_CONNECTIONS
from reactor.admission import MAX_PER_PEER as MAX_PER_PEER
from reactor.admission import Door, DropReason, HeadEnd, Tally
from reactor.config import Settings
from reactor.dashboard import Dashboard, HostAllowlist, install
from reactor.errors import ConfigError
from reactor.replica import Replica
from reactor.service import Reactor

log = logging.getLogger(__name__)


class Exposed(Protocol):
    """What a replica's metrics give the servers: the registry /metrics encodes, and the
    counter of the connections they dropped."""

    @property
    def registry(self) -> CollectorRegistry: ...
    @property
    def http_dropped(self) -> Counter: ...


class Probed(Protocol):
    """What the probes read: a pair's reactor, or a replica of several pairs."""

    @property
    def metrics(self) -> Exposed: ...
    def health(self) -> tuple[bool, bool, str]: ...


# How long closing may wait for requests in flight; probes answer in microseconds.
SHUTDOWN_SECONDS = 2.0
# An idle keep-alive connection is closed after this (aiohttp's own default is an hour).
# Scrapers and probes reconnect at no cost worth counting.
KEEPALIVE_SECONDS = 15.0
# Connections asyncio accepts per turn of the loop. A connection refused by the caps keeps its
# descriptor for a few turns (accepted; its transport made by a task; refused; closed), so this
# bounds what a burst takes beyond the caps: a few times this, per server.
ACCEPTS_PER_TURN = 8
# Connections the kernel queues before they are accepted (capped by net.core.somaxconn). Longer
# than what one peer's reconnecting sockets can fill, so that a probe's connection finds a place
# in the queue, where the caps can tell it from theirs: with a short queue, the kernel drops
# the probe's handshake and it waits a second to try again. Queued connections cost kernel
# memory, not descriptors.
LISTEN_QUEUE = 1024
# The largest request body: the page's forms carry a few ids and a token.
MAX_BODY = 64 * 1024
# Repeats of a flood of one error (accept() failing, connections over the cap) are counted and
# logged at most this often.
FLOOD_LOG_SECONDS = 10.0

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

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


def page_app(page: Dashboard, hosts: HostAllowlist) -> web.Application:
    """The operator's page, answering to the Host names of ``hosts`` only."""
    app = web.Application(client_max_size=MAX_BODY)
    install(app, page, hosts)
    return app


# -- holding connections to account ------------------------------------------------------------


class GuardedConnection(asyncio.Protocol):
    """One accepted connection: admitted by its :class:`Door`, then handed to aiohttp's
    request handler, and closed if its first request head is not complete in time.

    aiohttp has no deadline for a request head: its keep-alive timer (an hour by default) is
    the only bound on a connection that never finishes one. Rather than subclass its
    ``RequestHandler`` (whose constructor and internals change between releases), this wraps
    it from outside, through interfaces that are documented and stable: ``web.Server`` is a
    protocol factory for ``loop.create_server`` (aiohttp's low-level server), and the wrapper
    passes on the six methods of ``asyncio.Protocol`` unchanged. Connections past the cap never
    get a handler, so they cost a descriptor for one turn of the loop and no more.
    """

    def __init__(self, door: Door, handler: Callable[[], asyncio.Protocol]) -> None:
        self._door = door
        self._make_handler = handler
        self._inner: asyncio.Protocol | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._head = HeadEnd()
        self._peer = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Admit the connection and start its deadline, or close it at once."""
        self._peer = peer_address(transport)
        if not self._door.admit(self._peer):
            assert isinstance(transport, asyncio.Transport)
            transport.abort()
            return
        self._inner = self._make_handler()
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(self._door.head_seconds, self._too_slow, transport)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        """Pass the bytes on; the deadline ends with the first request head."""
        if self._inner is None:
            return
        if self._deadline is not None and self._head.feed(data):
            self._deadline.cancel()
            self._deadline = None
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        """Pass it on."""
        return None if self._inner is None else self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        """Release the connection's place, and tell the handler."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        inner, self._inner = self._inner, None
        if inner is not None:
            self._door.release(self._peer)
            inner.connection_lost(exc)

    def pause_writing(self) -> None:
        """Pass it on: aiohttp's flow control."""
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        """Pass it on: aiohttp's flow control."""
        if self._inner is not None:
            self._inner.resume_writing()

    def _too_slow(self, transport: asyncio.BaseTransport) -> None:
        self._deadline = None
        if self._inner is not None and not transport.is_closing():
            self._door.dropped("head_timeout")
            transport.close()


def peer_address(transport: asyncio.BaseTransport) -> str:
    """The address a connection comes from, without its port: what :class:`Door` counts by.
    An IPv4 peer reached over an IPv6 socket (``::ffff:10.0.0.1``) counts as its IPv4
    address."""
    peer = transport.get_extra_info("peername")
    if not isinstance(peer, tuple) or not peer:
        return ""
    return str(peer[0]).removeprefix("::ffff:")


# -- floods of one message, counted --------------------------------------------------------------


class FloodLog:
    """Logs an event that may come thousands of times a second once per ``interval`` at most,
    with the count, on the running loop's clock."""

    def __init__(
        self,
        report: Callable[[int], None],
        *,
        interval: float = FLOOD_LOG_SECONDS,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self._report = report
        self._tally = Tally(interval)
        self._loop = loop
        self._flush: asyncio.TimerHandle | None = None

    def seen(self) -> None:
        """One more occurrence."""
        loop = self._loop or asyncio.get_running_loop()
        count = self._tally.add(loop.time())
        if count:
            self._report(count)
        elif self._flush is None:
            self._flush = loop.call_at(self._tally.quiet_until, self._end_of_quiet)

    def _end_of_quiet(self) -> None:
        self._flush = None
        loop = self._loop or asyncio.get_running_loop()
        count = self._tally.take(loop.time())
        if count:
            self._report(count)

    def close(self) -> None:
        """Report what is held back now."""
        if self._flush is not None:
            self._flush.cancel()
            self._end_of_quiet()


# asyncio's message when accept() fails for want of descriptors or memory (EMFILE, ENFILE,
# ENOBUFS, ENOMEM). It retries a second later, and logs every attempt, up to a backlog's worth
# each time: with the descriptors gone, thousands of lines a second.
ACCEPT_FAILED = "socket.accept() out of system resource"


@contextmanager
def accept_errors_counted(*, interval: float = FLOOD_LOG_SECONDS) -> Iterator[None]:
    """While the block runs, the loop logs a flood of failed accept() calls once per
    ``interval`` with their count; every other error goes to the handler that was there."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    last_error: list[str] = ["?"]

    def report(count: int) -> None:
        log.error(
            "cannot accept connections: out of system resources",
            extra={"error": last_error[0], "times": count, "logged_every_s": interval},
        )

    flood = FloodLog(report, interval=interval, loop=loop)

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == ACCEPT_FAILED:
            error = context.get("exception")
            last_error[0] = str(error) if error is not None else "?"
            flood.seen()
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)
    try:
        yield
    finally:
        loop.set_exception_handler(previous)
        flood.close()


# -- serving -----------------------------------------------------------------------------------


@asynccontextmanager
async def listening(
    app: web.Application,
    addr: tuple[str, int],
    *,
    variable: str,
    door: Door,
    optional: bool = False,
) -> AsyncIterator[tuple[str, int] | None]:
    """Serve ``app`` on ``addr`` through ``door`` while the block runs; yields the bound
    (host, port). A port that cannot be bound raises ConfigError naming ``variable``; but
    ``optional``, one that is taken yields None, and nothing is served."""
    host, port = addr
    # access_log=None: probes every few seconds would drown the reactor's own log lines.
    runner = web.AppRunner(
        app,
        access_log=None,
        shutdown_timeout=SHUTDOWN_SECONDS,
        keepalive_timeout=KEEPALIVE_SECONDS,
    )
    await runner.setup()
    server: asyncio.Server | None = None
    try:
        handler = runner.server
        assert handler is not None  # set up above
        loop = asyncio.get_running_loop()
        try:
            server = await loop.create_server(
                lambda: GuardedConnection(door, handler), host, port, backlog=ACCEPTS_PER_TURN
            )
        except OSError as error:
            # asyncio words it "error while attempting to bind on address ...: <reason>".
            reason = os.strerror(error.errno) if error.errno else str(error)
            if optional and error.errno == errno.EADDRINUSE:
                yield None
                return
            raise ConfigError(
                f"{variable}={_show(host, port)}: cannot listen: {reason}; "
                "choose another address, or set it empty to disable"
            ) from None
        for listener in server.sockets:
            _lengthen_queue(listener, LISTEN_QUEUE)
        bound_host, bound_port = server.sockets[0].getsockname()[:2]
        yield bound_host, bound_port
    finally:
        # Shielded: closing must finish even when the task group around us is being cancelled.
        with anyio.move_on_after(SHUTDOWN_SECONDS + 1, shield=True):
            if server is not None:
                server.close()
            await runner.cleanup()
            if server is not None:
                await server.wait_closed()


def _lengthen_queue(listener: socket.socket, length: int) -> None:
    """Let the kernel queue ``length`` connections on ``listener``, which asyncio set listening
    with a queue as long as its accepts per turn. listen() on a socket that listens already
    changes its queue alone; asyncio hands out no method for it, so it goes through a
    duplicate of the descriptor, which is the same socket."""
    with listener.dup() as same:
        same.listen(length)


def _door(server: str, replica: Callable[[], Probed | None]) -> Door:
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
        if reason != "head_timeout":
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
        log.info("serving /healthz, /readyz and /metrics", extra={"http_addr": _show(*bound)})
        yield bound


@asynccontextmanager
async def serving_page(
    page: Dashboard,
    addr: tuple[str, int] | None,
    *,
    variable: str = "REACTOR_DASHBOARD_ADDR",
    counted: Callable[[], Probed | None] | None = None,
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
                extra={"dashboard_addr": _show(*addr)},
            )
            yield None
            return
        log.info(
            "serving the operator's page",
            extra={
                "dashboard_addr": _show(*bound),
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
    return f"http://{_show(host, port)}/"


def _show(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
