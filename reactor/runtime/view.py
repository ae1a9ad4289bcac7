"""What a running pair publishes of itself for the operator's page: a read-only view, taken
when the page asks, of what it holds in memory. The page reads this and nothing else of the
pair."""

from __future__ import annotations

from dataclasses import dataclass

from reactor.listen.listener import Listener, State
from reactor.record.recorder import Settled
from reactor.telemetry.metrics import Metrics


def lateness_buckets(metrics: Metrics) -> list[tuple[float, int]]:
    """(upper bound in seconds, count in that bucket alone) of the lateness histogram; the last
    bound is infinity."""
    cumulative: list[tuple[float, float]] = []
    for family in metrics.lateness.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                cumulative.append((float(sample.labels["le"]), sample.value))
    cumulative.sort()
    buckets, below = [], 0.0
    for bound, count in cumulative:
        buckets.append((bound, int(count - below)))
        below = count
    return buckets


@dataclass(frozen=True, slots=True)
class ListenerView:
    """The LISTEN session as the page shows it."""

    state: State
    proven: bool
    problem: str | None
    reconnects: int

    @classmethod
    def of(cls, listener: Listener) -> ListenerView:
        """``listener`` now."""
        reconnects = max(0, listener.connections - 1)
        return cls(listener.state, listener.proven, listener.problem, reconnects)


@dataclass(frozen=True, slots=True)
class PairView:
    """One pair of this replica as the page shows it, read at one moment."""

    replica_id: str
    mode: str
    ready: bool
    reason: str
    listener: ListenerView | None
    polling: bool
    trigger: str
    live: frozenset[str]
    # Jobs the work queue holds: waiting for their deadline or in flight.
    deadlines: int
    # (upper bound in seconds, count) of the lateness histogram: see lateness_buckets.
    lateness: tuple[tuple[float, int], ...]
    # What this replica's claims settled last, oldest first.
    recent: tuple[Settled, ...]
