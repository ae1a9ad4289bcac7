"""The health check and the poll: a pair's own duties, and the health check of all the
replica's pairs in one statement.

A pair polls its queue on its own (:class:`PairPoll`) while notifications cannot be relied on,
and sleeps otherwise.

A replica of one pair checks it as the pair's own duty (:func:`check_pair`, begun by the pair's
:class:`~reactor.insurance.cadence.Scheduler`). A replica of two or more checks them together
(:class:`PairsHealth`): one statement per interval through the pool
(:func:`reactor.db.health_of_pairs`), not one per pair, so that the replica's checks cost the
database what one pair's do.

Each pair keeps its health duty's schedule in its own cadence: its interval and pace (longer
while its checks find nothing to change), its failures and their retries, what hastens it, and
when it last began (what ``/healthz`` reads). The replica begins the duties together: once one
pair's comes due, the others' are brought forward to it, so the one statement runs at the
shortest interval any pair asks for. Each pair's :class:`~reactor.db.Health` goes to its
reactor, which judges it as it judges its own check (:meth:`Reactor.saw`); a failure is each
pair's (its ``vitals.failed``). The LISTEN session's probe rides on one part, the first.

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
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio

from reactor import db
from reactor.claim.sources import POLL
from reactor.core.clock import Clock
from reactor.core.ownership import ALL_SHARES
from reactor.insurance.cadence import fleet_poll_interval
from reactor.listen.listener import Listener
from reactor.telemetry import logs

if TYPE_CHECKING:
    from reactor.runtime.service import Reactor

log = logging.getLogger(__name__)

HEALTH = "health"

# Most queued jobs one poll offers; more (a burst) are read by the next poll, from where it ended.
POLL_LIMIT = 10_000

# The share of the check's bound its combined statement waits (one pair's tables locked cancel it
# soon enough that each part alone still has time that round), and a part alone waits for a lock.
LOCK_SHARE = 0.5

# What a part came back with: the pair's health, or what its statement failed with.
Outcome = db.Health | BaseException


async def check_pair(reactor: Reactor) -> None:
    """One pair's health check through the pool, as its own duty."""
    listener = reactor.listener
    probe = None if listener is None else listener.probe_for_check()
    sent = reactor.clock.now()
    try:
        with anyio.fail_after(reactor.settings.probe_timeout):
            (health,) = await db.health_of_pairs([(reactor.database, reactor.health_ask(probe))])
    except BaseException:
        _probe_sent(listener, probe, went=False)
        raise
    # At a half-full NOTIFY queue the check skips it: then it is not waited for.
    _probe_sent(listener, probe, went=health.probes_sent > 0)
    reactor.saw(health, sent)


def _probe_sent(listener: Listener | None, probe: str | None, *, went: bool) -> None:
    if listener is not None and probe is not None:
        listener.probe_sent(probe, went=went)


class PairPoll:
    """``reactor``'s poll of its queue, while notifications cannot be relied on; ``runs``: the
    polls run so far."""

    def __init__(self, reactor: Reactor) -> None:
        self.reactor = reactor
        self.runs = 0
        # Where the next poll's window begins.
        self.low: datetime | None = None

    async def run(self) -> None:
        """One poll: every poll interval, the queued jobs whose deadline comes within two
        intervals, offered to the pair's work queue; the doorbell rung or renewed when the
        jobs come fast enough (:mod:`reactor.insurance.doorbell`)."""
        # Windows overlap by that much, so a job queued by a transaction that was still open at
        # the last poll is read now (one that committed after its deadline is the scan's).
        reactor = self.reactor
        if not reactor.polling:
            # Asleep until the pair may need it again (Reactor.poll_if_needed wakes it): an idle
            # replica would otherwise wake four times a second to find nothing to do.
            self.low = None
            reactor.schedule.pace("poll", math.inf)
            return
        # The view of the live set that intake keeps the jobs by.
        membership = reactor.queue.membership
        interval = fleet_poll_interval(
            reactor.settings.poll_interval, len(membership.live), reactor.database.grace
        )
        ahead = 2 * interval
        bell = reactor.doorbell
        bell.pace(interval)
        rings = reactor.rings_doorbell
        shares = membership.shares
        try:
            polled = await reactor.database.poll_queue(
                self.low,
                ahead=ahead,
                limit=POLL_LIMIT,
                ring=rings and bell.ring(),
                lease=bell.lease,
                # The arrivals only judge whether to ring again: none counted where it is not.
                recent=interval if rings else 0.0,
                # The others' jobs would be dropped at intake: not read at all.
                shares=None if shares == ALL_SHARES else shares,
            )
        except BaseException:
            self.low = None
            raise
        self.runs += 1
        bell.polled(reactor.clock.now(), polled.bell_in, polled.arrivals)
        reactor.metrics.doorbell_awake.set(1 if bell.awake(reactor.clock.now()) else 0)
        jobs = polled.jobs
        reactor.dispatcher.intake(POLL.hints((job.job_id, job.due_in) for job in jobs))
        full = len(jobs) >= POLL_LIMIT
        self.low = jobs[-1].since if full else polled.high - timedelta(seconds=ahead)
        if interval > reactor.settings.poll_interval:
            reactor.schedule.pace("poll", interval)


