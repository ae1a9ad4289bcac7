"""What the channel says, verified before anything is armed by it.

PostgreSQL has no privilege on NOTIFY: any role that can connect can send on the reactor's
channel. So a notification only names something to look up, never something to act on:

- A job hint (``<job id>@<updated_at>``) arms a timer only once one statement found the job in
  the queue (``<reactor_schema>.pending``); the deadline is the job's own ``updated_at`` plus
  the grace, read in that statement, never the time the hint carries. A made-up hint costs a
  slot in a bounded buffer for a few milliseconds, then nothing. At a grace of 0 every queued
  job is due when heard, and the claim is that statement: it claims only a queued job that is
  due, so the hint is handed to it at once, and a made-up one costs that claim.
- ``joined:<replica>`` and ``left:<replica>`` change the live set only when the heartbeat rows
  agree: a replica said to have joined must be live by its heartbeat, one said to have left must
  not be. A replica's own word comes after its heartbeat row was written or deleted (one
  statement does both), so a true one is always confirmed.

Hints are verified in batches: the first one to arrive in an empty buffer starts a short wait
(:data:`LINGER_S`), so that a burst costs one statement per batch rather than one per job; a full
batch goes at once. When the buffer is full (a flood, whether forged or not), further job hints
are dropped and counted, and the reactor re-reads the queue (its re-arm) every
:data:`REREAD_EVERY_S` seconds meanwhile and once it has drained: a real job whose hint was
dropped, or waits behind the flood, is found there, and the scan remains the backstop of both.
A batch the database could not verify asks for the same re-read, never more often: a stranger
who could make every statement fail must not make each one cost a read of the whole queue.
A job id its column's type cannot hold never reaches a batch (reactor/core/payload.py): it is
garbage, counted as such, and cannot fail the real hints beside it.

:class:`HintBatch` and :class:`ThrottledLog` are pure: no I/O, no clock; what needs the time takes
``now``. :class:`Verifier` is their async shell.
"""

from __future__ import annotations

import logging
import math
from dataclasses import KW_ONLY, dataclass, field
from itertools import islice
from typing import Protocol

import anyio

from reactor import db
from reactor.claim.dispatch import Intake
from reactor.claim.sources import LISTEN
from reactor.core.clock import Clock
from reactor.telemetry.metrics import Metrics

log = logging.getLogger(__name__)

# How long the first hint of a batch waits for others to join it: a few milliseconds of
# lateness on a grace of seconds, and one statement for a whole burst. In a fleet, per replica
# live (see fleet_linger).
LINGER_S = 0.005
# The most of the grace a fleet's linger may take.
LINGER_SHARE_OF_GRACE = 0.05
# Most job ids verified by one statement.
BATCH = 2_000
# Most job hints waiting to be verified; more are dropped until the buffer drains. About 2 MB.
CAPACITY = 20_000
# Most membership claims waiting: a live set is a handful of replicas.
REPLICA_CAPACITY = 256
# While job hints are dropped at a full buffer, the queue is read again at most this often (and
# once the buffer has drained): a real job hinted behind a flood is armed from there, not from
# its hint, which the flood holds back in the NOTIFY queue.
REREAD_EVERY_S = 1.0
# A batch with this many job hints naming no queued job is a flood too: real hints wait behind it
# in the NOTIFY queue, so the queue is read again as when hints are dropped.
FLOOD = 500
# Lines about what the channel brought that the reactor ignores: at most one per this many
# seconds for each kind, with the count since the last one.
LOG_INTERVAL_S = 10.0


def fleet_linger(live: int, grace: float) -> float:
    """How long the first hint of a batch waits for others, with ``live`` replicas serving.

    :data:`LINGER_S` per replica: where the trigger spreads the jobs, each of N replicas hears a
    Nth of them, so a linger N times as long gathers as many hints into a statement as one
    replica's does, and the fleet verifies as often as one replica would rather than N times as
    often. Arming a timer later costs nothing while the grace is longer, so the linger stays
    within :data:`LINGER_SHARE_OF_GRACE` of it: at grace 0 a job is due as it is heard, and
    nothing lingers.
    """
    return min(LINGER_S * max(live, 1), grace * LINGER_SHARE_OF_GRACE)


