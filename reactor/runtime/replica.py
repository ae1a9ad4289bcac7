"""One replica: the process that serves its pairs, seen as one from outside.

The :class:`Replica` is the process's one supervisor. It owns what every pair shares: the
replica's identity (one id, in every pair's heartbeats, claims and hook leases), each pair's
view of who is live (its :class:`~reactor.core.ownership.Roster`, from that pair's heartbeats), the
pool, the LISTEN session (one for every pair), the pairs' health check (one statement per
interval for all of them, :mod:`reactor.insurance.health`, so that a replica costs the database
about what one pair does) and the one task group everything runs in. Each
pair is built from one value, a :class:`~reactor.settings.pairs.Pair`, and runs under it as a
:class:`~reactor.runtime.service.Reactor`; the replica starts them, and stops and drains them
together.

Each pair keeps its own cadence, work queue and hooks, so a pair whose tables break while it
runs (a table dropped, a column gone) fails only its own statements, and the others record on.
A pair already broken at start is not served: it is named in the log and in ``/readyz``, and
the others start without it.

What the probes see is the verdict over every pair: alive while each is, ready while each is
and none was left out. ``/metrics`` shows each pair's metrics with a ``pair`` label; a replica
of one pair shows them as they always were.

``reactor run``, ``reactor demo`` and the tests all start one the same way::

    async with open_replica(settings, pairs) as replica, replica.running():
        ...
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager

import anyio
import anyio.abc

from reactor import db
from reactor.core.clock import Clock, SystemClock
from reactor.core.ownership import Roster
from reactor.hooks import Hook, open_hooks
from reactor.insurance.health import PairsHealth
from reactor.listen.listener import Listener
from reactor.runtime.service import POOL_SIZE, Reactor
from reactor.settings.config import ProcessSettings
from reactor.settings.pairs import Pair
from reactor.telemetry import logs
from reactor.telemetry.metrics import Metrics, PairMetrics

log = logging.getLogger(__name__)


@asynccontextmanager
async def open_replica(
    settings: ProcessSettings,
    served: Sequence[Pair],
    *,
    broken: Mapping[str, str] | None = None,
    metrics: Callable[[], Metrics] = Metrics,
    clock: Clock | None = None,
    listen_dsn: str | None = None,
    instrument: Callable[[db.Database], db.Database] | None = None,
) -> AsyncIterator[Replica]:
    """A replica of ``served``, wired on one pool of ``settings``' database: each pair with its
    own hooks (parsed before anything connects, so a bad REACTOR_HOOKS fails at once), metrics
    and queries, bound to its install. Not running yet: run it with :meth:`Replica.run`, or for
    a block with :meth:`Replica.running`. The pool opens on entry and closes on exit, once the
    replica has stopped.

    ``broken``: the pairs left out at start, by name, and why. ``listen_dsn``: where the LISTEN
    session connects, when not where the settings say. ``instrument`` wraps each pair's queries
    (a benchmark counting its statements).
    """
    replica = Replica(settings, broken=broken, clock=clock, listen_dsn=listen_dsn)
    # Each pair may hold what a replica of its own would, and no more: one whose statements
    # hang leaves the others theirs.
    pool = db.make_pool(settings.require_database(), max_size=POOL_SIZE * len(served))
    several = len(served) > 1
    async with contextlib.AsyncExitStack() as stack:
        hooks_of = [await stack.enter_async_context(open_hooks(p.settings, pool)) for p in served]
        await stack.enter_async_context(pool)
        for pair, hooks in zip(served, hooks_of, strict=True):
            database = db.Database.pooled(
                pair.install,
                pool,
                settings=pair.settings,
                hooks=list(hooks),
                share=anyio.CapacityLimiter(POOL_SIZE) if several else None,
            )
            if instrument is not None:
                database = instrument(database)
            replica.add(pair, database, metrics=metrics(), hooks=hooks)
        yield replica


class Replica:
    """The pairs one process serves, under one identity, one LISTEN session and one task
    group; ``reactors``: each pair's, by name; ``broken``: the pairs left out at start, and
    why."""

    def __init__(
        self,
        settings: ProcessSettings,
        *,
        broken: Mapping[str, str] | None = None,
        clock: Clock | None = None,
        listen_dsn: str | None = None,
    ) -> None:
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        # Unique to the process: a replica that said it left is never live again by this id.
        self.replica_id = f"reactor-{uuid.uuid4().hex[:12]}"
        self.reactors: dict[str, Reactor] = {}
        self.broken = dict(broken or {})
        self.listener: Listener | None = None
        if settings.mode == "listen":
            self.listener = Listener(
                settings,
                clock=self.clock,
                dsn=listen_dsn or settings.listen_database_url or settings.require_database(),
            )
        self._metrics: Metrics | PairMetrics | None = None
        # The pairs' health checks, run as one while the replica serves two or more.
        self.checks: PairsHealth | None = None

    def add(
        self,
        pair: Pair,
        database: db.Database,
        *,
        metrics: Metrics | None = None,
        hooks: Mapping[str, Hook] | None = None,
    ) -> Reactor:
        """Serve ``pair`` on ``database`` (bound to its install) from the next :meth:`run`."""
        reactor = Reactor(
            pair.settings,
            database,
            roster=Roster(self.replica_id),
            metrics=metrics,
            clock=self.clock,
            hooks=hooks,
            listener=self.listener,
        )
        self.reactors[pair.name] = reactor
        return reactor

    @property
    def metrics(self) -> Metrics | PairMetrics:
        """What /metrics shows: the only pair's metrics as they are, else each with its name."""
        if self._metrics is None:
            only = self.only
            self._metrics = (
                only.metrics
                if only is not None
                else PairMetrics({name: r.metrics for name, r in self.reactors.items()})
            )
        return self._metrics

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
        """Stop every pair's intake now and let each drain (see :meth:`Reactor.stop`); the
        LISTEN session ends once the last pair has left it."""
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
        """Run the LISTEN session and every pair until :meth:`stop` and each pair's drain;
        ``task_status`` fires once the session's first attempt is over, up or not (polling:
        at once). The work does not wait for it."""
        for name, reactor in self.reactors.items():
            # What the LISTEN session logs on a pair's behalf names it, as its own lines do.
            reactor.subscriber.name = name if self._named else None
        async with anyio.create_task_group() as tg:
            if self.listener is not None:
                # Until every pair has left it (see Listener.unsubscribe).
                tg.start_soon(self.listener.run)
            if len(self.reactors) > 1:
                # One health check for every pair, rather than one each (see
                # reactor.insurance.health): theirs are held before they start.
                self.checks = PairsHealth(
                    [(n if self._named else None, r) for n, r in self.reactors.items()],
                    self.clock,
                    self.listener,
                )
                tg.start_soon(self.checks.run)
            for name, reactor in self.reactors.items():
                await tg.start(self._run_pair, name if self._named else None, reactor)
            task_status.started()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Replica]:
        """Run this replica while the block runs (the LISTEN session's first attempt is over
        on entry); on the way out stop it and wait out its drain."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.run)
            try:
                yield self
            finally:
                self.stop()

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
