"""The doorbell: when a replica keeps its channel's bell awake, and how long it polls for it.

A NOTIFY takes a lock for the whole cluster at commit, held through the commit's WAL flush, so
the app's notifying commits queue on it one by one. The job trigger skips its NOTIFY while the
channel's row of the doorbell table is awake (migration 0020). A replica rings it awake when the
job notifications it hears come at REACTOR_DOORBELL_RATE a second or more, and renews it while
its polls find jobs arriving at half that rate; each ring holds for :data:`LEASE_POLLS` poll
intervals. A ring that wakes a silent bell tells every replica at once. Every replica polls
the queue while the bell is awake, whoever rang it, and for a
grace after it falls silent: a job whose commit skipped the NOTIFY was queued before the bell
fell silent, so it comes due within that grace, and the poll reads the queue by deadline.

Pure: no I/O, no clock of its own; times are the caller's clock, in seconds.
"""

from __future__ import annotations

import math
from collections import deque

# The bell is awake this many poll intervals past each ring: a replica renews it at every poll
# while the jobs keep coming, so one or two late polls do not let it fall silent, and a replica
# that stops or dies holds it no longer than this.
LEASE_POLLS = 4

# The least grace, in poll intervals, under which a pair rings the bell.
MIN_GRACE_POLLS = 2

# The notifications heard are counted over the last second.
WINDOW_S = 1.0


class Doorbell:
    """One pair's view of its channel's bell: ``rate`` jobs a second ring it (0: never), the
    poll runs every ``interval`` seconds, and the jobs are due ``grace`` seconds after they
    are queued."""

    def __init__(self, rate: float, interval: float, grace: float) -> None:
        # Under a grace of less than two polls, a job queued just after a poll would come due
        # before the poll could arm it: such a pair keeps every notification (grace 0 claims
        # each job as its notification arrives).
        self.rate = rate if grace >= MIN_GRACE_POLLS * interval else 0
        self.interval = interval
        self.grace = grace
        # Until when the bell is awake, as the last poll or check read it (this replica's ring
        # or another's), on the caller's clock.
        self.awake_until = -math.inf
        self._heard: deque[float] = deque()
        self._wanted = False
        self._told = False
        self._busy = False

    def pace(self, interval: float) -> None:
        """The poll now runs every ``interval`` seconds (a replica of a fleet polls less often
        than one alone): a ring keeps the bell awake as many of them, and the arrivals a poll
        counts are judged over one."""
        self.interval = interval

    @property
    def lease(self) -> float:
        """The seconds a ring keeps the bell awake."""
        return LEASE_POLLS * self.interval

    def awake(self, now: float) -> bool:
        """True while the job trigger skips its NOTIFY, as far as this replica knows."""
        return now < self.awake_until

    def covers(self, now: float) -> bool:
        """True while the queue must be polled for the bell: from when a ring is wanted, while
        it is awake, and for a grace after, until every job queued without a notification has
        come due."""
        return self._wanted or self._told or now < self.awake_until + self.grace

    def told(self) -> None:
        """Another replica says it rang the bell awake: the next poll, brought forward, reads
        it (a stranger's word costs that one poll)."""
        self._told = True

    def heard(self, now: float) -> bool:
        """A job notification was heard at ``now``. True when that makes the stream worth the
        bell: then the next poll, brought forward, rings it."""
        if self.rate <= 0:
            return False
        heard = self._heard
        heard.append(now)
        while heard[0] <= now - WINDOW_S:
            heard.popleft()
        if len(heard) < self.rate * WINDOW_S or self.awake(now):
            return False
        self._wanted = True
        heard.clear()
        return True

    def ring(self) -> bool:
        """Whether the next poll rings the bell: it was asked for by what was heard, or the
        last poll found the jobs still arriving."""
        return self.rate > 0 and (self._wanted or self._busy)

    def polled(self, now: float, awake_for: float | None, arrivals: int) -> None:
        """A poll answered at ``now``: the bell is awake ``awake_for`` more seconds (None:
        silent), and ``arrivals`` jobs were queued within the last poll interval."""
        self._wanted = self._told = False
        self._busy = arrivals >= self.rate * self.interval / 2
        self.saw(now, awake_for)

    def saw(self, now: float, awake_for: float | None) -> None:
        """A read of the bell at ``now`` (a poll, a health check): awake ``awake_for`` more
        seconds, or silent (None, or not positive)."""
        if awake_for is not None and awake_for > 0:
            self.awake_until = max(self.awake_until, now + awake_for)