@dataclass(frozen=True, slots=True)
class HintsToVerify:
    """Hints to verify in one statement: job ids, and replicas said to have left (True) or
    joined (False)."""

    jobs: list[str]
    replicas: dict[str, bool] = field(default_factory=dict)


@dataclass(eq=False, repr=False)
class HintBatch:
    """The hints heard and not yet verified, bounded, and when the next batch is due."""

    _: KW_ONLY
    capacity: int = CAPACITY
    batch: int = BATCH
    linger: float = LINGER_S
    replica_capacity: int = REPLICA_CAPACITY
    # Insertion-ordered: the oldest hints go first. A job hinted twice is verified once.
    _jobs: dict[str, None] = field(default_factory=dict, init=False)
    _replicas: dict[str, bool] = field(default_factory=dict, init=False)
    _since: float | None = field(default=None, init=False)
    # Counters: job hints and membership claims dropped because the buffer was full.
    dropped: int = field(default=0, init=False)
    replicas_dropped: int = field(default=0, init=False)
    # Whether job hints were dropped since the last time :meth:`missed` said so.
    _missed: bool = field(default=False, init=False)
    _reread_at: float = field(default=-math.inf, init=False)

    def __len__(self) -> int:
        """Hints waiting: job ids and membership claims."""
        return len(self._jobs) + len(self._replicas)

    def add_job(self, job: str, now: float) -> bool:
        """``job`` was hinted at ``now``; False when the buffer is full and it was dropped."""
        if job not in self._jobs and len(self._jobs) >= self.capacity:
            self.dropped += 1
            self._missed = True
            return False
        self._jobs[job] = None
        self._started(now)
        return True

    def add_replica(self, replica: str, *, left: bool, now: float) -> bool:
        """``replica`` said it ``left`` (or joined) at ``now``; the last word for a replica wins.
        False when the buffer is full and it was dropped (the next health check reads the live
        set anyway)."""
        if replica not in self._replicas and len(self._replicas) >= self.replica_capacity:
            self.replicas_dropped += 1
            return False
        self._replicas[replica] = left
        self._started(now)
        return True

    def _started(self, now: float) -> None:
        if self._since is None:
            self._since = now

    def due_at(self) -> float | None:
        """When the next batch should go: at once when a batch is full, otherwise the first
        waiting hint's arrival plus the linger; None when nothing waits."""
        if self._since is None:
            return None
        if len(self._jobs) >= self.batch:
            return -math.inf
        return self._since + self.linger

    def take(self, now: float) -> HintsToVerify | None:
        """The next batch, if one is due at ``now``: up to :attr:`batch` job ids, oldest first,
        and every membership claim; None when none is due."""
        due = self.due_at()
        if due is None or now < due:
            return None
        jobs = list(islice(self._jobs, self.batch))
        for job in jobs:
            del self._jobs[job]
        replicas, self._replicas = self._replicas, {}
        # What is left (a flood) goes as the next batch, without another linger.
        self._since = now - self.linger if self._jobs else None
        return HintsToVerify(jobs, replicas)

    def flooded(self, unverified: int) -> None:
        """A batch held ``unverified`` job hints that named no queued job."""
        if unverified >= FLOOD:
            self._missed = True

    def unverified(self) -> None:
        """A batch could not be verified (the database failed it): its hints are lost unless
        the queue is read again, as when hints are dropped."""
        self._missed = True

    def missed(self, now: float) -> bool:
        """True when job hints were dropped, or a batch could not be verified, since the last
        time it said so, and the last re-read is :data:`REREAD_EVERY_S` old: the queue should be
        read again now. At most once a second, full or drained (:meth:`reread_at` says when)."""
        if not self._missed or now - self._reread_at < REREAD_EVERY_S:
            return False
        self._missed = False
        self._reread_at = now
        return True

    def reread_at(self) -> float | None:
        """When :meth:`missed` says True next, if hints were missed; None when none were."""
        return self._reread_at + REREAD_EVERY_S if self._missed else None


