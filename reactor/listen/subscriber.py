"""One pair's side of the replica's LISTEN session (:class:`reactor.listen.listener.Listener`): its
channels and what it is told on them."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from reactor import db
from reactor.core.ownership import replicas_channel, share_channels
from reactor.errors import ConfigError
from reactor.listen.hints import LOG_INTERVAL, Tally
from reactor.telemetry import logs
from reactor.telemetry.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Subscriber:
    """One pair's side of the LISTEN session: its channels, and what it is told on them.

    ``on_job`` takes a job hint (its id, its updated_at when sent); ``on_listening`` is called
    once the pair's channels (or some of its shares') are LISTENed on, to re-read what was
    notified before; ``on_replica`` takes a replica said to have left (True) or joined;
    ``on_rang`` when a replica says it rang the pair's doorbell awake; ``on_proven`` is called
    once a probe proved a new session (the heartbeat should name it);
    ``on_changed`` whenever the session changes state (lost, degraded, proven).
    """

    database: db.Database
    metrics: Metrics
    on_job: Callable[[str, float | None], None]
    on_listening: Callable[[], None]
    on_replica: Callable[[str, bool], None] = lambda replica, left: None
    on_rang: Callable[[], None] = lambda: None
    on_proven: Callable[[], None] = lambda: None
    on_changed: Callable[[], None] = lambda: None
    # The shares of the jobs whose channels to LISTEN on: those this replica owns, when the
    # trigger was installed with --spread and notifies each share on a channel of its own.
    shares: Callable[[], frozenset[int]] = frozenset
    # The shares LISTENed on now.
    listening: frozenset[int] = frozenset()
    # The pair's name, for the lines logged on its behalf; None in a replica of one pair.
    name: str | None = None
    # The payloads that named nothing, logged at most once per interval with their count: any
    # role that can connect can send them, as many as it likes.
    garbage: Tally = field(default_factory=Tally)

    def __post_init__(self) -> None:
        # Read once: every notification is parsed by them. A channel too long to take a
        # share's suffix has none: no trigger can spread over it.
        install = self.database.install
        self.channel = install.channel
        self.id_type = install.id_type
        self.share_channels = share_channels(self.channel) or ()
        self.replicas_channel = replicas_channel(install.schema, self.channel)

    def channels(self, shares: frozenset[int]) -> list[str]:
        """The channels of ``shares``."""
        return [self.share_channels[share] for share in sorted(shares)]

    def owned(self) -> frozenset[int]:
        """The shares to LISTEN on now (none when the channel cannot take a share's suffix)."""
        return self.shares() if self.share_channels else frozenset()

    def rejected(self, payload: str, now: float) -> None:
        """``payload`` came on this pair's channel at ``now`` and names nothing."""
        self.metrics.notified["rejected"].inc()
        self._tell_rejected(self.garbage.note(now), payload)

    def report(self, now: float) -> None:
        """Log the count of payloads that named nothing, once its interval has passed."""
        self._tell_rejected(self.garbage.due(now), None)

    def _tell_rejected(self, count: int, payload: str | None) -> None:
        if count:
            log.warning(
                "ignored notifications that name no job",
                extra={
                    "channel": self.channel,
                    "count": count,
                    "interval_s": LOG_INTERVAL,
                    # The one that made the line, cut short: the sender chose it.
                    "payload": None if payload is None else payload[:80],
                },
            )


class Routes:
    """Which pair a channel's notifications go to: a pair's main channel and its shares' (one
    pair each), and its membership channel (the pairs of one reactor schema share it); pure."""

    def __init__(self) -> None:
        self.subscribers: list[Subscriber] = []
        self._jobs: dict[str, Subscriber] = {}
        self._members: dict[str, list[Subscriber]] = {}

    def add(self, subscriber: Subscriber) -> None:
        """Route ``subscriber``'s channels to it."""
        if subscriber.channel in self._jobs:
            raise ConfigError(f"two pairs notify one channel: {subscriber.channel}")
        self.subscribers.append(subscriber)
        for channel in (subscriber.channel, *subscriber.share_channels):
            self._jobs[channel] = subscriber
        if subscriber.replicas_channel != subscriber.channel:
            self._members.setdefault(subscriber.replicas_channel, []).append(subscriber)

    def remove(self, subscriber: Subscriber) -> bool:
        """Route nothing more to ``subscriber``; False when it was not routed to."""
        if subscriber not in self.subscribers:
            return False
        self.subscribers.remove(subscriber)
        self._jobs = {ch: one for ch, one in self._jobs.items() if one is not subscriber}
        for members in self._members.values():
            if subscriber in members:
                members.remove(subscriber)
        return True

    def main(self) -> frozenset[str]:
        """The channels LISTENed on whatever the session's state: each pair's main one and its
        membership channel."""
        members = (channel for channel, pairs in self._members.items() if pairs)
        return frozenset({s.channel for s in self.subscribers}.union(members))

    def shares(self) -> frozenset[str]:
        """The channels of the shares each pair owns now."""
        return frozenset(ch for s in self.subscribers for ch in s.channels(s.owned()))

    def of(self, channel: str | None) -> tuple[Subscriber | None, list[Subscriber]]:
        """The pair whose jobs ``channel`` carries (None: no pair's), and the pairs whose
        membership it carries (none: it is no membership channel). A notification without a
        channel goes to the first pair."""
        if channel is None:
            return next(iter(self.subscribers), None), []
        return self._jobs.get(channel), self._members.get(channel, [])


@contextlib.contextmanager
def on_behalf(subscriber: Subscriber) -> Iterator[None]:
    # What runs here is the pair's: its lines name it (see reactor.telemetry.logs).
    token = logs.PAIR.set(subscriber.name) if subscriber.name is not None else None
    try:
        yield
    finally:
        if token is not None:
            logs.PAIR.reset(token)
