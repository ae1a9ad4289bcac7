"""Accepting the connections of the reactor's HTTP servers: the I/O half of
:mod:`reactor.ops.admission`.

Both servers run on the reactor's own event loop, so neither may let a client hold what the
loop needs. A connection has a deadline at every stage of a request: its head within
:data:`HEAD_SECONDS` (the first from the connection's start, each later one from its first
byte), a declared body within :data:`BODY_SECONDS` of its head, and its answers, once they fill
its small kernel send buffer (:data:`SEND_BUFFER_BYTES`), taken by the peer within
:data:`WRITE_STALL_SECONDS`; between requests an idle one is closed after
:data:`KEEPALIVE_SECONDS`. It may send at most :data:`MAX_PIPELINED` requests ahead of their
answers. At most :data:`MAX_CONNECTIONS` are open per server and :data:`MAX_PER_PEER` per peer
address, with places kept for a peer that holds none and, when all are taken all the same, a
place of the peer holding the most for it (:class:`reactor.ops.admission.Door`; more are closed
at once, and counted), and a body is at most :data:`MAX_BODY_BYTES` bytes. Together they bound the
file descriptors a stranger can take, and for how long, whatever they send or leave unread, and
leave the orchestrator's probes a place while other peers hold all they may.

:func:`listening` serves one aiohttp application through a :class:`Door`: it binds on entry,
so a port that is taken fails at startup, and closes on exit. :mod:`reactor.ops.http` says what
is served.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import struct
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any

import anyio
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from reactor.errors import ConfigError
from reactor.ops.admission import BODY_SECONDS as BODY_SECONDS
from reactor.ops.admission import HEAD_SECONDS as HEAD_SECONDS
from reactor.ops.admission import MAX_CONNECTIONS as MAX_CONNECTIONS
from reactor.ops.admission import MAX_PER_PEER as MAX_PER_PEER
from reactor.ops.admission import MAX_PIPELINED as MAX_PIPELINED
from reactor.ops.admission import WRITE_STALL_SECONDS as WRITE_STALL_SECONDS
from reactor.ops.admission import Door, Requests, Tally
from reactor.telemetry.metrics import DropReason

# The servers' log lines keep one logger name, the one operators filter on.
log = logging.getLogger("reactor.http")

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
# The kernel's send buffer of an accepted connection (Linux doubles it). Left to itself it grows
# to megabytes for a peer that keeps asking and never reads, the answers parked there out of
# the process's sight; with this, what a peer leaves unread comes back to the process within
# a few answers (tens of kilobytes each), its writing pauses, and WRITE_STALL_SECONDS applies.
SEND_BUFFER_BYTES = 64 * 1024
# The largest request body: the page's forms carry a few ids and a token.
MAX_BODY_BYTES = 64 * 1024
# Repeats of a flood of one error (accept() failing, connections over the cap) are counted and
# logged at most this often.
FLOOD_LOG_SECONDS = 10.0


# -- holding connections to account ------------------------------------------------------------


class GuardedConnection(asyncio.Protocol):
    """One accepted connection: admitted by its :class:`Door`, then handed to aiohttp's
    request handler, and closed when its peer overstays a stage of a request (:class:`Requests`
    follows them), leaves what was written to it unread, or sends too many requests ahead of
    their answers.

    aiohttp has no deadline for a request head or body, nor for a peer that does not read: its
    keep-alive timer (an hour by default) runs only while no request is in hand, and a body
    that a handler reads (the page's forms) may come a byte at a time for ever. Rather than subclass
    its ``RequestHandler`` (whose constructor and internals change between releases), this
    wraps it from outside, through interfaces that are documented and stable: ``web.Server`` is
    a protocol factory for ``loop.create_server`` (aiohttp's low-level server), the wrapper
    passes on the six methods of ``asyncio.Protocol`` unchanged, and a middleware
    (:func:`answers_counted`) says when a request has been answered. Connections past the cap
    never get a handler, so they cost a descriptor for one turn of the loop and no more.
    """

    def __init__(
        self,
        door: Door[GuardedConnection],
        handler: Callable[[], asyncio.Protocol],
        open_: dict[asyncio.BaseTransport, GuardedConnection],
    ) -> None:
        self._door = door
        self._make_handler = handler
        self._open = open_
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self._requests = Requests()
        self._answered = 0
        self._deadline: asyncio.TimerHandle | None = None  # of the stage the peer is at
        self._stall: asyncio.TimerHandle | None = None  # while written bytes wait unread
        self._dropped = False  # closed for a reason of DropReason, and counted

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Admit the connection and start its head's deadline, or close it at once."""
        assert isinstance(transport, asyncio.Transport)
        peer = peer_address(transport)
        displaced = self._door.make_room(peer)
        if displaced is not None:
            displaced.close_now()
        if not self._door.admit(peer, self):
            transport.abort()
            return
        self._transport = transport
        self._open[transport] = self
        # What the peer leaves unread comes back to the process soon (a small kernel buffer),
        # and writing pauses as soon as a byte of it waits here, not only past 64 KiB: a few
        # answers that fit under that would wait unread without a pause, and hold the
        # connection's close (which waits for them) for ever.
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        transport.set_write_buffer_limits(high=0)
        self._inner = self._make_handler()
        self._start_deadline(self._door.head_seconds, "head_timeout")
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        """Follow the requests in ``data``, and pass it on."""
        if self._inner is None:
            return
        before = self._requests.stage, self._requests.heads
        self._requests.feed(data)
        if self._requests.heads - self._answered > MAX_PIPELINED:
            self._drop("pipelined")
            return
        if (self._requests.stage, self._requests.heads) != before:
            self._stage_changed()
        self._inner.data_received(data)

    def answered(self) -> None:
        """A request of this connection has been answered (or failed): one fewer waits."""
        self._answered += 1

    def eof_received(self) -> bool | None:
        """Pass it on."""
        return None if self._inner is None else self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        """Release the connection's place, and tell the handler."""
        self._cancel_deadline()
        self._resumed()
        inner, self._inner = self._inner, None
        if inner is not None:
            self._door.release(self)
            if self._transport is not None:
                self._open.pop(self._transport, None)
            inner.connection_lost(exc)

    def pause_writing(self) -> None:
        """The peer has not taken all that was written: it has WRITE_STALL_SECONDS to. Pass it
        on (aiohttp's flow control)."""
        if self._inner is not None:
            loop = asyncio.get_running_loop()
            self._stall = loop.call_later(WRITE_STALL_SECONDS, self._stalled)
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        """The peer has taken it all. Pass it on (aiohttp's flow control)."""
        self._resumed()
        if self._inner is not None:
            self._inner.resume_writing()

    def close_now(self) -> None:
        """Cut the connection at once, with what waits to be written: its place was given to
        another peer's (the door counted it)."""
        self._dropped = True
        if self._transport is not None:
            cut(self._transport)

    def _stage_changed(self) -> None:
        stage = self._requests.stage
        if stage == "head":
            self._start_deadline(self._door.head_seconds, "head_timeout")
        elif stage == "body":
            self._start_deadline(BODY_SECONDS, "body_timeout")
        elif stage == "between":
            # aiohttp's keep-alive timer closes a connection that stays idle.
            self._cancel_deadline()
        elif self._deadline is None:
            # Lost as a later head began: aiohttp refuses it and closes, or this does.
            self._start_deadline(self._door.head_seconds, "head_timeout")
        # Lost otherwise: the deadline of the head or body it was lost in still runs.

    def _start_deadline(self, seconds: float, reason: DropReason) -> None:
        self._cancel_deadline()
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(seconds, self._drop, reason)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _resumed(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _stalled(self) -> None:
        self._stall = None
        self._drop("write_stall")

    def _drop(self, reason: DropReason) -> None:
        """Close the connection for ``reason``, and count it, once. While what was written
        waits unread (writing paused) it is cut, even when aiohttp closed it already: a
        graceful close waits for the peer to take it. Otherwise it is closed, and what the
        kernel holds is still delivered."""
        self._deadline = None
        transport = self._transport
        if self._inner is None or transport is None:
            return
        stalled = self._stall is not None or reason == "write_stall"
        if not self._dropped and (stalled or not transport.is_closing()):
            self._dropped = True
            self._door.dropped(reason)
        if stalled:
            cut(transport)
        elif not transport.is_closing():
            transport.close()


def answers_counted(open_: dict[asyncio.BaseTransport, GuardedConnection]) -> Middleware:
    """A middleware that tells each request's :class:`GuardedConnection` (in ``open_``, by
    transport) once the request is answered, so that it counts the requests sent ahead of
    their answers. First of an application's middlewares, it sees every request routed."""

    @web.middleware
    async def answered(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        finally:
            guard = open_.get(request.transport) if request.transport is not None else None
            if guard is not None:
                guard.answered()

    return answered


def cut(transport: asyncio.Transport) -> None:
    """Close ``transport`` at once with a reset: what waits to be written, in the process or in
    the kernel, is dropped. A plain close would leave the kernel trying to deliver it to a peer
    that does not read, for minutes, and the peer none the wiser."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


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


# -- listening -----------------------------------------------------------------------------------


@asynccontextmanager
async def listening(
    app: web.Application,
    addr: tuple[str, int],
    *,
    variable: str,
    door: Door[Any],
    optional: bool = False,
) -> AsyncIterator[tuple[str, int] | None]:
    """Serve ``app`` on ``addr`` through ``door`` while the block runs; yields the bound
    (host, port). A port that cannot be bound raises ConfigError naming ``variable``; but
    ``optional``, one that is taken yields None, and nothing is served. Puts
    :func:`answers_counted` first among ``app``'s middlewares."""
    host, port = addr
    open_: dict[asyncio.BaseTransport, GuardedConnection] = {}
    app.middlewares.insert(0, answers_counted(open_))
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
                lambda: GuardedConnection(door, handler, open_),
                host,
                port,
                backlog=ACCEPTS_PER_TURN,
            )
        except OSError as error:
            # asyncio words it "error while attempting to bind on address ...: <reason>".
            reason = os.strerror(error.errno) if error.errno else str(error)
            if optional and error.errno == errno.EADDRINUSE:
                yield None
                return
            raise ConfigError(
                f"{variable}={show(host, port)}: cannot listen: {reason}; "
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


def show(host: str, port: int) -> str:
    """(host, port) as an address is written: an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
