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

import logging
from collections.abc import Mapping

import anyio
import anyio.abc

from reactor import logs
from reactor.metrics import Metrics, PairMetrics
from reactor.service import Reactor

log = logging.getLogger(__name__)


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
