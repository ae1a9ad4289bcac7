"""A replica of two pairs checks their health in one statement per interval, and a pair whose
objects are dropped while it runs does not stop the other's checks or its readiness."""

from __future__ import annotations

import re
import tomllib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from reactor import db
from reactor.install import mapping, mapping_file
from reactor.runtime.replica import Replica, open_replica
from reactor.runtime.service import Reactor
from reactor.settings.config import Settings
from reactor.settings.pairs import Pair
from tests.integration.support import Counting
from tests.polling import eventually

pytestmark = pytest.mark.anyio

MAPPINGS = Path(__file__).parent.parent / "mappings"
SECOND_SCHEMA = "second_reactor"
SCHEMAS = ("reactor", SECOND_SCHEMA)
PROBE = 0.4


def checks_both(query: str) -> bool:
    """Whether ``query`` writes the heartbeat of both pairs: the check of both in one."""
    return all(re.search(rf"(?<![\w.]){schema}\.replicas", query) for schema in SCHEMAS)


def heartbeat(url: str, schema: str, reactor: Reactor) -> object:
    """The replica's last heartbeat in the pair of ``schema``; None before its first."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT heartbeat_at FROM {schema}.replicas WHERE id = %s", (reactor.replica_id,)
        ).fetchone()
    return None if row is None else row[0]


async def next_heartbeat(url: str, schema: str, reactor: Reactor) -> None:
    """Wait for the replica's next heartbeat in the pair of ``schema``."""
    seen = heartbeat(url, schema, reactor)
    await eventually(lambda: heartbeat(url, schema, reactor) != seen, timeout=4 * PROBE + 2)


async def stays_ready(url: str, reactor: Reactor) -> None:
    """The reference pair's checks go on while the other's fail: its next three heartbeats,
    each one answered, and it ready after each."""
    for _ in range(3):
        await next_heartbeat(url, "reactor", reactor)
        assert reactor.vitals.database_ok is True
        assert reactor.health() == (True, True, "ok")


@asynccontextmanager
async def two_pairs(
    url: str, seen: list[str], waits: list[float | None] | None = None
) -> AsyncIterator[Replica]:
    """A running replica of the reference pair and a second one, in one database; every
    statement its pairs send through the pool is noted in ``seen``, and its lock_timeout (None:
    the session's) in ``waits``."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute((MAPPINGS / "second.sql").read_text())
    shape = mapping_file.parse(
        {"reactor_schema": SECOND_SCHEMA, **tomllib.loads((MAPPINGS / "second.toml").read_text())},
        source="second.toml",
    )
    async with await db.connect(url, "test") as migrating:
        reference = (await db.migrate(migrating, mapping.REFERENCE)).install
        second = (await db.migrate(migrating, shape)).install

    noted = [] if waits is None else waits

    def counted(database: db.Database) -> db.Database:
        assert isinstance(database.on, db.Pooled)
        return replace(database, on=Counting(database.on, seen, waits=noted))

    settings = Settings(
        database_url=url,
        grace=0.6,
        scan_interval=30.0,
        probe_interval=PROBE,
        probe_timeout=PROBE,
        reconcile_interval=0,  # its pass is pool work of its own
        http_addr=None,
    )
    pairs = [Pair(reference, settings), Pair(second, replace(settings, channel=None))]
    async with (
        open_replica(settings, pairs, instrument=counted) as replica,
        replica.running(),
    ):
        yield replica


def quiet(replica: Replica) -> bool:
    listener = replica.listener
    return (
        listener is not None
        and listener.proven
        and all(r.holding and not r.scan_pending for r in replica.reactors.values())
    )


@asynccontextmanager
async def settled_pairs(
    url: str, seen: list[str]
) -> AsyncIterator[tuple[Replica, Reactor, Reactor]]:
    """:func:`two_pairs` once its start's work is over: the replica, the reference pair's
    reactor and the second's."""
    async with two_pairs(url, seen) as replica:
        await eventually(lambda: quiet(replica))
        yield replica, replica.reactors["reactor"], replica.reactors[SECOND_SCHEMA]


async def test_two_pairs_send_one_health_statement_per_interval(database_url: str) -> None:
    seen: list[str] = []
    waits: list[float | None] = []
    async with two_pairs(database_url, seen, waits) as replica:
        first = replica.reactors["reactor"]
        await eventually(lambda: quiet(replica))
        await next_heartbeat(database_url, "reactor", first)
        # An interval with nothing but the check: the start's work is over.
        for _ in range(20):
            seen.clear()
            await next_heartbeat(database_url, "reactor", first)
            if len(seen) == 1:
                break
        seen.clear()
        waits.clear()
        for _ in range(5):
            await next_heartbeat(database_url, "reactor", first)
        # One statement per interval, each both pairs' check: the heartbeat of each.
        assert len(seen) in (5, 6), [query[:60] for query in seen]
        assert all(checks_both(query) for query in seen), [query[:60] for query in seen]
        # Sent as it is: not in a transaction of its own with a lock_timeout set first.
        assert waits == [None] * len(seen)
        assert replica.checks is not None
        assert replica.health() == (True, True, "ok")


async def test_a_pair_whose_schema_is_dropped_leaves_the_other_checked_and_ready(
    database_url: str,
) -> None:
    seen: list[str] = []
    async with settled_pairs(database_url, seen) as (replica, first, second):
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {SECOND_SCHEMA} CASCADE")
        await eventually(lambda: second.vitals.database_ok is False, timeout=4 * PROBE + 2)
        checks = replica.checks
        assert checks is not None
        await eventually(lambda: second in checks.apart, timeout=4 * PROBE + 2)
        await stays_ready(database_url, first)
        alive, ready, reason = replica.health()
        assert (alive, ready) == (True, False)
        assert reason.startswith(f"pair {SECOND_SCHEMA}: "), reason
        # The broken pair checks alone, the other on its own: no combined statement fails
        # every round.
        seen.clear()
        await next_heartbeat(database_url, "reactor", first)
        await next_heartbeat(database_url, "reactor", first)
        assert seen
        assert not any(checks_both(query) for query in seen)


async def test_a_pair_whose_table_is_locked_leaves_the_other_checked_and_ready(
    database_url: str,
) -> None:
    async with settled_pairs(database_url, []) as (replica, first, second):
        checks = replica.checks
        assert checks is not None
        with psycopg.connect(database_url) as holder:
            # Held until the block ends: every statement that reads the table waits.
            holder.execute('LOCK TABLE app."Job" IN ACCESS EXCLUSIVE MODE')
            await eventually(lambda: second in checks.apart, timeout=4 * PROBE + 2)
            await stays_ready(database_url, first)
            holder.rollback()
        # Let go, it answers alone and is checked with the other again.
        await eventually(lambda: second not in checks.apart, timeout=4 * PROBE + 2)
        await eventually(lambda: second.vitals.database_ok is True, timeout=4 * PROBE + 2)
