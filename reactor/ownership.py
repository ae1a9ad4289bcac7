"""Which replica claims which job: rendezvous hashing over the replicas PostgreSQL says are live.

Every replica hears every notification and arms a timer for every job, but when a timer fires
only the job's owner claims it, so the database sees one claim per job whatever the replica
count. The owner of a job is the live replica with the highest hash of (replica, job): every
replica that sees the same live set agrees without talking, and when a replica joins or leaves
only the jobs it gains or loses change hands.

Views of the live set can differ for a moment (a heartbeat read just before or after a change).
Then two replicas may both claim a job, which the record statement makes harmless, or neither,
which the scan every replica runs when its view changes makes good. Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

# A replica is live while its heartbeat (one per probe interval) is younger than this many probe
# intervals: a slow check or two does not hand its jobs away. A killed one is known sooner: its
# LISTEN session is gone at the others' next check.
LIVENESS_PROBES = 3


def weight(replica: str, job_id: str) -> int:
    """The rendezvous weight of ``job_id`` for ``replica``: 64 well-mixed bits."""
    digest = hashlib.blake2b(f"{replica}\x00{job_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(job_id: str, replicas: Iterable[str]) -> str | None:
    """The replica that claims ``job_id`` among ``replicas``; None when there are none."""
    return max(replicas, key=lambda replica: weight(replica, job_id), default=None)


@dataclass(frozen=True)
class Membership:
    """One replica's view of who is live: itself (``me``) and the others it saw heartbeating."""

    me: str
    live: frozenset[str] = frozenset()

    def owns(self, job_id: str) -> bool:
        """True when this replica should claim ``job_id`` now.

        A replica that does not see itself in the live set (before its first heartbeat, or
        after its own heartbeat went stale) claims everything: claiming twice costs a statement,
        claiming never would cost the job its run.
        """
        if self.me not in self.live:
            return True
        return owner(job_id, self.live) == self.me

    def lost(self, newer: Membership) -> frozenset[str]:
        """The replicas this view had and ``newer`` does not: their jobs changed hands."""
        return self.live - newer.live


class Roster:
    """One replica's view of the live set, from the heartbeats it reads and from what the
    others say when they join (``joined:``) or stop (``left:``) between two reads.

    A replica that said it stopped is never live again, whatever a heartbeat of its still in
    flight says (ids are unique to a process); it is forgotten once no heartbeat shows it.
    """

    def __init__(self, me: str) -> None:
        self.membership = Membership(me)
        self._departed: set[str] = set()

    def heartbeats(self, live: frozenset[str]) -> frozenset[str]:
        """A health check read ``live``; returns the replicas this view lost."""
        self._departed &= live
        return self._see(live - self._departed)

    def left(self, replica: str) -> frozenset[str]:
        """``replica`` said it stopped; returns the replicas this view lost."""
        if replica == self.membership.me:
            return frozenset()
        self._departed.add(replica)
        return self._see(self.membership.live - {replica})

    def joined(self, replica: str) -> bool:
        """``replica`` wrote its first heartbeat; True when this view changed. Before this
        replica's own first heartbeat it claims everything, and learns the others from it."""
        live = self.membership.live
        if replica in self._departed or replica in live or self.membership.me not in live:
            return False
        self._see(live | {replica})
        return True

    def _see(self, live: frozenset[str]) -> frozenset[str]:
        seen = Membership(self.membership.me, live)
        lost = self.membership.lost(seen)
        changed = seen != self.membership
        self.membership = seen
        return lost if changed else frozenset()
