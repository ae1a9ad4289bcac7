"""A pair's side of its replica's membership: what it does when the replicas it sees change.

The replica's roster (:class:`~reactor.core.ownership.Roster`) hears of another replica three
ways: it says it left, it says it joined (both on the channel, verified against the tables), or
a health check reads the heartbeats. Each change goes to the pair's work queue (the jobs it owns
now), to its gauge of live replicas, and to its LISTEN session (the share channels it hears).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reactor.runtime.service import Reactor

# Named as these log lines were before they had a module of their own.
log = logging.getLogger("reactor.runtime.service")


class PairMembership:
    """``reactor``'s answer to the replicas it sees live."""

    def __init__(self, reactor: Reactor) -> None:
        self.reactor = reactor

    def left(self, replica: str) -> None:
        """``replica`` said it left."""
        # Another replica stopped cleanly and said so, and its heartbeat row is gone: its jobs
        # are ours now, not at our next check. Our own word comes back to us too.
        self.see_lost(self.reactor.roster.left(replica))

    def joined(self, replica: str) -> None:
        """``replica`` said it joined."""
        # A new replica wrote its first heartbeat, and it is live by it: its share is its own
        # from now on, rather than claimed by two until our next check.
        if self.reactor.roster.joined(replica):
            self._changed(frozenset())

    def see_lost(self, lost: frozenset[str]) -> None:
        """The roster changed (``lost``: the replicas gone from it): act on it, if the work
        queue has not yet."""
        reactor = self.reactor
        if reactor.roster.membership != reactor.queue.membership:
            self._changed(lost)

    def _changed(self, lost: frozenset[str]) -> None:
        reactor = self.reactor
        membership = reactor.roster.membership
        log.info(
            "replicas changed",
            extra={"live": len(membership.live), "left": ",".join(sorted(lost)) or None},
        )
        reactor.queue.see(membership)
        reactor.metrics.replicas_live.set(len(membership.live))
        reactor.verifier.serving(len(membership.live))
        # What we gained was never held here: the re-arm reads the queue's jobs inside their
        # grace (by the database's deadlines, so a job touched since its notification is aimed
        # right), and the scan records whatever came due. When the trigger spreads, a proven
        # listener first LISTENs on the shares we gained, then asks for it.
        listener = reactor.listener
        rearms = listener is not None and listener.refresh(reactor.subscriber)
        if lost and not rearms:
            reactor.request_scan(rearm=True)

    def heard_shares(self) -> frozenset[int]:
        """The shares whose channels the listener LISTENs on for this pair."""
        # Those this replica owns, when the trigger notifies a channel per share; none otherwise
        # (all comes on the main one).
        reactor = self.reactor
        return reactor.queue.membership.shares if reactor.vitals.trigger_spread else frozenset()
