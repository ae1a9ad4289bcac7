"""Which replica claims which job: rendezvous hashing of the job's share over the replicas
PostgreSQL says are live.

Every job falls in one of :data:`SHARES` shares by a hash of its id that the job trigger computes
too, so that a trigger installed with ``reactor migrate --spread`` notifies each share on a
channel of its own and a replica hears only the shares it owns. The owner of a share is the
live replica with the highest hash of (replica, share): every replica that sees the same live
set agrees without talking, and when a replica joins or leaves only the shares it gains or
loses change hands. A job is claimed only by its owner, so the database sees one claim per job
whatever the replica count.

Views of the live set can differ for a moment (a heartbeat read just before or after a change).
Then two replicas may both claim a job, which the record statement makes harmless, or neither,
which the scan every replica runs when its view changes makes good. Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

# A replica is live while its heartbeat (one per probe interval) is younger than this many probe
# intervals: a slow check or two does not hand its jobs away. A killed one is known sooner: its
# LISTEN session is gone at the others' next check.
LIVENESS_PROBES = 3


# How many shares the jobs fall in. A replica that owns them all LISTENs on this many channels
# plus the main one.
SHARES = 128
ALL_SHARES = frozenset(range(SHARES))
# A share's channel is the main one with ".<share>" appended; PostgreSQL names are 63 bytes.
CHANNEL_MAX_BYTES = 63


def share_of(job_id: str) -> int:
    """The share ``job_id`` (its canonical text) falls in: the first byte of its SHA-256, as the
    job trigger computes it (:func:`share_sql`)."""
    return hashlib.sha256(job_id.encode()).digest()[0] % SHARES


def share_sql(job_id: str) -> str:
    """:func:`share_of` in SQL, of the job id expression ``job_id``. SHA-256 rather than md5:
    a server in FIPS mode refuses md5, and this runs in the app's commits."""
    return f"(get_byte(sha256(convert_to({job_id}::text, 'UTF8')), 0) % {SHARES})"


def share_channels(channel: str) -> tuple[str, ...] | None:
    """The channel of each share, in share order; None when ``channel`` is too long to take the
    suffix (the trigger cannot spread over it, and `reactor migrate --spread` refuses it)."""
    if len(f"{channel}.{SHARES - 1}".encode()) > CHANNEL_MAX_BYTES:
        return None
    return tuple(f"{channel}.{share}" for share in range(SHARES))


def replicas_channel(reactor_schema: str, channel: str) -> str:
    """The channel replicas say they joined or left on: ``<reactor_schema>_replicas``, apart from
    the jobs' channels, so that a replica hears its peers whatever the trigger notifies. A schema
    too long to take the suffix keeps them on the main ``channel``, as before."""
    name = f"{reactor_schema}_replicas"
    return name if len(name.encode()) <= CHANNEL_MAX_BYTES else channel


def weight(replica: str, share: int) -> int:
    """The rendezvous weight of ``share`` for ``replica``: 64 well-mixed bits."""
    digest = hashlib.blake2b(f"{replica}\x00{share}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(share: int, replicas: Iterable[str]) -> str | None:
    """The replica that claims the jobs of ``share`` among ``replicas``; None when none."""
    return max(replicas, key=lambda replica: weight(replica, share), default=None)


@dataclass(frozen=True)
class Membership:
    """One replica's view of who is live: itself (``me``) and the others it saw heartbeating."""

    me: str
    live: frozenset[str] = frozenset()

    @cached_property
    def shares(self) -> frozenset[int]:
        """The shares this replica claims now.

        A replica that does not see itself in the live set (before its first heartbeat, or
        after its own heartbeat went stale) claims everything: claiming twice costs a statement,
        claiming never would cost the job its run.
        """
        if self.me not in self.live:
            return ALL_SHARES
        return frozenset(s for s in range(SHARES) if owner(s, self.live) == self.me)

    def owns(self, job_id: str) -> bool:
        """True when this replica should claim ``job_id`` now."""
        return share_of(job_id) in self.shares

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
