"""One replica: a reactor for each pair the process serves, on one pool, seen as one from outside.

Each pair's :class:`~reactor.service.Reactor` keeps its own listener, cadence, work queue and
hooks, so a pair whose tables break while it runs (a table dropped, a column gone) fails only
its own statements, and the others record on. A pair already broken at start is not served:
it is named in the log and in ``/readyz``, and the others start without it.

What the probes see is the verdict over every pair: alive while each is, ready while each is
and none was left out. ``/metrics`` shows each pair's metrics with a ``pair`` label; a replica
of one pair shows them as they always were.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager

import anyio
import anyio.abc

from reactor import db, logs
from reactor.clock import Clock, SystemClock
from reactor.config import Settings
from reactor.hooks import open_hooks
from reactor.install import Install
from reactor.listener import Listener
from reactor.metrics import Metrics, PairMetrics
from reactor.service import POOL_SIZE, Reactor

log = logging.getLogger(__name__)


@asynccontextmanager
async def open_reactor(
    settings: Settings,
    install: Install,
    *,
    metrics: Metrics | None = None,
    clock: Clock | None = None,
    listen_dsn: str | None = None,
    instrument: Callable[[db.Database], db.Database] | None = None,
) -> AsyncIterator[Reactor]:
    """One replica of one pair, wired: its pool, its hooks (parsed before anything connects, so
    a bad REACTOR_HOOKS fails at once) and its queries, bound to ``install``. Not running yet:
    run it with :meth:`Reactor.run`, or for a block with :meth:`Reactor.running`. The pool opens
    on entry and closes on exit, once the replica has stopped.

    ``instrument`` wraps the replica's queries (a benchmark counting its statements).
    """
    async with open_reactors(
        settings,
        [(settings, install)],
        metrics=Metrics if metrics is None else lambda: metrics,
        clock=clock,
        listen_dsn=listen_dsn,
        instrument=instrument,
    ) as (reactor,):
        yield reactor


@asynccontextmanager
async def open_reactors(
    settings: Settings,
    served: Sequence[tuple[Settings, Install]],
    *,
    metrics: Callable[[], Metrics] = Metrics,
    clock: Clock | None = None,
    listen_dsn: str | None = None,
    instrument: Callable[[db.Database], db.Database] | None = None,
) -> AsyncIterator[list[Reactor]]:
    """A reactor for each (pair's settings, install) of ``served``, all on one pool of
    ``settings``' database, each with its own hooks and metrics (see :func:`open_reactor`).

    Several pairs share one LISTEN session too, and one health check on it: it runs from entry
    until every reactor has stopped (or the block ends), so a replica costs the database about
    what one pair does.
    """
    # Each pair may hold what a replica of its own would, and no more: one whose statements
    # hang leaves the others theirs.
    pool = db.make_pool(settings.require_database(), max_size=POOL_SIZE * len(served))
    several = len(served) > 1
    shared: Listener | None = None
    if several and settings.mode == "listen":
        shared = Listener(
            settings,
            clock=clock or SystemClock(),
            dsn=listen_dsn or settings.listen_database_url or settings.require_database(),
        )
    async with contextlib.AsyncExitStack() as stack:
        hooks_of = [await stack.enter_async_context(open_hooks(own, pool)) for own, _ in served]
        await stack.enter_async_context(pool)
        reactors = []
        for (own, install), hooks in zip(served, hooks_of, strict=True):
            database = db.Database.pooled(
                install,
                pool,
                grace=own.grace,
                hooks=list(hooks),
                share=anyio.CapacityLimiter(POOL_SIZE) if several else None,
            )
            if instrument is not None:
                database = instrument(database)
            reactors.append(
                Reactor(
                    own,
                    database,
                    metrics=metrics(),
                    clock=clock,
                    listen_dsn=listen_dsn,
                    hooks=hooks,
                    listener=shared,
                )
            )
        if shared is not None:
            listening = await stack.enter_async_context(anyio.create_task_group())
            listening.start_soon(shared.run)
            stack.callback(listening.cancel_scope.cancel)
        yield reactors


class Replica:
    """The reactors of one process, by pair name; ``broken``: the pairs left out at start, and
    why."""

    def __init__(self, reactors: Mapping[str, Reactor], broken: Mapping[str, str]) -> None:
        self.reactors = dict(reactors)
        self.broken = dict(broken)
        self.metrics: Metrics | PairMetrics = (
            next(iter(self.reactors.values())).metrics
            if len(self.reactors) == 1 and not self.broken
            else PairMetrics({name: reactor.metrics for name, reactor in self.reactors.items()})
        )

    @property
    def _named(self) -> bool:
        # Whether log lines name their pair: not in a process of one pair, where it is noise.
        return len(self.reactors) > 1 or bool(self.broken)

    @property
    def only(self) -> Reactor | None:
        """The reactor, when this replica serves one pair (what the operator's page shows)."""
        if len(self.reactors) == 1 and not self.broken:
            return next(iter(self.reactors.values()))
        return None

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called."""
        return any(reactor.stopping for reactor in self.reactors.values())

    def stop(self) -> None:
        """Stop every pair's intake now and let each drain (see :meth:`Reactor.stop`)."""
        for name, reactor in self.reactors.items():
            # In the pair's name: its line, and the task that tells the others it left.
            token = logs.PAIR.set(name if self._named else None)
            try:
                reactor.stop()
            finally:
                logs.PAIR.reset(token)

    def health(self) -> tuple[bool, bool, str]:
        """(alive, ready, reason) over every pair: the first pair that is not, by name."""
        if self.only is not None:
            return self.only.health()
        alive, ready, reason = True, not self.broken, "ok"
        for name, why in self.broken.items():
            reason = f"pair {name}: not served: {why}"
            break
        for name, reactor in self.reactors.items():
            pair_alive, pair_ready, pair_reason = reactor.health()
            if not pair_alive and alive:
                alive = False
                reason = f"pair {name}: {pair_reason}"
            elif not pair_ready and ready:
                ready = False
                reason = f"pair {name}: {pair_reason}"
        return alive, ready and alive, reason

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run every pair until :meth:`stop`; ``task_status`` fires once each pair's listener's
        first attempt is over (see :meth:`Reactor.run`)."""
        async with anyio.create_task_group() as tg:
            for name, reactor in self.reactors.items():
                await tg.start(self._run_pair, name if self._named else None, reactor)
            task_status.started()

    @staticmethod
    async def _run_pair(
        name: str | None,
        reactor: Reactor,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        # The task's own context: every line its reactor logs, from any task it starts, names
        # the pair.
        logs.PAIR.set(name)
        await reactor.run(task_status=task_status)