class ThrottledLog:
    """Counts one kind of event and says when to log it: the first at once, then at most once
    per ``interval`` with the count since the last line."""

    def __init__(self, interval: float = LOG_INTERVAL_S) -> None:
        self.interval = interval
        self.total = 0
        self._unlogged = 0
        self._logged_at = -math.inf

    def note(self, now: float, count: int = 1) -> int:
        """``count`` more happened at ``now``; returns how many to log now (0: not yet)."""
        self.total += count
        self._unlogged += count
        return self.due(now)

    def due(self, now: float) -> int:
        """How many to log now, if any are unlogged and the interval has passed; 0 otherwise."""
        if not self._unlogged or now - self._logged_at < self.interval:
            return 0
        count, self._unlogged = self._unlogged, 0
        self._logged_at = now
        return count


class Members(Protocol):
    """Who is told of the replicas whose heartbeat agrees with what they said
    (:class:`reactor.runtime.membership.PairMembership`)."""

    def left(self, replica: str) -> None:
        """``replica`` said it left, and its heartbeat is gone."""
        ...

    def joined(self, replica: str) -> None:
        """``replica`` said it joined, and its heartbeat is live."""
        ...


class Rescan(Protocol):
    """What reads the queue again (:class:`reactor.insurance.scan.PairScan`)."""

    def request(self, *, rearm: bool) -> None:
        """Scan soon; with ``rearm``, offer the upcoming jobs too."""
        ...


