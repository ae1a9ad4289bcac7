"""A TCP proxy with faults, between the reactor and PostgreSQL.

It runs its own asyncio loop in a daemon thread, so it keeps moving bytes while a test blocks,
and every control method is safe to call from any thread. Faults:

- ``partition()``: links stop moving bytes but stay open (TCP stays healthy: the kernel ACKs,
  nothing is ever delivered). Bytes sent meanwhile are held, not dropped, and flow on ``heal()``,
  like a network that comes back. ``partition(new=False)`` freezes only the links open now: new
  connections work, old ones never heal (until ``reset_frozen()``).
- ``latency``: every chunk is delivered that many seconds late, in each direction.
- ``reset_all()`` and ``reset_on(marker)``: abort links with a TCP RST (SO_LINGER 0), at once or
  right after a client chunk containing ``marker`` was forwarded to the server (whose reply is
  then swallowed, so the client never learns whether the statement ran).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

_CHUNK = 65536


@dataclass
class _Rule:
    marker: bytes
    remaining: int
    delay: tuple[float, float]
    fired: int = 0


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    flowing: asyncio.Event = field(default_factory=asyncio.Event)
    upstream: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: bool = False
    # Set by a reset_on rule: the server's replies are swallowed until the RST.
    doomed: bool = False


class FaultProxy:
    """127.0.0.1:``port`` forwards to ``upstream``; see the module docstring for faults."""

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        seed: int = 0,
        on_partition: Callable[[], None] = lambda: None,
        on_heal: Callable[[], None] = lambda: None,
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        # Told when a partition begins and when it heals (the verdict's fault windows).
        self.on_partition = on_partition
        self.on_heal = on_heal
        self.port = 0
        self.latency = 0.0
        self.accepted = 0
        self.resets = 0
        self._rng = random.Random(seed)
        self._links: set[_Link] = set()
        self._frozen_new = False
        self._rules: list[_Rule] = []
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="proxy")

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Listen on a free port; returns self."""
        self._thread.start()
        self._server = self._call(self._listen())
        return self

    def close(self) -> None:
        """Abort every link and stop the loop."""
        if not self._thread.is_alive():
            return
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    # -- faults ------------------------------------------------------------------------------

    def partition(self, *, new: bool = True) -> None:
        """Freeze every open link; with ``new``, links opened from now on too."""
        self.on_partition()
        self._run(lambda: self._set_flowing(False, frozen_new=new))

    def heal(self) -> None:
        """Let every link, old and new, move its held bytes and carry on."""
        self.on_heal()
        self._run(lambda: self._set_flowing(True, frozen_new=False))

    def _set_flowing(self, flowing: bool, *, frozen_new: bool) -> None:
        """In the proxy's loop: every open link moves its bytes or holds them, and links
        opened from now on start frozen or not."""
        self._frozen_new = frozen_new
        for link in self._links:
            if flowing:
                link.flowing.set()
            else:
                link.flowing.clear()

    def reset_all(self) -> None:
        """Abort every open link with an RST."""

        def apply() -> None:
            for link in list(self._links):
                self._reset(link)

        self._run(apply)

    def reset_frozen(self) -> None:
        """Abort the links that are frozen (those a never-healing partition left behind)."""

        def apply() -> None:
            for link in list(self._links):
                if not link.flowing.is_set():
                    self._reset(link)

        self._run(apply)

    def reset_on(self, marker: bytes, *, times: int, delay: tuple[float, float] = (0, 0)) -> None:
        """The next ``times`` client chunks holding ``marker``: forward, wait ``delay``, RST."""
        self._run(lambda: self._rules.append(_Rule(marker, times, delay)))

    def resets_fired(self) -> int:
        """How many ``reset_on`` triggers have fired so far."""
        return self._call(self._count_fired())

    def open_links(self) -> int:
        """Links currently open."""
        return self._call(self._count_links())

    # -- internals ---------------------------------------------------------------------------

    async def _count_fired(self) -> int:
        return sum(rule.fired for rule in self._rules)

    async def _count_links(self) -> int:
        return len(self._links)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def _run(self, fn: Callable[[], object]) -> None:
        async def wrapped() -> None:
            fn()

        self._call(wrapped())

    async def _listen(self) -> asyncio.Server:
        server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for link in self._links for t in link.tasks]
        for link in list(self._links):
            self._reset(link)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(writer)
        self.accepted += 1
        if not self._frozen_new:
            link.flowing.set()
        self._links.add(link)
        try:
            # A frozen new link accepts the client but does not even reach the server yet.
            await link.flowing.wait()
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except (OSError, asyncio.CancelledError):
            self._reset(link)
            return
        link.upstream = up_writer
        if link.closed:
            self._reset(link)
            return
        link.tasks = [
            asyncio.create_task(self._pump(link, reader, up_writer, inspect=True)),
            asyncio.create_task(self._pump(link, up_reader, writer, inspect=False)),
        ]

    async def _pump(
        self,
        link: _Link,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        inspect: bool,
    ) -> None:
        # Reading goes on while frozen (the peer's TCP stays happy); writing waits. Chunks are
        # delivered in order, each no earlier than its arrival plus the latency.
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.create_task(self._send(link, queue, writer, downstream=not inspect))
        try:
            while True:
                data = await reader.read(_CHUNK)
                queue.put_nowait((time.monotonic() + self.latency, data))
                if not data:
                    break
                if inspect:
                    self._check_rules(link, data)
            await sender
        except (OSError, asyncio.CancelledError):
            sender.cancel()
            self._reset(link)

    async def _send(
        self,
        link: _Link,
        queue: asyncio.Queue[tuple[float, bytes]],
        writer: asyncio.StreamWriter,
        *,
        downstream: bool,
    ) -> None:
        try:
            while True:
                at, data = await queue.get()
                wait = at - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await link.flowing.wait()
                if link.closed:
                    return
                if downstream and link.doomed:
                    continue  # the reply never reaches the client
                if not data:
                    self._close_link(link)
                    return
                writer.write(data)
                await writer.drain()
        except (OSError, ConnectionError):
            self._reset(link)

    def _check_rules(self, link: _Link, data: bytes) -> None:
        for rule in self._rules:
            if rule.remaining > 0 and rule.marker in data:
                rule.remaining -= 1
                rule.fired += 1
                delay = self._rng.uniform(*rule.delay)
                # The chunk is forwarded (it is queued already), the reply is swallowed, and
                # the link dies after the delay: the statement ran or not, the client can't tell.
                link.doomed = True
                self._loop.call_later(self.latency + delay, self._reset, link)
                return

    def _close_link(self, link: _Link) -> None:
        # One side said goodbye: close both sides politely.
        if link.closed:
            return
        link.closed = True
        self._links.discard(link)
        for writer in (link.client, link.upstream):
            if writer is not None:
                with contextlib.suppress(Exception):
                    writer.close()

    def _reset(self, link: _Link) -> None:
        was_open = not link.closed
        link.closed = True
        self._links.discard(link)
        link.flowing.set()  # wake waiters so they notice the link is gone
        for writer in (link.client, link.upstream):
            if writer is None or writer.transport.is_closing():
                continue
            sock: socket.socket | None = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        if was_open:
            self.resets += 1
        for task in link.tasks:
            if task is not asyncio.current_task():
                task.cancel()
