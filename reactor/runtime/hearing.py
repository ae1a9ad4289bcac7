"""What a pair does with what its LISTEN session tells it, beyond the jobs and the replicas it
names (those go from the session to the pair's verifier and work queue, in the listen room):
the session's state, the doorbell, the shares to hear. The Hearing of
:mod:`reactor.listen.subscriber`, made of the parts that act on it."""

from __future__ import annotations

from reactor.insurance.cadence import Scheduler
from reactor.insurance.health import HEALTH
from reactor.insurance.poll import PairPoll
from reactor.insurance.scan import PairScan
from reactor.runtime.membership import PairMembership


class PairHearing:
    """A pair's answer to its session: ``scan`` re-reads, ``poll`` watches the doorbell and
    wakes when notifications may not be relied on, ``schedule`` brings the health check
    forward, ``members`` says which shares to hear."""

    def __init__(
        self, scan: PairScan, poll: PairPoll, schedule: Scheduler, members: PairMembership
    ) -> None:
        self.scan = scan
        self.poll = poll
        self.schedule = schedule
        self.members = members

    def listening(self) -> None:
        """The pair's channels are LISTENed on: re-read what was notified before."""
        self.scan.request(rearm=True)

    def proven(self) -> None:
        """A probe proved a new session: check at once, not at the next check; the heartbeat
        names the session, which tells the others at once if this process is killed."""
        self.schedule.hasten(HEALTH)

    def changed(self) -> None:
        """The session changed state: the poll may be needed."""
        self.poll.wake_if_needed()

    def rang(self) -> None:
        """A replica rang this pair's doorbell."""
        self.poll.rang()

    def notified(self) -> None:
        """A job was notified: the doorbell counts it."""
        self.poll.heard()

    def shares(self) -> frozenset[int]:
        """The shares whose channels to LISTEN on."""
        return self.members.heard_shares()
