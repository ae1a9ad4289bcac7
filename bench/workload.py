"""Playing the app and running the reactor in-process: jobs, the worker, browser tabs, replicas.

The worker finishes jobs at a steady rate on one connection; tabs save a share of them after a
random delay inside the grace window; reactor replicas run in this process exactly as
``reactor demo`` runs them, each with its own pool and LISTEN connection.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from psycopg_pool import AsyncConnectionPool

from bench.common import Conn, connect, scalar
from reactor import db
from reactor.config import Settings
from reactor.service import POOL_SIZE, Reactor

# The worker marking a job terminal; the notify trigger fires on this transition.
FINISH = (
    "UPDATE analysis_jobs SET status = 'complete', results = %(results)s, updated_at = now() "
    "WHERE id = %(id)s"
)

# The worker of the eager design writes the run itself at finalize, in the same transaction;
# it never overwrites a client row.
EAGER_WRITE = """
INSERT INTO analysis_runs AS r (id, job_id, doc_html, results, saved_by)
SELECT run_id, id, doc_html, results, 'worker' FROM analysis_jobs WHERE id = %(id)s
ON CONFLICT (id) DO UPDATE SET job_id = EXCLUDED.job_id, doc_html = EXCLUDED.doc_html,
    results = EXCLUDED.results, saved_by = 'worker', updated_at = now()
 WHERE coalesce(r.saved_by, 'client') = 'worker'
"""

# The browser tab's save: the upsert that always wins (DESIGN.md).
TAB_SAVE = """
INSERT INTO analysis_runs (id, job_id, doc_html, results, saved_by)
SELECT run_id, id, doc_html, results, 'client' FROM analysis_jobs WHERE id = %(id)s
ON CONFLICT (id) DO UPDATE SET job_id = EXCLUDED.job_id, doc_html = EXCLUDED.doc_html,
    results = EXCLUDED.results, saved_by = 'client', updated_at = now()
"""

# Jobs that need a run and have none yet, due or not (the benchmarks never delete or re-run).
UNRECORDED = """
SELECT count(*) FROM analysis_jobs j
 WHERE j.status IN ('complete', 'failed') AND j.results <> '{}'::jsonb
   AND j.doc_html IS NOT NULL AND j.deleted_at IS NULL
   AND NOT EXISTS (SELECT 1 FROM analysis_runs r WHERE r.id = j.run_id)
"""

RESULTS = json.dumps({"verdicts": [{"citation": 1, "verdict": "supported"}]})


async def insert_jobs(
    conn: Conn, count: int, *, doc_bytes: int, distinct_docs: int = 32
) -> list[str]:
    """``count`` running jobs with HTML-like documents; returns their ids in order.

    Documents come from a pool of ``distinct_docs`` bodies, so making them costs little.
    """
    ids = [str(uuid.uuid4()) for _ in range(count)]
    await conn.execute("DROP TABLE IF EXISTS bench_docs")
    await conn.execute(
        "CREATE TABLE bench_docs AS SELECT k, bench_doc(k, %s) AS doc "
        "FROM generate_series(0, %s - 1) k",
        (doc_bytes, distinct_docs),
    )
    await conn.execute(
        """
        INSERT INTO analysis_jobs (id, run_id, status, doc_html, created_at, updated_at)
        SELECT u.id, gen_random_uuid(), 'running', d.doc, now(), now()
          FROM unnest(%s::uuid[]) WITH ORDINALITY AS u(id, n)
          JOIN bench_docs d ON d.k = u.n %% %s
        """,
        (ids, distinct_docs),
    )
    await conn.execute("ANALYZE analysis_jobs")
    return ids


async def unrecorded(conn: Conn) -> int:
    """How many jobs still need a run."""
    return int(await scalar(conn, UNRECORDED))


async def wait_until_recorded(conn: Conn, within: float) -> int:
    """Poll until no job needs a run, or ``within`` seconds pass; returns what is missing."""
    with anyio.move_on_after(within):
        while (missing := await unrecorded(conn)) > 0:  # noqa: ASYNC110 - polls the database
            await anyio.sleep(0.1)
        return 0
    return missing


@dataclass
class Play:
    """What the worker and the tabs did, with the worker's commit times (monotonic)."""

    finished: int = 0
    saved_by_tabs: int = 0
    committed_at: dict[str, float] = field(default_factory=dict)
    round_trip: dict[str, float] = field(default_factory=dict)  # the finish statement's
    behind_s: float = 0.0  # the most the worker fell behind its schedule


