"""`reactor migrate --spread`: the job trigger notifies each share of the jobs on a channel of its
own, and each replica LISTENs on the shares it owns, so it hears its own jobs and no others."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from reactor import db
from reactor.core.ownership import SHARES, share_channels, share_of, share_sql
from reactor.install.mapping import REFERENCE
from reactor.runtime.service import Reactor
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.helpers import finish, new_job, run_row, worker_writes
from tests.integration.conftest import StartReactor
from tests.integration.support import hints_heard, worker_lateness
from tests.polling import eventually

pytestmark = pytest.mark.anyio

CHANNEL = "analysis_jobs_terminal"
GRACE = 1.0


async def _spread(database_url: str, spread: bool = True) -> None:
    async with await db.connect(database_url, "test") as conn:
        await db.migrate(conn, REFERENCE.in_public(), spread=spread)


def _settled(*replicas: Reactor) -> bool:
    """Every replica sees them all, and LISTENs on exactly the shares it owns."""
    return all(
        len(r.membership.live) == len(replicas)
        and r.listener is not None
        and r.listener.proven
        and r.listener.hears == r.membership.shares
        for r in replicas
    )


def test_the_trigger_and_the_reactor_put_every_id_in_the_same_share(database_url: str) -> None:
    ids = {
        "uuid": [str(uuid.uuid4()) for _ in range(50)],
        "bigint": [str(n) for n in (0, 1, -1, 42, 2**63 - 1, -(2**63), *range(1000, 1040))],
        "text": ["", "a", "job 1", "Łódź", "東京", "emoji 🎉", "x" * 300, *map(str, range(40))],
    }
    with psycopg.connect(database_url, autocommit=True) as conn:
        for type_name, values in ids.items():
            rows = conn.execute(
                f"SELECT v.id::text, {share_sql('v.id').replace('%', '%%')} "
                f"FROM unnest(%s::text[]) AS t(x), LATERAL (SELECT t.x::{type_name} AS id) v",
                (values,),
            ).fetchall()
            assert {text: share for text, share in rows} == {v: share_of(v) for v in values}, (
                type_name
            )


async def test_the_trigger_notifies_a_job_on_its_shares_channel(database_url: str) -> None:
    await _spread(database_url)
    channels = share_channels(CHANNEL)
    assert channels is not None
    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        psycopg.connect(database_url, autocommit=True) as listener,
    ):
        listener.execute("; ".join(f'LISTEN "{c}"' for c in (CHANNEL, *channels)))
        jobs = [new_job(conn)[0] for _ in range(20)]
        for job in jobs:
            finish(conn, job)
        heard = {n.payload.split("@")[0]: n.channel for n in listener.notifies(timeout=2)}
    assert heard == {str(job): channels[share_of(str(job))] for job in jobs}


async def test_each_replica_hears_only_the_jobs_it_owns(
    database_url: str, start_reactor: StartReactor
) -> None:
    await _spread(database_url)
    settings = {"grace": GRACE, "probe_interval": 1.0, "probe_timeout": 1.0}
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(**settings) as r1, start_reactor(**settings) as r2:
            await eventually(lambda: _settled(r1, r2))
            assert r1.membership.shares | r2.membership.shares == frozenset(range(SHARES))
            assert not r1.membership.shares & r2.membership.shares
            before = [hints_heard(r) for r in (r1, r2)]
            jobs = [str(new_job(conn)[0]) for _ in range(40)]
            for job in jobs:
                finish(conn, uuid.UUID(job))
            await eventually(lambda: len(worker_writes(conn)) == len(jobs))
            heard = [hints_heard(r) - b for r, b in zip((r1, r2), before, strict=True)]
            owned = [sum(r.membership.owns(job) for job in jobs) for r in (r1, r2)]
    assert heard == owned
    assert all(owned)


async def test_the_replicas_follow_a_migrate_that_spreads_or_stops_spreading(
    database_url: str, start_reactor: StartReactor
) -> None:
    settings = {"grace": GRACE, "probe_interval": 0.3, "probe_timeout": 1.0}
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with start_reactor(**settings) as reactor:
            listener = reactor.listener
            assert listener is not None
            await eventually(lambda: listener.proven and reactor.holding)
            # The trigger does not spread: the main channel carries every job.
            assert listener.hears == frozenset()
            for spread in (True, False):
                await _spread(database_url, spread)
                expected = frozenset(range(SHARES)) if spread else frozenset()
                # Seen at the next check, a probe interval on.
                await eventually(lambda: listener.hears == expected, timeout=3.0)  # noqa: B023
                job, run = new_job(conn)
                finish(conn, job)
                await eventually(lambda: run_row(conn, run) is not None)  # noqa: B023
        late = worker_lateness(conn, GRACE)
    assert len(late) == 2
    assert all(0 <= x < 0.5 for x in late), late


def test_migrate_refuses_to_spread_over_a_channel_with_no_room_for_a_share(
    database_url: str,
) -> None:
    long_channel = "c" * 60  # a share's channel would be 64 bytes
    env = {**reactor_env(database_url), "REACTOR_CHANNEL": long_channel}
    done = run_reactor("migrate", "--spread", env=env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"reactor: the channel {long_channel!r} is too long for --spread: a share's channel "
        f"appends '.{SHARES - 1}', and a channel name is at most 63 bytes; set a shorter "
        "REACTOR_CHANNEL, or migrate with --no-spread"
    ]
    with psycopg.connect(database_url, autocommit=True) as conn:
        # Nothing changed: the trigger still notifies the channel it was installed with.
        assert conn.execute(
            "SELECT encode(tgargs, 'escape') FROM pg_trigger WHERE tgname = 'reactor_job_update'"
        ).fetchone() == ("analysis_jobs_terminal\\000\\000",)
