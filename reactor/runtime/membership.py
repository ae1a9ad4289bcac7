"""A pair's side of its replica's membership: what it does when the replicas it sees change.

The replica's roster (:class:`~reactor.core.ownership.Roster`) hears of another replica three
ways: it says it left, it says it joined (both on the channel, verified against the tables), or
a health check reads the heartbeats. Each change goes to the pair's work queue (the jobs it owns
now), to its gauge of live replicas, and to its LISTEN session (the share channels it hears).
"""

from __future__ import annotations

import logging
from dataclasses import KW_ONLY, dataclass
from typing import Protocol

from reactor.claim.dispatch import WorkQueue
from reactor.core.ownership import Roster
from reactor.listen.hints import Rescan
from reactor.listen.listener import Listener
from reactor.telemetry.metrics import Metrics

# Named as these log lines were before they had a module of their own.
log = logging.getLogger("reactor.runtime.service")


class Spread(Protocol):
    """Whether the pair's trigger notifies a channel per share (:class:`~.vitals.Vitals`)."""

    @property
    def trigger_spread(self) -> bool:
        """True when it does."""
        ...


@dataclass(eq=False, repr=False)
class PairMembership:
    """A pair's answer to the replicas it sees live: ``roster`` says who they are, ``queue``
    keeps the jobs by them, ``listener`` hears the shares' channels of the pair whose main one
    is ``channel``, and ``rescan`` reads the jobs gained."""

    roster: Roster
    queue: WorkQueue
    metrics: Metrics
    _: KW_ONLY
    listener: Listener | None
    channel: str
    rescan: Rescan
    spread: Spread

    def left(self, replica: str) -> None:
        """``replica`` said it left."""
        # Another replica stopped cleanly and said so, and its heartbeat row is gone: its jobs
        # are ours now, not at our next check. Our own word comes back to us too.
        self.see_lost(self.roster.left(replica))

    def joined(self, replica: str) -> None:
        """``replica`` said it joined."""
        # A new replica wrote its first heartbeat, and it is live by it: its share is its own
        # from now on, rather than claimed by two until our next check.
        if self.roster.joined(replica):
            self._changed(frozenset())

    def see_lost(self, lost: frozenset[str]) -> None:
        """The roster changed (``lost``: the replicas gone from it): act on it, if the work
        queue has not yet."""
        if self.roster.membership != self.queue.membership:
            self._changed(lost)

    def _changed(self, lost: frozenset[str]) -> None:
        membership = self.roster.membership
        log.info(
            "replicas changed",
            extra={"live": len(membership.live), "left": ",".join(sorted(lost)) or None},
        )
        self.queue.see(membership)
        self.metrics.replicas_live.set(len(membership.live))
        # What we gained was never held here: the re-arm reads the queue's jobs inside their
        # grace (by the database's deadlines, so a job touched since its notification is aimed
        # right), and the scan records whatever came due. When the trigger spreads, a proven
        # listener first LISTENs on the shares we gained, then asks for it.
        listener = self.listener
        rearms = listener is not None and listener.refresh_pair(self.channel)
        if lost and not rearms:
            self.rescan.request(rearm=True)

    def heard_shares(self) -> frozenset[int]:
        """The shares whose channels the listener LISTENs on for this pair."""
        # Those this replica owns, when the trigger notifies a channel per share; none otherwise
        # (all comes on the main one).
        return self.queue.membership.shares if self.spread.trigger_spread else frozenset()
