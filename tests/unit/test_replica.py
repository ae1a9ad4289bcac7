"""reactor.runtime.replica: one process, one identity and one LISTEN session for every pair it
serves."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reactor import db
from reactor.install.mapping import REFERENCE
from reactor.runtime.replica import Replica
from reactor.settings.config import Settings
from reactor.settings.pairs import Pair

pytestmark = pytest.mark.anyio

# Never connected to: building a replica opens nothing.
DSN = "postgresql://app@db.invalid/app"


def _served(replica: Replica, settings: Settings, *schemas: str) -> list[Pair]:
    pool = db.make_pool(DSN, max_size=1)
    served = [Pair.of(replace(REFERENCE, reactor_schema=schema), settings) for schema in schemas]
    for pair in served:
        replica.add(pair, db.Database.pooled(pair.install, pool))
    return served


async def test_every_pair_runs_under_the_replicas_one_identity() -> None:
    settings = Settings(database_url=DSN, http_addr=None)
    replica = Replica(settings)
    _served(replica, settings, "reactor", "second_reactor")
    assert list(replica.reactors) == ["reactor", "second_reactor"]
    assert {r.replica_id for r in replica.reactors.values()} == {replica.replica_id}
    assert {r.membership.me for r in replica.reactors.values()} == {replica.replica_id}
    # Each pair sees who is live from its own heartbeats: a view of its own.
    first, second = replica.reactors.values()
    assert first.roster is not second.roster
    # Another process is another replica.
    assert Replica(settings).replica_id != replica.replica_id


async def test_the_pairs_share_the_replicas_listen_session() -> None:
    settings = Settings(database_url=DSN, http_addr=None)
    replica = Replica(settings)
    _served(replica, settings, "reactor", "second_reactor")
    listener = replica.listener
    assert listener is not None
    assert all(r.listener is listener for r in replica.reactors.values())
    assert listener.subscribers == [r.subscriber for r in replica.reactors.values()]
    # Stopping every pair leaves the session to end: no pair is subscribed to it any more.
    replica.stop()
    assert replica.stopping
    assert listener.subscribers == []


async def test_a_polling_replica_opens_no_listen_session() -> None:
    settings = Settings(database_url=DSN, http_addr=None, mode="poll")
    replica = Replica(settings)
    _served(replica, settings, "reactor")
    assert replica.listener is None
    assert replica.only is replica.reactors["reactor"]
    assert replica.only.listener is None
