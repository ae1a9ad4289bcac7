"""One pair's side of the replica's LISTEN session (:class:`reactor.listener.Listener`): its
channels, what it is told, its duties, and whether its statements fail there on their own."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg

from reactor import db, logs
from reactor.cadence import Scheduler
from reactor.hints import LOG_INTERVAL, Tally
from reactor.metrics import Metrics
from reactor.ownership import share_channels

log = logging.getLogger(__name__)

# The poll a pair runs on the listener's proven connection, as the pool would otherwise.
Poll = Callable[[db.AnyConnection], Awaitable[None]]


@dataclass(eq=False)
class Subscriber:
    """One pair's side of the LISTEN session: its channels, what it is told, and its duties.

    ``ask`` gives the pair's health check parameters for this session (with the probe payload
    when this pair's part sends it); ``saw`` takes the check's :class:`~reactor.db.Health` and
    when it was sent (the listener's clock).
    """

    database: db.Database
    metrics: Metrics
    schedule: Scheduler
    on_job: Callable[[str, float | None], None]
    on_listening: Callable[[], None]
    ask: Callable[[str | None], dict[str, Any]]
    saw: Callable[[db.Health, float], None]
    poll: Poll
    on_left: Callable[[str], None] = lambda replica: None
    on_joined: Callable[[str], None] = lambda replica: None
    # True until the replica holds its share: a duty hastened then (its first heartbeat,
    # which tells the others it joined) must not wait out a whole probe interval here.
    settling: Callable[[], bool] = lambda: False
    # The shares of the jobs whose channels to LISTEN on: those this replica owns, when the
    # trigger was installed with --spread and notifies each share on a channel of its own.
    shares: Callable[[], frozenset[int]] = frozenset
    # The shares LISTENed on now.
    listening: frozenset[int] = frozenset()
    # The pair's name, for the lines logged on its behalf; None in a replica of one pair.
    name: str | None = None
    # True while this pair's statements fail on this session (its tables are broken): its
    # duties go to the pool, and a check there that succeeds brings them back (readmit).
    benched: bool = False
    # The payloads that named nothing, logged at most once per interval with their count: any
    # role that can connect can send them, as many as it likes.
    garbage: Tally = field(default_factory=Tally)

    def __post_init__(self) -> None:
        # Read once: every notification is parsed by them. A channel too long to take a
        # share's suffix has none: no trigger can spread over it.
        self.channel = self.database.install.channel
        self.id_type = self.database.install.id_type
        self.share_channels = share_channels(self.channel) or ()

    def channels(self, shares: frozenset[int]) -> list[str]:
        """The channels of ``shares``."""
        return [self.share_channels[share] for share in sorted(shares)]

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

    def owned(self) -> frozenset[int]:
        """The shares to LISTEN on now (none when the channel cannot take a share's suffix)."""
        return self.shares() if self.share_channels else frozenset()


def statement_failed(error: BaseException, conn: db.AnyConnection) -> bool:
    # A statement failed on its own (a table or a grant gone), the session is fine: it costs
    # only the pair whose statement it was. Anything else (the connection lost, a statement
    # cut short by its bound) makes the session suspect.
    return (
        isinstance(error, psycopg.Error)
        and not isinstance(error, psycopg.OperationalError)
        and not conn.closed
        and not conn.broken
    )


@contextlib.contextmanager
def on_behalf(subscriber: Subscriber) -> Iterator[None]:
    # What runs here is the pair's: its lines name it (see reactor.logs).
    token = logs.PAIR.set(subscriber.name) if subscriber.name is not None else None
    try:
        yield
    finally:
        if token is not None:
            logs.PAIR.reset(token)


async def check_pairs(
    conn: db.AnyConnection,
    due: list[Subscriber],
    probe: str | None,
    *,
    sent: float,
    isolate: bool,
) -> tuple[bool, dict[Subscriber, BaseException]]:
    """The health check of the pairs ``due``, in one statement on ``conn``, sent at ``sent``;
    the first pair's part sends ``probe``. Returns whether the probe went out, and the pairs
    whose own statements failed: with ``isolate``, when one pair's part fails the statement on
    its own, each part runs alone."""
    asks = [
        (subscriber.database, subscriber.ask(probe if index == 0 else None))
        for index, subscriber in enumerate(due)
    ]
    try:
        results: list[db.Health | BaseException] = list(await db.health_of_pairs(conn, asks))
    except psycopg.Error as error:
        if not (isolate and statement_failed(error, conn)):
            raise
        results = []
        for ask in asks:
            try:
                results.extend(await db.health_of_pairs(conn, [ask]))
            except psycopg.Error as alone:
                if not statement_failed(alone, conn):
                    raise
                results.append(alone)
    failed: dict[Subscriber, BaseException] = {}
    probes = 0
    for subscriber, result in zip(due, results, strict=True):
        if isinstance(result, BaseException):
            failed[subscriber] = result
        else:
            probes += result.probes_sent
            with on_behalf(subscriber):
                subscriber.saw(result, sent)
    return probes > 0, failed