@dataclass(eq=False, repr=False)
class Verifier:
    """Verifies the hints heard against the database, in batches, and hands on what holds.

    A queued job goes to ``intake`` with the seconds until it is due; a replica whose heartbeat
    agrees to ``members``; when hints were dropped, ``rescan`` reads the queue again. A
    statement that takes longer than ``timeout`` (a pooled connection whose network froze) is
    given up, and the queue read again: the batches are verified one after another, and one
    hung statement must not hold every hint behind it.
    """

    database: db.Database
    clock: Clock
    _: KW_ONLY
    liveness: float
    timeout: float
    intake: Intake
    members: Members
    rescan: Rescan
    metrics: Metrics
    pending: HintBatch = field(init=False)
    # What did not hold, for the log: job hints naming no queued job, membership claims
    # the heartbeats contradict, and job hints dropped at a full buffer.
    tallies: dict[str, ThrottledLog] = field(init=False)
    statements: int = field(default=0, init=False)
    _wake: anyio.Event = field(default_factory=anyio.Event, init=False)
    _closed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.pending = HintBatch(linger=fleet_linger(1, self.database.grace))
        self.tallies = {kind: ThrottledLog() for kind in ("job", "replica", "dropped")}

    def heard(self, job: str) -> None:
        """A notification named ``job``. Verified against the queue before it is armed, at the
        deadline the job row gives: the hint's own updated_at is the sender's word. A job
        another live replica owns is left to it unverified, with no deadline: it costs
        nothing here."""
        if not self.intake.wants(job):
            self.intake.intake(LISTEN.hints([(job, None)]))
        elif self.database.grace == 0:
            # Due as soon as queued: the claim that follows at once reads the queue as a
            # verifying statement would (it claims only a queued job that is due), so it is the
            # check, and a made-up hint costs that one statement instead. No batch: the claim
            # starts from here.
            self._arm(job, 0.0)
        else:
            self.job(job)

    def _arm(self, job: str, due_in: float) -> None:
        self.intake.intake(LISTEN.hints([(job, due_in)]))

    def job(self, job: str) -> None:
        """Verify ``job``, named by a notification, with the next batch."""
        now = self.clock.now()
        if not self.pending.add_job(job, now):
            self._count("dropped", 1, now)
        self._wake.set()

    def serving(self, live: int) -> None:
        """``live`` replicas now serve the pair: see :func:`fleet_linger`."""
        self.pending.linger = fleet_linger(live, self.database.grace)

    def replica(self, replica: str, *, left: bool) -> None:
        """A notification said ``replica`` left (or joined)."""
        if not self.pending.add_replica(replica, left=left, now=self.clock.now()):
            self._unverified("replica", 1)
        self._wake.set()

    def close(self) -> None:
        """Verify no more; what waits is dropped (the next replica's re-arm reads the queue)."""
        self._closed = True
        self._wake.set()

    async def run(self) -> None:
        """Verify batches as they come due, until :meth:`close`."""
        while not self._closed:
            now = self.clock.now()
            if self.pending.missed(now):
                self.rescan.request(rearm=True)
            batch = self.pending.take(now)
            if batch is None:
                wakes = (self.pending.due_at(), self.pending.reread_at())
                due = min((at for at in wakes if at is not None), default=math.inf)
                self._wake = anyio.Event()
                await self.clock.sleep_until(due, self._wake)
                continue
            await self._verify(batch)

    async def _verify(self, batch: HintsToVerify) -> None:
        try:
            self.statements += 1
            with anyio.fail_after(self.timeout):
                found = await self.database.verify_hints(
                    batch.jobs, list(batch.replicas), liveness=self.liveness
                )
        except (*db.DATABASE_ERRORS, TimeoutError) as error:
            # Nothing is lost: the queue rows stay, and the re-arm reads them once the
            # database answers; the live set is the health check's to read.
            log.debug("could not verify notifications", extra={"error": db.first_line(error)})
            self.pending.unverified()
            return
        self.apply(batch, found)

    def apply(self, batch: HintsToVerify, found: db.Verified) -> None:
        """Hand on what ``found`` confirms of ``batch``; count the rest."""
        now = self.clock.now()
        for job, due_in in found.jobs:
            self._arm(job, due_in)
        self._count("job", len(batch.jobs) - len(found.jobs), now)
        self.pending.flooded(len(batch.jobs) - len(found.jobs))
        forged = 0
        for replica, left in batch.replicas.items():
            if left == (replica in found.live):
                forged += 1
            elif left:
                self.members.left(replica)
            else:
                self.members.joined(replica)
        self._count("replica", forged, now)
        if len(batch.replicas) > forged:
            self.serving(self.intake.live)

    def _count(self, kind: str, count: int, now: float) -> None:
        if count:
            self._unverified(kind, count)
            self._log(kind, self.tallies[kind].note(now, count))

    def _unverified(self, kind: str, count: int) -> None:
        self.metrics.notified["dropped" if kind == "dropped" else "unverified"].inc(count)

    def report(self) -> None:
        """Log the counts a flood left behind, once their interval has passed (the health
        check calls it)."""
        now = self.clock.now()
        for kind, tally in self.tallies.items():
            self._log(kind, tally.due(now))

    def _log(self, kind: str, count: int) -> None:
        if not count:
            return
        message = {
            # Mostly the app's own: a job saved or touched in the few milliseconds before its
            # hint was checked, a status changed between two finished values. Counted, said
            # at info; the flood and the contradicted membership messages are a stranger's.
            "job": "ignored notifications naming no queued job (settled first, or not ours)",
            "replica": "ignored notifications of replicas joining or leaving that their "
            "heartbeats contradict",
            "dropped": "dropped job notifications while too many waited to be verified; the "
            "queue is read again",
        }[kind]
        level = logging.INFO if kind == "job" else logging.WARNING
        log.log(level, message, extra={"count": count, "interval_s": LOG_INTERVAL_S})
