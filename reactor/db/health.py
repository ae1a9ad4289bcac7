"""The replica's health check and heartbeat: what the ``health`` query is sent, one pair's
check (:meth:`HeartbeatQueries.health`), and the checks of several pairs in one statement on the
pool they share; a replica's leaving, and the notifications it sends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.rows import class_row, dict_row, tuple_row

from reactor.core.ownership import replicas_channel
from reactor.db.named import NamedQueries
from reactor.db.pool import own_check
from reactor.db.rows import Health
from reactor.install import Install, sql

# Past this share of the NOTIFY queue, the app's commits are at risk (they fail when it is full),
# and the job trigger stops notifying (migration 0008): the reactors poll instead.
QUEUE_WARNING = 0.5


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """Who checks, and what the ``health`` query needs besides the grace and the channel."""

    replica: str  # this replica's heartbeat row
    liveness: float  # seconds within which a heartbeat counts as live
    retention: float  # REACTOR_HOOK_RETENTION_SECONDS, for hooks_expired


def health_params(
    install: Install,
    grace: float,
    check: HealthCheck,
    probe: str | None = None,
    *,
    own_session: bool = False,
    holding: bool = True,
    write_error: str | None = None,
    session_pid: int | None = None,
) -> dict[str, Any]:
    """The parameters of the ``health`` query; ``own_session`` when it runs on the replica's
    LISTEN connection, ``holding`` once it holds its share, ``write_error`` while its record
    statements cannot write (see :meth:`HeartbeatQueries.health`)."""
    return {
        "own_session": own_session,
        "session_pid": session_pid,
        "holding": holding,
        "write_error": write_error,
        "grace": grace,
        "replica": check.replica,
        "liveness": check.liveness,
        "retention": check.retention,
        "channel": install.channel,
        "replicas_channel": replicas_channel(install.schema, install.channel),
        "probe": probe,
    }


class HeartbeatQueries(NamedQueries):
    """The replica's periodic check and heartbeat, its leaving, and its notifications."""

    async def health(
        self,
        check: HealthCheck,
        *,
        probe: str | None = None,
        own_session: bool = False,
        session_pid: int | None = None,
        holding: bool = True,
        write_error: str | None = None,
    ) -> Health:
        """The replica's periodic check, and its heartbeat; see the ``health`` query.

        ``probe``: a payload to notify on the install's channel in the same round trip.
        ``own_session`` when this runs on the replica's LISTEN connection, a session of its
        own: the heartbeat names it, as it names ``session_pid`` (the replica's proven LISTEN
        session) from the pool. ``holding`` False: the replica has not read its share yet,
        and writes no heartbeat, so nobody counts it as an owner. ``write_error``: what its
        record statements fail with while they cannot write, for `reactor status`.
        """
        params = health_params(
            self.install,
            self.grace,
            check,
            probe,
            own_session=own_session,
            holding=holding,
            write_error=write_error,
            session_pid=session_pid,
        )
        return (await self.run("health", params, class_row(Health)))[0]

    async def leave(self, replica: str) -> None:
        """Drop ``replica``'s heartbeat and tell the replicas listening on the channel: they
        take its jobs over at once (the others at their next check)."""
        install = self.install
        params = {"replica": replica, "channel": replicas_channel(install.schema, install.channel)}
        await self.run("replica_leave", params, tuple_row)

    async def notify(self, payload: str, channel: str | None = None) -> None:
        """Send one notification, on the install's channel unless ``channel`` is given."""
        await self.on.fetch(
            "SELECT pg_notify(%s, %s)", (channel or self.install.channel, payload), tuple_row
        )


async def health_of_pairs(
    asks: Sequence[tuple[NamedQueries, dict[str, Any]]], *, lock_timeout: float | None = None
) -> list[Health]:
    """The ``health`` query of each (pair's queries, their :func:`health_params`) of ``asks``,
    in one statement where the first pair's queries run (the pool the pairs share): one
    :class:`Health` for each, in order. One pair's is its own statement, as
    :meth:`HeartbeatQueries.health` runs it. ``lock_timeout``: see :meth:`NamedQueries.run`."""
    first, params = asks[0]
    if len(asks) == 1:
        return await own_check(
            lambda: first.run("health", params, class_row(Health), lock_timeout=lock_timeout)
        )
    query = sql.union_query("health", tuple(database.install.mapping for database, _ in asks))
    merged = {
        sql.part_name(name, index): value
        for index, (_, params) in enumerate(asks)
        for name, value in params.items()
    }
    rows = await own_check(
        lambda: first.on.fetch(query, merged, dict_row, lock_timeout=lock_timeout)
    )
    return [Health(**{key: value for key, value in row.items() if key != "part"}) for row in rows]