async def play(
    dsn: str,
    job_ids: Sequence[str],
    *,
    rate: float,
    save_ratio: float = 0.0,
    tab_delay: tuple[float, float] = (0.0, 0.0),
    eager: bool = False,
    seed: int = 7,
    tab_connections: int = 4,
) -> Play:
    """Finish ``job_ids`` at ``rate`` per second; tabs save ``save_ratio`` of them.

    Returns once the worker is done and every tab save has landed. The worker keeps an absolute
    schedule, so a slow commit does not slow the offered rate down.
    """
    rng = random.Random(seed)
    stats = Play()
    params = {"results": RESULTS}
    async with AsyncExitStack() as stack:
        worker = await stack.enter_async_context(await connect(dsn, "worker"))
        tabs: AsyncConnectionPool[Conn] | None = None
        if save_ratio > 0:
            tabs = await stack.enter_async_context(
                AsyncConnectionPool(
                    dsn,
                    min_size=tab_connections,
                    max_size=tab_connections,
                    kwargs={"autocommit": True, "application_name": "bench-tab"},
                    open=False,
                )
            )

        async def tab_save(job_id: str, delay: float) -> None:
            assert tabs is not None
            await anyio.sleep(delay)
            async with tabs.connection() as tab:
                await tab.execute(TAB_SAVE, {"id": job_id})
            stats.saved_by_tabs += 1

        async with anyio.create_task_group() as tg:
            start = time.monotonic()
            for i, job_id in enumerate(job_ids):
                wait = start + i / rate - time.monotonic()
                if wait > 0:
                    await anyio.sleep(wait)
                else:
                    stats.behind_s = max(stats.behind_s, -wait)
                sent = time.monotonic()
                if eager:
                    async with worker.transaction():
                        await worker.execute(FINISH, {**params, "id": job_id})
                        await worker.execute(EAGER_WRITE, {"id": job_id})
                else:
                    await worker.execute(FINISH, {**params, "id": job_id})
                stats.committed_at[job_id] = time.monotonic()
                stats.round_trip[job_id] = stats.committed_at[job_id] - sent
                stats.finished += 1
                if tabs is not None and rng.random() < save_ratio:
                    tg.start_soon(tab_save, job_id, rng.uniform(*tab_delay))
    return stats


DatabaseFactory = Callable[[AsyncConnectionPool[db.AnyConnection], float], db.Database]


def plain_database(pool: AsyncConnectionPool[db.AnyConnection], grace: float) -> db.Database:
    """The reactor's own Database, unchanged."""
    return db.Database(pool, grace=grace)


class StampedDatabase(db.Database):
    """The reactor's Database, noting when its first claim of each job starts and, if asked,
    when that claim returned (monotonic clock), and counting its record statements. Behaviour
    is unchanged: it claims as usual.
    """

    def __init__(
        self,
        pool: AsyncConnectionPool[db.AnyConnection],
        *,
        grace: float,
        stamps: dict[str, float],
        returns: dict[str, float] | None = None,
    ) -> None:
        super().__init__(pool, grace=grace)
        self.stamps = stamps
        self.returns = returns
        self.record_calls = 0

    async def record_jobs(
        self, job_ids: Sequence[str], *, lock_timeout: float | None = None
    ) -> list[db.JobOutcome]:
        """Stamp and count, then claim exactly as the reactor does."""
        now = time.monotonic()
        self.record_calls += 1
        for job_id in job_ids:
            self.stamps.setdefault(job_id, now)
        outcomes = await super().record_jobs(job_ids, lock_timeout=lock_timeout)
        if self.returns is not None:
            now = time.monotonic()
            for job_id in job_ids:
                self.returns.setdefault(job_id, now)
        return outcomes


def stamped(stamps: dict[str, float], returns: dict[str, float] | None = None) -> DatabaseFactory:
    """A factory of StampedDatabase sharing ``stamps`` (and ``returns``), for :func:`replicas`."""

    def make(pool: AsyncConnectionPool[db.AnyConnection], grace: float) -> db.Database:
        return StampedDatabase(pool, grace=grace, stamps=stamps, returns=returns)

    return make


@dataclass
class Replica:
    """One reactor replica running in this process, with its pool (for checkout counts)."""

    reactor: Reactor
    pool: AsyncConnectionPool[db.AnyConnection]


@asynccontextmanager
async def replicas(
    settings: Settings, count: int, *, database: DatabaseFactory = plain_database
) -> AsyncIterator[list[Replica]]:
    """Run ``count`` reactor replicas (LISTEN up on entry); stop them with their drain on exit."""
    dsn = settings.require_database()
    async with AsyncExitStack() as stack:
        running: list[Replica] = []
        async with anyio.create_task_group() as tg:
            try:
                for _ in range(count):
                    pool = await stack.enter_async_context(db.make_pool(dsn, max_size=POOL_SIZE))
                    reactor = Reactor(settings, database(pool, settings.grace))
                    await tg.start(reactor.run)
                    running.append(Replica(reactor, pool))
                yield running
            finally:
                for replica in running:
                    replica.reactor.stop()


def bench_settings(dsn: str, **overrides: Any) -> Settings:
    """Reactor settings for an in-process replica: no HTTP server, the rest as given."""
    return Settings(database_url=dsn, http_addr=None, **overrides)


async def wait_for_first_scan(running: Sequence[Replica], within: float = 30.0) -> None:
    """Wait until every replica finished its startup scan."""
    with anyio.fail_after(within):
        # The reactor exposes a counter, not an event; polling keeps product code untouched.
        while any(r.reactor.scans < 1 for r in running):  # noqa: ASYNC110
            await anyio.sleep(0.05)
