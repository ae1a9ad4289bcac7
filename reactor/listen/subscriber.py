"""One pair's side of the replica's LISTEN session (:class:`reactor.listen.listener.Listener`): its
channels and what it is told on them."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from reactor import db
from reactor.core.clock import Clock
from reactor.core.ownership import replicas_channel, share_channels
from reactor.core.payload import JobNotified, Rang, ReplicaSaid, Said
from reactor.errors import ConfigError
from reactor.listen.hints import LOG_INTERVAL_S, ThrottledLog, Verifier
from reactor.telemetry import logs
from reactor.telemetry.metrics import Metrics

log = logging.getLogger(__name__)


class Hearing(Protocol):
    """What a pair does with what its LISTEN session tells it, beyond the jobs and the replicas
    named (those go to its :class:`~reactor.listen.hints.Verifier`):
    :class:`reactor.runtime.service.Reactor`."""

    def listening(self) -> None:
        """The pair's channels (or some of its shares') are LISTENed on now: re-read what was
        notified before."""
        ...

    def proven(self) -> None:
        """A probe proved a new session: the heartbeat should name it."""
        ...

    def changed(self) -> None:
        """The session changed state (lost, degraded, proven)."""
        ...

    def rang(self) -> None:
        """A replica says it rang the pair's doorbell awake."""
        ...

    def notified(self) -> None:
        """A job was notified (the doorbell counts them)."""
        ...

    def shares(self) -> frozenset[int]:
        """The shares whose channels to LISTEN on: those this replica owns, when the trigger
        was installed with --spread and notifies each share on a channel of its own."""
        ...


@dataclass(eq=False)
class Subscriber:
    """One pair's side of the LISTEN session: its channels, and what it is told on them. The
    jobs and the replicas named go to ``verifier``; the rest to ``pair``."""

    database: db.Database
    metrics: Metrics
    verifier: Verifier
    pair: Hearing
    # The shares LISTENed on now.
    listening: frozenset[int] = frozenset()
    # The pair's name, for the lines logged on its behalf; None in a replica of one pair.
    name: str | None = None
    # The payloads that named nothing, logged at most once per interval with their count: any
    # role that can connect can send them, as many as it likes.
    garbage: ThrottledLog = field(default_factory=ThrottledLog)

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
        return self.pair.shares() if self.share_channels else frozenset()

    def job(self, said: JobNotified) -> None:
        """A notification on the pair's channel named a job."""
        self.metrics.notified["accepted"].inc()
        self.verifier.heard(said.job)
        self.pair.notified()

    def told(self, said: Said | None, payload: str, now: float) -> None:
        """What ``payload`` said on the membership channel (or, from a replica of an earlier
        release, on the main one), at ``now``."""
        if isinstance(said, ReplicaSaid):
            self.metrics.notified["left" if said.left else "joined"].inc()
            self.verifier.replica(said.replica, left=said.left)
        elif isinstance(said, Rang):
            # The pairs of one reactor schema share the membership channel: the bell is the
            # one of the pair whose channel it names.
            if said.channel == self.channel:
                self.pair.rang()
        else:
            self.rejected(payload, now)

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
                    "interval_s": LOG_INTERVAL_S,
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


def hand_on(
    subscriber: Subscriber | None,
    members: list[Subscriber],
    said: Said | None,
    payload: str,
    clock: Clock,
) -> None:
    """Hand what a notification said (not a probe) to the pairs its channel is for (see
    :meth:`Routes.of`)."""
    if members:
        # The membership channel carries nothing else: anything else there is a stranger's.
        for one in members:
            with on_behalf(one):
                one.told(said, payload, clock.now())
        return
    if subscriber is None:
        return  # a channel of a pair that has stopped
    with on_behalf(subscriber):
        if isinstance(said, JobNotified):
            subscriber.job(said)
        else:
            # A replica of an earlier release says it joined or left on the main channel.
            subscriber.told(said, payload, clock.now())


@contextlib.contextmanager
def on_behalf(subscriber: Subscriber) -> Iterator[None]:
    # What runs here is the pair's: its lines name it (see reactor.telemetry.logs).
    token = logs.PAIR.set(subscriber.name) if subscriber.name is not None else None
    try:
        yield
    finally:
        if token is not None:
            logs.PAIR.reset(token)
