"""The health check: a pair's own duty, and the health check of all the replica's pairs in one
statement.

A replica of one pair checks it as the pair's own duty (:class:`PairCheck`, begun by the pair's
:class:`~reactor.insurance.cadence.Scheduler`). A replica of two or more checks them together
(:class:`PairsHealth`): one statement per interval through the pool
(:func:`reactor.db.health_of_pairs`), not one per pair, so that the replica's checks cost the
database what one pair's do.

Each pair keeps its health duty's schedule in its own cadence: its interval and pace (longer
while its checks find nothing to change), its failures and their retries, what hastens it, and
when it last began (what ``/healthz`` reads). The replica begins the duties together: once one
pair's comes due, the others' are brought forward to it, so the one statement runs at the
shortest interval any pair asks for. Each part's :class:`~reactor.db.Health` goes back to its
pair, which judges it as its own check (:meth:`CheckedPair.saw`); a failure is each pair's
(its ``vitals.failed``). The LISTEN session's probe rides on one part, the first.

A pair whose part fails on its own objects (its schema dropped, a grant revoked, its tables
locked past a bound shorter than the check's) costs the others nothing: the combined statement
fails, and that round every part runs alone. A pair whose part failed alone keeps running alone
until it answers again, so the others stay one statement meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import anyio

from reactor import db
from reactor.core.clock import Clock
from reactor.insurance.cadence import Every, Scheduler
from reactor.listen.listener import Listener
from reactor.settings.config import Settings
from reactor.telemetry import logs

log = logging.getLogger(__name__)

HEALTH = "health"

# The share of the check's bound its combined statement waits (one pair's tables locked cancel it
# soon enough that each part alone still has time that round), and a part alone waits for a lock.
LOCK_SHARE = 0.5

# What a part came back with: the pair's health, or what its statement failed with.
Outcome = db.Health | BaseException


def every(settings: Settings) -> Every:
    """The health check's cadence, through the pool (the LISTEN session only listens): a failed
    check is tried again at once (a connection of the pool may have died), then every
    interval."""
    interval = settings.probe_interval
    return Every(HEALTH, interval, retry=lambda failures: 0.0 if failures == 1 else interval)


class CheckedPair(Protocol):
    """A pair as its health check sees it (:class:`reactor.runtime.service.Reactor`): what the
    check asks of its tables, and who judges what it read."""

    @property
    def settings(self) -> Settings:
        """The pair's settings (the check's bound: ``probe_timeout``)."""
        ...

    @property
    def database(self) -> db.Database:
        """The pair's queries."""
        ...

    @property
    def schedule(self) -> Scheduler:
        """The pair's schedule, which holds the health duty's."""
        ...

    @property
    def stopping(self) -> bool:
        """True once the pair stops."""
        ...

    def health_ask(self, probe: str | None) -> dict[str, Any]:
        """The parameters of the pair's check now, carrying ``probe``."""
        ...

    def saw(self, health: db.Health, sent: float) -> None:
        """What the pair's check read, sent at ``sent``."""
        ...

    async def leave(self) -> None:
        """Drop the pair's heartbeat."""
        ...


class PairCheck:
    """One pair's health check through the pool, as its own duty, carrying the probes of
    ``listener``."""

    def __init__(self, pair: CheckedPair, listener: Listener | None, clock: Clock) -> None:
        self.pair = pair
        self.listener = listener
        self.clock = clock

    async def run(self) -> None:
        """Check the pair once; raises when the database failed the check."""
        pair, listener = self.pair, self.listener
        probe = None if listener is None else listener.probe_for_check()
        sent = self.clock.now()
        try:
            with anyio.fail_after(pair.settings.probe_timeout):
                (health,) = await db.health_of_pairs([(pair.database, pair.health_ask(probe))])
        except BaseException:
            _probe_sent(listener, probe, went=False)
            raise
        # At a half-full NOTIFY queue the check skips it: then it is not waited for.
        _probe_sent(listener, probe, went=health.probes_sent > 0)
        pair.saw(health, sent)


def _probe_sent(listener: Listener | None, probe: str | None, *, went: bool) -> None:
    if listener is not None and probe is not None:
        listener.probe_sent(probe, went=went)


