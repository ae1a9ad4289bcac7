"""A pair's side of a LISTEN session, for the listener's tests: a real verifier whose work
queue, members and scan are this object, which keeps what reached them."""

from __future__ import annotations

from collections.abc import Iterable

from reactor import db
from reactor.claim.sources import Hint
from reactor.core.clock import FakeClock
from reactor.listen.hints import Verifier
from reactor.telemetry.metrics import Metrics


class Heard:
    """What a pair was told by its session: the jobs handed to its work queue (none is this
    replica's yet, so each goes there unverified, as another replica's would), the re-reads it
    was asked for, the doorbells rung, the replicas confirmed."""

    def __init__(self, database: db.Database, metrics: Metrics | None = None) -> None:
        self.jobs: list[str] = []
        self.rearms = 0
        self.bells = 0
        self.notifications = 0
        self.confirmed: list[tuple[str, bool]] = []
        self.verifier = Verifier(
            database,
            FakeClock(),
            liveness=15.0,
            timeout=1.0,
            intake=self,
            members=self,
            rescan=self,
            metrics=metrics or Metrics(),
        )

    # The work queue's door.
    def intake(self, hints: Iterable[Hint]) -> None:
        self.jobs.extend(hint.job_id for hint in hints)

    def wants(self, job: str) -> bool:
        return False

    @property
    def live(self) -> int:
        return 1

    # The members.
    def left(self, replica: str) -> None:
        self.confirmed.append((replica, True))

    def joined(self, replica: str) -> None:
        self.confirmed.append((replica, False))

    # The scan.
    def request(self, *, rearm: bool) -> None:
        pass

    # What the session tells the pair (reactor.listen.subscriber.Hearing).
    def listening(self) -> None:
        self.rearms += 1

    def proven(self) -> None:
        pass

    def changed(self) -> None:
        pass

    def rang(self) -> None:
        self.bells += 1

    def notified(self) -> None:
        self.notifications += 1

    def shares(self) -> frozenset[int]:
        return frozenset()

    def said(self) -> list[tuple[str, bool]]:
        """The replicas said to have joined or left, waiting to be verified, in order."""
        batch = self.verifier.pending.take(float("inf"))
        return [] if batch is None else list(batch.replicas.items())
