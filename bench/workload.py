"""Playing the app and running the reactor in-process: jobs, the worker, browser tabs, replicas.

The worker finishes jobs at a steady rate on one connection; tabs save a share of them after a
random delay inside the grace window; reactor replicas run in this process exactly as
``reactor demo`` runs them, each with its own pool and LISTEN connection.
"""

from __future__ import annotations

import dataclasses
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

from bench.conn import Conn, connect
from reactor import db
from reactor.install import REFERENCE_INSTALL, Install
from reactor.testing import REFERENCE, App, Pair, Reactor, Settings, open_replica

# The worker of the eager design writes the run itself at finalize, in the same transaction;
# it never overwrites a client row.
EAGER_WRITE = """
INSERT INTO analysis_runs AS r (id, job_id, doc_html, results, saved_by)
SELECT run_id, id, doc_html, results, 'worker' FROM analysis_jobs WHERE id = %(id)s
ON CONFLICT (id) DO UPDATE SET job_id = EXCLUDED.job_id, doc_html = EXCLUDED.doc_html,
    results = EXCLUDED.results, saved_by = 'worker', updated_at = now()
 WHERE coalesce(r.saved_by, 'client') = 'worker'
"""

# The app, as the worker and its tabs write the reference tables.
APP = App(REFERENCE_INSTALL.mapping)

# The first line of each statement the app sends, as pg_stat_statements shows it: a benchmark
# that counts the replicas' statements leaves these out (the tab's save writes the runs table
# too, with the same INSERT as the reactor's record statements).
APP_STATEMENTS = tuple(
    statement.query.splitlines()[0]
    for statement in (
        APP.create([APP.new_run()], jobs=[APP.new_job()]),
        APP.finish(APP.nth_job(1)),
        APP.progress(APP.nth_job(1)),
        APP.tab_save(APP.nth_job(1)),
        APP.unsettled(),
    )
)


def is_record_statement(query: str) -> bool:
    """True for the reactor's claim-and-write statements (timer and scan) in
    pg_stat_statements: they write the runs table, and are not the tab's save."""
    return RECORD_WRITE in query and not query.lstrip().startswith(APP_STATEMENTS)


RECORD_WRITE = 'INSERT INTO "public"."analysis_runs" AS r'

RESULTS = json.dumps({"verdicts": [{"citation": 1, "verdict": "supported"}]})


async def insert_jobs(
    conn: Conn,
    count: int,
    *,
    doc_bytes: int,
    distinct_docs: int = 32,
    finished: bool = False,
    verdicts: str | None = None,
    age: float = 0.0,
) -> list[str]:
    """``count`` jobs with HTML-like documents, created by the app ``age`` seconds ago, running
    unless ``finished`` (with ``verdicts``); returns their ids in order. Documents come from a
    pool of ``distinct_docs`` bodies, made once by the database's bench_doc, one insert for the
    jobs of each, all in one transaction."""
    cur = await conn.execute(
        "SELECT bench_doc(k, %s) FROM generate_series(0, %s - 1) k", (doc_bytes, distinct_docs)
    )
    documents = [doc for (doc,) in await cur.fetchall()]
    ids = [uuid.uuid4() for _ in range(count)]
    async with conn.transaction():
        for k, document in enumerate(documents):
            share = ids[k::distinct_docs]
            if share:
                runs = [APP.new_run() for _ in share]
                created = APP.create(
                    runs,
                    jobs=list(share),
                    document=document,
                    finished=finished,
                    verdicts=verdicts,
                    created_age=age,
                    updated_age=age,
                )
                await conn.execute(*created)
    await conn.execute("ANALYZE analysis_jobs")
    return [str(job) for job in ids]