class PairsHealth:
    """The health duty of every pair of a replica, run as one: ``pairs`` by the name their log
    lines carry (None: unnamed), on ``clock``, carrying the probes of ``listener``."""

    def __init__(
        self,
        pairs: Sequence[tuple[str | None, CheckedPair]],
        clock: Clock,
        listener: Listener | None,
    ) -> None:
        self.pairs = list(pairs)
        self.clock = clock
        self.listener = listener
        # The pairs whose part failed on its own at the last check: they run alone until it
        # answers again.
        self.apart: set[CheckedPair] = set()
        self.rounds = 0
        self._wake = anyio.Event()
        for _, pair in self.pairs:
            pair.schedule.hold(HEALTH, self._wake_up)

    def _wake_up(self) -> None:
        self._wake.set()

    def _serving(self) -> list[tuple[str | None, CheckedPair]]:
        return [(name, pair) for name, pair in self.pairs if not pair.schedule.closed]

    async def run(self) -> None:
        """Check the pairs whenever one's check is due, until every pair has stopped."""
        while serving := self._serving():
            now = self.clock.now()
            duties = [pair.schedule.cadence.duties[HEALTH] for _, pair in serving]
            if any(not duty.running and duty.next_at <= now for duty in duties):
                due = [(name, r) for name, r in serving if self._begin(r, now)]
                await self._round(due)
                continue
            self._wake = anyio.Event()
            next_at = min((d.next_at for d in duties if not d.running), default=math.inf)
            await self.clock.sleep_until(next_at, self._wake)

    @staticmethod
    def _begin(pair: CheckedPair, now: float) -> bool:
        # Brought forward to the round, as a hasten would: its next run is one interval on.
        pair.schedule.cadence.hasten(HEALTH, now)
        return pair.schedule.cadence.begin(HEALTH, now)

    async def _round(self, due: list[tuple[str | None, CheckedPair]]) -> None:
        sent = self.clock.now()
        self.rounds += 1
        outcomes: dict[CheckedPair, Outcome] = {}
        try:
            await self._check(due, outcomes)
        except BaseException:
            # Cancelled, or a bug: each duty is retried by its policy, and nobody is told.
            for name, pair in due:
                with _on_behalf(name):
                    pair.schedule.end(HEALTH, ok=False)
            raise
        for name, pair in due:
            with _on_behalf(name):
                outcome = outcomes[pair]
                if isinstance(outcome, BaseException):
                    pair.schedule.end(HEALTH, error=outcome)
                    continue
                pair.saw(outcome, sent)
                pair.schedule.end(HEALTH)
        for _, pair in due:
            if pair.stopping and isinstance(outcomes[pair], db.Health):
                # Its heartbeat was written back, perhaps after its pair left for good.
                await pair.leave()

    async def _check(
        self, due: list[tuple[str | None, CheckedPair]], out: dict[CheckedPair, Outcome]
    ) -> None:
        together = [pair for _, pair in due if pair not in self.apart]
        alone = [pair for _, pair in due if pair in self.apart]
        listener = self.listener
        probe = None if listener is None else listener.probe_for_check()
        # The probe rides on the first part that runs.
        first = (together or alone)[0] if together or alone else None
        asks = {r: r.health_ask(probe if r is first else None) for r in together + alone}
        try:
            async with anyio.create_task_group() as tg:
                for pair in alone:
                    tg.start_soon(self._alone, pair, asks[pair], out, pair.settings.probe_timeout)
                if together:
                    await self._together(together, asks, out)
        except BaseException:
            _probe_sent(listener, probe, went=False)
            raise
        # At a half-full NOTIFY queue the check skips it: then it is not waited for.
        health = out.get(first) if first is not None else None
        _probe_sent(listener, probe, went=isinstance(health, db.Health) and health.probes_sent > 0)

    async def _together(
        self,
        pairs: list[CheckedPair],
        asks: dict[CheckedPair, dict[str, Any]],
        out: dict[CheckedPair, Outcome],
    ) -> None:
        bound = max(pair.settings.probe_timeout for pair in pairs)
        several = len(pairs) > 1
        start = self.clock.now()
        try:
            # One statement as it is, not pinned with a lock_timeout of its own (that is a
            # transaction of four statements per check): where one pair's locked objects make
            # it wait, the client's share of the bound cancels it in time for each part alone.
            with anyio.fail_after(bound * LOCK_SHARE if several else bound):
                healths = await db.health_of_pairs([(pair.database, asks[pair]) for pair in pairs])
        except db.DATABASE_ERRORS as error:
            if not several or not (isinstance(error, TimeoutError) or db.statement_refused(error)):
                out.update(dict.fromkeys(pairs, error))
                return
            log.debug(
                "the pairs' health check failed; each checks alone",
                extra={"error": db.first_line(error)},
            )
            within = max(bound - (self.clock.now() - start), 0.0)
            async with anyio.create_task_group() as tg:
                for pair in pairs:
                    tg.start_soon(self._alone, pair, asks[pair], out, within)
            return
        out.update(zip(pairs, healths, strict=True))

    async def _alone(
        self,
        pair: CheckedPair,
        ask: dict[str, Any],
        out: dict[CheckedPair, Outcome],
        within: float,
    ) -> None:
        try:
            with anyio.fail_after(within):
                # Refused for a lock before the bound runs out, the part is checked alone from
                # then on and the others together; pinned, but only while it is apart.
                (out[pair],) = await db.health_of_pairs(
                    [(pair.database, ask)], lock_timeout=within * LOCK_SHARE
                )
            self.apart.discard(pair)
        except db.DATABASE_ERRORS as error:
            out[pair] = error
            if db.statement_refused(error):
                self.apart.add(pair)


@contextlib.contextmanager
def _on_behalf(name: str | None) -> Iterator[None]:
    # What is done here is the pair's: its lines name it (see reactor.telemetry.logs).
    token = logs.PAIR.set(name)
    try:
        yield
    finally:
        logs.PAIR.reset(token)
