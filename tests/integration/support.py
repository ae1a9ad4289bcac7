"""Helpers shared by the core integration tests (test_record, test_precedence, ...).

Nothing here replaces the database: these helpers only play the app with explicit timestamps,
read the audit table, and watch what a running reactor's recorder has finished.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg.conninfo
from aiohttp import web
from psycopg.rows import AsyncRowFactory
from psycopg_pool import AsyncConnectionPool

from reactor import db
from reactor.claim.dispatch import Answer
from reactor.runtime.service import Reactor
from tests.helpers import APP, Conn, new_job
from tests.helpers import scalar as scalar  # where the integration tests find it
from tests.polling import eventually


def dbname(dsn: str) -> str:
    """The database a DSN points at."""
    return str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])


# A job with chosen id, times and age, played by the app: one helper for the whole suite.
add_job = new_job


def touch(conn: Conn, job_id: uuid.UUID, *, age: float = 0.0, **columns: Any) -> None:
    """The app touching a job: set ``columns`` and updated_at = now() - ``age`` seconds, in one
    statement (one trigger firing), in the app's names."""
    sets = "".join(f", {name} = %({name})s" for name in columns)
    statement = f"UPDATE @jobs@ SET @updated_at@ = @now@ - make_interval(secs => %(age)s){sets}"
    conn.execute(
        APP.render(f"{statement} WHERE @id@ = %(id)s", parameters=True),
        {"age": age, "id": job_id, **columns},
    )


def column(conn: Conn, query: str, params: Any = None) -> list[Any]:
    """The first column of every row of ``query``, in order."""
    return [row[0] for row in conn.execute(query, params).fetchall()]


def update_counts(conn: Conn, table: str) -> tuple[int, int]:
    """(n_tup_upd, n_tup_hot_upd) of ``table`` (a regclass, e.g. ``'app."Job"'``), with this
    session's updates flushed."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    row = conn.execute(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = %s::regclass",
        (table,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def audit(conn: Conn) -> list[tuple[Any, ...]]:
    """Every write to analysis_runs as (op, run_id, job_id, saved_by), in order."""
    return conn.execute(
        "SELECT op, run_id, job_id, saved_by FROM run_audit ORDER BY seq"
    ).fetchall()


def worker_lateness(conn: Conn, grace: float) -> list[float]:
    """For each worker write, seconds between updated_at + grace and the write (>= 0: not early)."""
    rows = conn.execute(
        """
        SELECT extract(epoch FROM a.at - (coalesce(a.job_updated_at, j.updated_at)
                                          + make_interval(secs => %s)))::float8
          FROM run_audit a JOIN analysis_jobs j ON j.id = a.job_id
         WHERE a.saved_by = 'worker' ORDER BY a.seq
        """,
        (grace,),
    ).fetchall()
    return [float(r[0]) for r in rows]


def worker_delay(conn: Conn, job_ids: Sequence[uuid.UUID]) -> float:
    """The most seconds between one of ``job_ids``' updated_at and the worker's write of its run
    (its grace included)."""
    delay = scalar(
        conn,
        "SELECT max(extract(epoch FROM a.at - j.updated_at))::float8"
        "  FROM run_audit a JOIN analysis_jobs j ON j.id = a.job_id"
        " WHERE a.job_id = ANY(%s) AND a.saved_by = 'worker'",
        (list(job_ids),),
    )
    assert delay is not None, "no worker wrote a run of these jobs"
    return float(delay)


def recorded(reactor: Reactor, source: str) -> float:
    """reactor_runs_recorded_total{source=...} of one reactor."""
    value = reactor.metrics.registry.get_sample_value(
        "reactor_runs_recorded_total", {"source": source}
    )
    return value or 0.0


def hints_heard(reactor: Reactor) -> float:
    """Job hints the reactor's listener accepted from its channel."""
    return float(reactor.metrics.notified["accepted"]._value.get())


def hints_ignored(reactor: Reactor) -> float:
    """Job hints the reactor checked against the queue and found naming no queued job: a
    notification for a job that needs no run (or no longer) is dropped there, never armed."""
    return float(reactor.metrics.notified["unverified"]._value.get())


def claims_skipped(reactor: Reactor) -> float:
    """reactor_claims_skipped_total of one reactor."""
    return reactor.metrics.registry.get_sample_value("reactor_claims_skipped_total") or 0.0


@dataclass
class RecorderLog:
    """What a reactor's timer path has finished: every batch handed to the recorder and the
    re-arms it returned. Installed by wrapping the recorder's ``record`` method; the statement
    itself still runs against the real database."""

    batches: list[list[str]] = field(default_factory=list)
    rearms: list[list[tuple[str, float]]] = field(default_factory=list)

    def processed(self, job_id: uuid.UUID | str) -> bool:
        """True once a record statement that covered ``job_id`` has returned."""
        key = str(job_id)
        return any(key in batch for batch in self.batches)

    def all_processed(self, job_ids: Sequence[uuid.UUID | str]) -> bool:
        return all(self.processed(j) for j in job_ids)

    def rearmed(self, job_id: uuid.UUID | str) -> list[float]:
        """The delays the recorder asked for ``job_id`` (waiting, busy or error)."""
        key = str(job_id)
        return [delay for rearm in self.rearms for j, delay in rearm if j == key]


async def start_scans_over(reactor: Reactor) -> None:
    """Wait for the scans a start asks for (the first re-arm, and the one LISTEN coming up
    asks for). On a loaded machine one that began late finds the jobs a test has just finished
    due, and settles them on the scan's road: a test of the timer's road waits for them first."""
    await eventually(lambda: not reactor.scan_pending)


def watch_recorder(reactor: Reactor) -> RecorderLog:
    """Start logging the reactor's record statements as they complete."""
    log = RecorderLog()
    inner = reactor.recorder.record

    async def record(job_ids: Sequence[str], alone: bool = False) -> Answer:
        answer = await inner(job_ids, alone)
        log.rearms.append(list(answer.retry))
        log.batches.append(list(job_ids))
        return answer

    reactor.recorder.record = record  # type: ignore[method-assign]
    return log


@contextmanager
def app_and_a_tab(database_url: str) -> Iterator[tuple[Conn, Conn]]:
    """Two connections: the app's, in autocommit, and a tab's, whose transaction can hold a
    run row's lock for as long as the test needs."""
    with (
        psycopg.connect(database_url, autocommit=True) as app,
        psycopg.connect(database_url) as tab,
    ):
        yield app, tab


@asynccontextmanager
async def serving(app: web.Application, port: int) -> AsyncIterator[None]:
    """``app`` answering HTTP on 127.0.0.1:``port`` until the block ends."""
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield
    finally:
        await runner.cleanup()


R = TypeVar("R")


def whole(query: str) -> str:
    return query


@dataclass(frozen=True)
class Counting:
    """A connector that notes each statement it runs (as ``note`` renders it)."""

    on: db.Pooled
    seen: list[str]
    note: Callable[[str], str] = whole
    # Each statement's lock_timeout, in order: given, the call runs in a transaction of its own.
    waits: list[float | None] = field(default_factory=list)

    @property
    def pool(self) -> AsyncConnectionPool[db.AnyConnection]:
        return self.on.pool

    async def fetch(
        self, query: str, params: Any, row_factory: AsyncRowFactory[R], **options: Any
    ) -> list[R]:
        self.seen.append(self.note(query))
        self.waits.append(options.get("lock_timeout"))
        return await self.on.fetch(query, params, row_factory, **options)
