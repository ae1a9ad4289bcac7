"""What every in-process fault scenario does around its fault: play the app, start the
replicas, drive the load, wait out the last grace, judge, report, and hold the verdict.

A scenario gets a :class:`Scenario` from the ``scenario`` fixture and writes only its fault.
Every replica it starts runs in this process against one DSN (the server's, or the fault
proxy's), and the scenario's checks speak of every replica, so the same scenario holds for one
replica or several. How many is :data:`REPLICAS`: the fixture runs each scenario once per entry.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import pytest

from reactor.listen.listener import Listener
from reactor.runtime.service import Reactor
from tests.faults.support import Judgement, Workload, settle
from tests.faults.tables import Tables

if TYPE_CHECKING:  # the fixtures module makes Scenarios, so it imports this one
    from tests.faults.conftest import Report, StartReactor

# Replicas per scenario, from REACTOR_FAULT_REPLICAS (default 1): "1,3,5" runs every scenario
# three times. A scenario that needs more (two replicas racing for one claim) asks for them
# with ``at_least``.
REPLICAS: Sequence[int] = tuple(
    int(n) for n in os.environ.get("REACTOR_FAULT_REPLICAS", "1").split(",") if n.strip()
)

GRACE = 1.0
RATE = 20.0  # jobs finished per second while the app is driven


def short_and_long(
    names: tuple[str, ...], short: tuple[object, ...], long: tuple[object, ...]
) -> pytest.MarkDecorator:
    """Runs a scenario with the ``short`` values in every run and with the ``long`` ones only
    under ``--long`` (ids ``short`` and ``long``), so a quick run still plays every fault."""
    return pytest.mark.parametrize(
        names,
        [pytest.param(*short, id="short"), pytest.param(*long, marks=pytest.mark.slow, id="long")],
    )


def settled(dsn: str, tables: Tables, *, within: float = 30.0) -> tuple[Judgement, float]:
    """:func:`settle` at GRACE on ``tables``' mapping, from a test that runs no event loop of its
    own (its replicas are processes)."""
    return anyio.run(
        lambda: settle(dsn, GRACE, within=within, mapping=tables.mapping), backend="asyncio"
    )


@dataclass(frozen=True)
class Fleet:
    """The replicas of one scenario, all started and running."""

    reactors: list[Reactor]

    @property
    def listeners(self) -> list[Listener]:
        """Every replica's listener (each runs in LISTEN mode)."""
        found = [r.listener for r in self.reactors]
        assert all(found), "a replica without a listener"
        return [listener for listener in found if listener is not None]

    def all_listeners(self, check: Callable[[Listener], bool]) -> bool:
        """``check`` holds for every replica's listener."""
        return all(check(listener) for listener in self.listeners)

    def connections(self) -> list[int]:
        """How many LISTEN connections each replica has made so far."""
        return [listener.connections for listener in self.listeners]

    def reconnected_since(self, before: list[int]) -> bool:
        """Every replica made a LISTEN connection since ``before`` (from :meth:`connections`)."""
        return all(now > then for now, then in zip(self.connections(), before, strict=True))

    def total(self, count: Callable[[Reactor], float]) -> float:
        """``count`` summed over the replicas."""
        return sum(count(reactor) for reactor in self.reactors)


@dataclass(frozen=True)
class Scenario:
    """One scenario's app, replicas and verdict against the test database of ``tables``."""

    database_url: str
    tables: Tables
    reactor_at: StartReactor
    workload: Callable[..., Workload]
    report: Report
    replicas: int
    grace: float = GRACE
    # With a companion pair: its app beside each app of the scenario's, by the latter's id.
    companions: dict[int, Workload] = field(default_factory=dict)
    # The companion pair's judgements since the last row of the report.
    companions_judged: list[Judgement] = field(default_factory=list)

    def app(self, seed: int, **options: float) -> Workload:
        """The worker and the tabs, with this scenario's grace; with a companion pair, its own
        app too, driven alongside (see :meth:`drive`)."""
        app = self.workload(grace=self.grace, seed=seed, **options)
        if self.tables.companion is not None:
            companion = Workload(
                self.database_url, self.tables.companion, grace=self.grace, seed=seed + 1
            )
            self.companions[id(app)] = companion
        return app

    @contextlib.asynccontextmanager
    async def fleet(
        self, dsn: str | None = None, *, at_least: int = 1, **settings: object
    ) -> AsyncIterator[Fleet]:
        """Start the replicas at ``dsn`` (default: the test database); stop them on the way out.

        Keyword arguments are Settings fields, as for ``reactor_at``; the grace is the
        scenario's unless given.
        """
        settings.setdefault("grace", self.grace)
        async with contextlib.AsyncExitStack() as stack:
            started = [
                await stack.enter_async_context(
                    self.reactor_at(dsn or self.database_url, **settings)
                )
                for _ in range(max(self.replicas, at_least))
            ]
            yield Fleet(started)

    async def drive(self, app: Workload, seconds: float, rate: float = RATE) -> None:
        """The app finishes jobs at ``rate`` for ``seconds``, its tabs saving as they go (and
        the companion pair's app beside it, at the same rate)."""
        companion = self.companions.get(id(app))

        async def drive(which: Workload) -> None:
            await anyio.to_thread.run_sync(which.drive, seconds, rate)

        async with anyio.create_task_group() as tg:
            if companion is not None:
                tg.start_soon(drive, companion)
            await drive(app)

    async def finish(self, app: Workload, count: int) -> None:
        """``count`` jobs finish at once (and as many of the companion pair's)."""
        companion = self.companions.get(id(app))
        if companion is not None:
            await anyio.to_thread.run_sync(companion.finish, count)
        await anyio.to_thread.run_sync(app.finish, count)

    async def verdict(
        self,
        app: Workload,
        *,
        within: float = 30.0,
        until: Callable[[Judgement], bool] = lambda j: j.clean,
    ) -> tuple[Judgement, float]:
        """Let the tabs' last saves and the last grace pass, then ``settle``. A companion
        pair is judged on its own tables, and must be clean whatever the scenario expects of
        its own: its faults were the scenario's, and nothing else."""
        await anyio.to_thread.run_sync(app.quiesce)
        judged = await settle(
            self.database_url,
            self.grace,
            within=within,
            mapping=self.tables.mapping,
            until=until,
        )
        companion = self.companions.get(id(app))
        if companion is not None and self.tables.companion is not None:
            await anyio.to_thread.run_sync(companion.quiesce)
            theirs, _ = await settle(
                self.database_url, self.grace, within=within, mapping=self.tables.companion.mapping
            )
            assert theirs.clean, f"the companion pair: {theirs}"
            self.companions_judged.append(theirs)
            companion.close()
        return judged

    def conclude(
        self,
        name: str,
        cycles: int,
        judgement: Judgement,
        *,
        recovery: float | None,
        note: str,
    ) -> None:
        """Add the row to the session's table (its name says how many replicas, when not one),
        then hold the verdict: nothing lost, doubled, clobbered, early, wrong or stale."""
        if self.companions_judged:
            jobs = sum(judged.verdict.jobs for judged in self.companions_judged)
            note += f"; companion pair clean, {jobs} jobs"
            self.companions_judged.clear()
        self.report(
            name if self.replicas == 1 else f"{name} ({self.replicas} replicas)",
            cycles,
            judgement,
            recovery=recovery,
            note=note,
        )
        assert judgement.clean, str(judgement)
