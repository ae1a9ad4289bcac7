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