async def unrecorded(conn: Conn) -> int:
    """How many jobs still need a run."""
    cur = await conn.execute(*APP.unsettled())
    row = await cur.fetchone()
    return int(row[0]) if row else 0


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
    touched: int = 0  # finished jobs whose updated_at the app moved again, with no notification
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
    touch_ratio: float = 0.0,
    touch_delay: float = 0.0,
) -> Play:
    """Finish ``job_ids`` at ``rate`` per second; tabs save ``save_ratio`` of them, and the app
    touches ``touch_ratio`` of them ``touch_delay`` seconds after their finish: their
    ``updated_at`` moves, so their deadline does, with no status change and no notification.

    Returns once the worker is done and every tab save has landed. The worker keeps an absolute
    schedule, so a slow commit does not slow the offered rate down.
    """
    rng = random.Random(seed)
    # Touches draw from their own sequence, so the tabs' saves stay what they were without.
    touch_rng = random.Random(seed + 1)
    stats = Play()
    async with AsyncExitStack() as stack:
        worker = await stack.enter_async_context(await connect(dsn, "worker"))
        tabs: AsyncConnectionPool[Conn] | None = None
        if save_ratio > 0 or touch_ratio > 0:
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
                await tab.execute(*APP.tab_save(job_id))
            stats.saved_by_tabs += 1

        async def touch(job_id: str) -> None:
            assert tabs is not None
            await anyio.sleep(touch_delay)
            async with tabs.connection() as app:
                await app.execute(*APP.touch(job_id))
            stats.touched += 1

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
                        await worker.execute(*APP.finish(job_id, verdicts=RESULTS))
                        await worker.execute(EAGER_WRITE, {"id": job_id})
                else:
                    await worker.execute(*APP.finish(job_id, verdicts=RESULTS))
                stats.committed_at[job_id] = time.monotonic()
                stats.round_trip[job_id] = stats.committed_at[job_id] - sent
                stats.finished += 1
                if tabs is not None and rng.random() < save_ratio:
                    tg.start_soon(tab_save, job_id, rng.uniform(*tab_delay))
                if tabs is not None and touch_rng.random() < touch_ratio:
                    tg.start_soon(touch, job_id)
    return stats


Instrument = Callable[[db.Database], db.Database]


@dataclass(frozen=True)
class StampedDatabase(db.Database):
    """The reactor's Database, noting when its first claim of each job starts and, if asked,
    when that claim returned (monotonic clock), and counting its record statements. Behaviour
    is unchanged: it claims as usual.
    """

    stamps: dict[str, float] = field(default_factory=dict)
    returns: dict[str, float] | None = None
    # One counter shared by every copy (the listener's road makes one).
    counted: list[int] = field(default_factory=lambda: [0])

    @property
    def record_calls(self) -> int:
        """Record statements sent so far."""
        return self.counted[0]

    async def record_jobs(
        self, job_ids: Sequence[str], *, lock_timeout: float | None = None
    ) -> list[db.JobOutcome]:
        """Stamp and count, then claim exactly as the reactor does."""
        now = time.monotonic()
        self.counted[0] += 1
        for job_id in job_ids:
            self.stamps.setdefault(job_id, now)
        outcomes = await super().record_jobs(job_ids, lock_timeout=lock_timeout)
        if self.returns is not None:
            now = time.monotonic()
            for job_id in job_ids:
                self.returns.setdefault(job_id, now)
        return outcomes


def stamped(stamps: dict[str, float], returns: dict[str, float] | None = None) -> Instrument:
    """An instrument making each replica's Database a StampedDatabase sharing ``stamps`` (and
    ``returns``), for :func:`replicas`."""

    def make(database: db.Database) -> db.Database:
        fields = {f.name: getattr(database, f.name) for f in dataclasses.fields(database)}
        return StampedDatabase(**fields, stamps=stamps, returns=returns)

    return make


@dataclass
class Replica:
    """One reactor replica running in this process, with its pool (for checkout counts)."""

    reactor: Reactor
    pool: AsyncConnectionPool[db.AnyConnection]


@asynccontextmanager
async def replicas(
    settings: Settings, count: int, *, database: Instrument | None = None
) -> AsyncIterator[list[Replica]]:
    """Run ``count`` reactor replicas on the reference tables (LISTEN up on entry); stop them
    with their drain on exit. ``database`` instruments each replica's queries."""
    install = Install.of(REFERENCE.in_public(), settings.channel)
    async with AsyncExitStack() as stack:
        running: list[Replica] = []
        for _ in range(count):
            pair = Pair(install, settings)
            process = await stack.enter_async_context(
                open_replica(settings, [pair], instrument=database)
            )
            await stack.enter_async_context(process.running())
            reactor = process.reactors[pair.name]
            running.append(Replica(reactor, reactor.database.pool))
        try:
            yield running
        finally:
            # All at once, as a fleet stops: each then drains on its way out.
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