class PairsHealth:
    """The health duty of every pair of a replica, run as one: ``pairs`` by the name their log
    lines carry (None: unnamed), on ``clock``, carrying the probes of ``listener``."""

    def __init__(
        self,
        pairs: Sequence[tuple[str | None, Reactor]],
        clock: Clock,
        listener: Listener | None,
    ) -> None:
        self.pairs = list(pairs)
        self.clock = clock
        self.listener = listener
        # The pairs whose part failed on its own at the last check: they run alone until it
        # answers again.
        self.apart: set[Reactor] = set()
        self.rounds = 0
        self._wake = anyio.Event()
        for _, reactor in self.pairs:
            reactor.schedule.hold(HEALTH, self._wake_up)

    def _wake_up(self) -> None:
        self._wake.set()

    def _serving(self) -> list[tuple[str | None, Reactor]]:
        return [(name, reactor) for name, reactor in self.pairs if not reactor.schedule.closed]

    async def run(self) -> None:
        """Check the pairs whenever one's check is due, until every pair has stopped."""
        while serving := self._serving():
            now = self.clock.now()
            duties = [reactor.cadence.duties[HEALTH] for _, reactor in serving]
            if any(not duty.running and duty.next_at <= now for duty in duties):
                due = [(name, r) for name, r in serving if self._begin(r, now)]
                await self._round(due)
                continue
            self._wake = anyio.Event()
            next_at = min((d.next_at for d in duties if not d.running), default=math.inf)
            await self.clock.sleep_until(next_at, self._wake)

    @staticmethod
    def _begin(reactor: Reactor, now: float) -> bool:
        # Brought forward to the round, as a hasten would: its next run is one interval on.
        reactor.cadence.hasten(HEALTH, now)
        return reactor.cadence.begin(HEALTH, now)

    async def _round(self, due: list[tuple[str | None, Reactor]]) -> None:
        sent = self.clock.now()
        self.rounds += 1
        outcomes: dict[Reactor, Outcome] = {}
        try:
            await self._check(due, outcomes)
        except BaseException:
            # Cancelled, or a bug: each duty is retried by its policy, and nobody is told.
            for name, reactor in due:
                with _on_behalf(name):
                    reactor.schedule.end(HEALTH, ok=False)
            raise
        for name, reactor in due:
            with _on_behalf(name):
                outcome = outcomes[reactor]
                if isinstance(outcome, BaseException):
                    reactor.schedule.end(HEALTH, error=outcome)
                    continue
                reactor.saw(outcome, sent)
                reactor.schedule.end(HEALTH)
        for _, reactor in due:
            if reactor.stopping and isinstance(outcomes[reactor], db.Health):
                # Its heartbeat was written back, perhaps after its reactor left for good.
                await reactor.leave()

    async def _check(
        self, due: list[tuple[str | None, Reactor]], out: dict[Reactor, Outcome]
    ) -> None:
        together = [reactor for _, reactor in due if reactor not in self.apart]
        alone = [reactor for _, reactor in due if reactor in self.apart]
        listener = self.listener
        probe = None if listener is None else listener.probe_for_check()
        # The probe rides on the first part that runs.
        first = (together or alone)[0] if together or alone else None
        asks = {r: r.health_ask(probe if r is first else None) for r in together + alone}
        try:
            async with anyio.create_task_group() as tg:
                for reactor in alone:
                    tg.start_soon(
                        self._alone, reactor, asks[reactor], out, reactor.settings.probe_timeout
                    )
                if together:
                    await self._together(together, asks, out)
        except BaseException:
            _probe_sent(listener, probe, went=False)
            raise
        # At a half-full NOTIFY queue the check skips it: then it is not waited for.
        health = out.get(first) if first is not None else None
        _probe_sent(listener, probe, went=isinstance(health, db.Health) and health.probes_sent > 0)

    async def _together(
        self, pairs: list[Reactor], asks: dict[Reactor, dict[str, Any]], out: dict[Reactor, Outcome]
    ) -> None:
        bound = max(reactor.settings.probe_timeout for reactor in pairs)
        several = len(pairs) > 1
        start = self.clock.now()
        try:
            # One statement as it is, not pinned with a lock_timeout of its own (that is a
            # transaction of four statements per check): where one pair's locked objects make
            # it wait, the client's share of the bound cancels it in time for each part alone.
            with anyio.fail_after(bound * LOCK_SHARE if several else bound):
                healths = await db.health_of_pairs(
                    [(reactor.database, asks[reactor]) for reactor in pairs]
                )
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
                for reactor in pairs:
                    tg.start_soon(self._alone, reactor, asks[reactor], out, within)
            return
        out.update(zip(pairs, healths, strict=True))

    async def _alone(
        self,
        reactor: Reactor,
        ask: dict[str, Any],
        out: dict[Reactor, Outcome],
        within: float,
    ) -> None:
        try:
            with anyio.fail_after(within):
                # Refused for a lock before the bound runs out, the part is checked alone from
                # then on and the others together; pinned, but only while it is apart.
                (out[reactor],) = await db.health_of_pairs(
                    [(reactor.database, ask)], lock_timeout=within * LOCK_SHARE
                )
            self.apart.discard(reactor)
        except db.DATABASE_ERRORS as error:
            out[reactor] = error
            if db.statement_refused(error):
                self.apart.add(reactor)


@contextlib.contextmanager
def _on_behalf(name: str | None) -> Iterator[None]:
    # What is done here is the pair's: its lines name it (see reactor.telemetry.logs).
    token = logs.PAIR.set(name)
    try:
        yield
    finally:
        logs.PAIR.reset(token)
