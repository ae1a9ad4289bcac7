"""Accepting the connections of the reactor's HTTP servers: the I/O half of
:mod:`reactor.core.admission`.

Both servers run on the reactor's own event loop, so neither may let a client hold what the
loop needs: a connection must send its first request head within :data:`HEAD_SECONDS`, an idle
one is closed after :data:`KEEPALIVE_SECONDS`, at most :data:`MAX_CONNECTIONS` are open per
server and :data:`MAX_PER_PEER` per peer address, with places kept for a peer that holds none
(:class:`reactor.core.admission.Door`; more are closed at once, and counted), and a body is at most
:data:`MAX_BODY` bytes. Together they bound the file descriptors a stranger can take, whatever
they send, and leave the orchestrator's probes a place while one peer holds all it may.

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
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
from aiohttp import web

from reactor.core.admission import HEAD_SECONDS as HEAD_SECONDS
from reactor.core.admission import MAX_CONNECTIONS as MAX_CONNECTIONS
from reactor.core.admission import MAX_PER_PEER as MAX_PER_PEER
from reactor.core.admission import Door, HeadEnd, Tally
from reactor.errors import ConfigError

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
# The largest request body: the page's forms carry a few ids and a token.
MAX_BODY = 64 * 1024
# Repeats of a flood of one error (accept() failing, connections over the cap) are counted and
# logged at most this often.
FLOOD_LOG_SECONDS = 10.0


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


# -- listening -----------------------------------------------------------------------------------


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
