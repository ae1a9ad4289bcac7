"""The replica's health check: what the ``health`` query is sent, and the checks of several
pairs in one statement on the pool they share (:meth:`.queries.Database.health` runs one pair's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg.rows import class_row, dict_row

from reactor.core.ownership import replicas_channel
from reactor.db.pool import own_check
from reactor.db.rows import Health
from reactor.install import Install, sql

if TYPE_CHECKING:
    from reactor.db.queries import Database

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
    statements cannot write (see :meth:`Database.health`)."""
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


async def health_of_pairs(
    asks: Sequence[tuple[Database, dict[str, Any]]], *, lock_timeout: float | None = None
) -> list[Health]:
    """The ``health`` query of each (pair's queries, their :func:`health_params`) of ``asks``,
    in one statement where the first pair's queries run (the pool the pairs share): one
    :class:`Health` for each, in order. One pair's is its own statement, as
    :meth:`Database.health` runs it. ``lock_timeout``: see :meth:`Database.run`."""
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
