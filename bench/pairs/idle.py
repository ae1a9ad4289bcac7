"""What one setup (one process, or a fleet per pair) costs its database while idle."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import anyio

from bench.conn import connect, dbname
from bench.idle import BY_QUERY
from bench.server import Server
from reactor.testing import (
    Reactor,
)

CONNECTIONS = """
SELECT datname, application_name, count(*)::int
  FROM pg_stat_activity
 WHERE backend_type = 'client backend' AND datname = ANY(%s)
 GROUP BY 1, 2
"""


@dataclass
class Idle:
    """What one setup (one process, or the fleet) cost its database over the window."""

    statements: dict[str, int]
    pool_checks: int
    connections: dict[str, int]  # by application_name
    minutes: float

    @property
    def statements_per_min(self) -> float:
        """Statements per minute, the pools' checks included."""
        return (sum(self.statements.values()) + self.pool_checks) / self.minutes

    @property
    def connection_count(self) -> int:
        """Client connections open to the database at the end of the window."""
        return sum(self.connections.values())

    def health_checks_per_min(self) -> float:
        """The health check's statements per minute (the one that writes the heartbeat)."""
        calls = sum(n for query, n in self.statements.items() if _is_health_check(query))
        return calls / self.minutes


async def count_idle(
    server: Server,
    dsns: dict[str, str],
    reactors: dict[str, list[Reactor]],
    checks: Counter[int],
    window: float,
) -> dict[str, Idle]:
    """Each setup's statements, pool checks and connections over ``window`` seconds.

    ``reactors`` name each setup's pools (one reactor per pool)."""
    names = {who: dbname(dsn) for who, dsn in dsns.items()}
    async with await connect(server.admin_dsn, "count") as admin:
        await admin.execute("SELECT pg_stat_statements_reset()")
        checks.clear()
        started = time.monotonic()
        await anyio.sleep(window)
        minutes = (time.monotonic() - started) / 60
        pool_checks = {
            who: sum(checks[id(r.database.pool)] for r in found) for who, found in reactors.items()
        }
        cur = await admin.execute(CONNECTIONS, (list(names.values()),))
        connections: dict[str, dict[str, int]] = {who: {} for who in names}
        by_name = {name: who for who, name in names.items()}
        for datname, application, count in await cur.fetchall():
            connections[by_name[datname]][application or "-"] = int(count)
        statements = {}
        for who, name in names.items():
            cur = await admin.execute(BY_QUERY, (name,))
            statements[who] = {query: int(calls) for query, calls in await cur.fetchall()}
    return {
        who: Idle(statements[who], pool_checks[who], connections[who], minutes) for who in names
    }


def _is_health_check(query: str) -> bool:
    return "INSERT INTO" in query and ".replicas (id, session_pid)" in query
