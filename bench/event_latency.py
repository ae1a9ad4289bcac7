"""event_latency: from the commit of a terminal UPDATE to the start of the reactor's claim.

With grace 0, the reactor arms each notified job for "now" and claims it at once. The
alternatives are two PostgreSQL task queues, also woken by LISTEN/NOTIFY, on the same server:
procrastinate (psycopg) and pgqueuer (asyncpg). All three are measured from the return of the
committing call to two points, stamped on the same monotonic clock in the same process by
wrapping the call that claims the job (no product change): when that call starts (the
reactor's ``Database.record_jobs``, procrastinate's ``JobManager.fetch_job``, pgqueuer's
``Queries.dequeue``), and when it has returned (for the queues: their handler starts, which
they call as soon as their fetch returned).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import anyio
import asyncpg  # type: ignore[import-untyped]  # asyncpg ships no type information
import procrastinate
from pgqueuer import PgQueuer, Queries
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job

from bench.conn import asyncpg_params, connect
from bench.result import Context, Result, Table, conditions
from bench.server import open_server
from bench.stats import ms, ratio, safe_div, summarize
from bench.workload import (
    bench_settings,
    insert_jobs,
    play,
    replicas,
    stamped,
    wait_for_first_scan,
)

TITLE = "Event latency at grace 0: commit -> the start of the call that claims the job"
GOAL = (
    "p50 and p99 below both procrastinate's and pgqueuer's, each from the enqueue's commit to "
    "the start of its fetch"
)

T = TypeVar("T")

# Per system: (commit -> claim call starts, commit -> claim call returned), in seconds.
Samples = tuple[list[float], list[float]]


async def run(ctx: Context) -> Result:
    """Measure the reactor, procrastinate and pgqueuer one after the other."""
    quick = ctx.quick
    samples = 40 if quick else 600
    rate = 25.0  # one event at a time: latency, not throughput
    settings: dict[str, Any] = {
        "samples": samples,
        "rate_per_s": rate,
        "grace_s": 0.0,
        "reactor_replicas": 1,
        "procrastinate": "PsycopgConnector, run_worker_async(concurrency=1), listen_notify on",
        "pgqueuer": "AsyncpgDriver, PgQueuer.run(batch_size=10), defaults",
    }
    async with open_server() as server:
        cond = await conditions(
            server,
            procrastinate=importlib.metadata.version("procrastinate"),
            pgqueuer=importlib.metadata.version("pgqueuer"),
            asyncpg=importlib.metadata.version("asyncpg"),
        )
        reactor = await _reactor(
            await server.app_database("ev_reactor", with_audit=False), samples, rate
        )
        proc = await _procrastinate(
            server.dsn_for(await server.create_database("ev_procrastinate")), samples, rate
        )
        pgq = await _pgqueuer(
            server.dsn_for(await server.create_database("ev_pgqueuer")), samples, rate
        )

    systems = (
        ("reactor (grace 0)", ("record_jobs starts", "record_jobs returned"), reactor),
        ("procrastinate 3 (psycopg)", ("fetch_job starts", "handler starts"), proc),
        ("pgqueuer (asyncpg)", ("dequeue starts", "handler starts"), pgq),
    )
    # [point][system]: point 0 is the start of the claiming call (judged), 1 its return.
    stats = [[summarize(s[point]) for _, _, s in systems] for point in (0, 1)]
    (r, p, q), (r_end, p_end, q_end) = stats
    met = r["p50"] < min(p["p50"], q["p50"]) and r["p99"] < min(p["p99"], q["p99"])
    table = _table(systems, stats)
    notes = _notes(stats, met=met)
    headline = (
        f"to the claim's start: reactor p50 {ms(r['p50'])} / p99 {ms(r['p99'])}, "
        f"procrastinate {ms(p['p50'])} / {ms(p['p99'])}, pgqueuer {ms(q['p50'])} / "
        f"{ms(q['p99'])}; to its return (the reactor's writes the run): reactor "
        f"{ms(r_end['p50'])} / {ms(r_end['p99'])}, procrastinate {ms(p_end['p50'])} / "
        f"{ms(p_end['p99'])}, pgqueuer {ms(q_end['p50'])} / {ms(q_end['p99'])}"
    )
    return Result(
        met=met,
        headline=headline,
        table=table,
        figures={
            "claim_start": {"reactor": r, "procrastinate": p, "pgqueuer": q},
            "claim_returned": {"reactor": r_end, "procrastinate": p_end, "pgqueuer": q_end},
        },
        settings=settings,
        conditions=cond,
        notes=notes,
    )


def _table(
    systems: tuple[tuple[str, tuple[str, str], Samples], ...],
    stats: list[list[dict[str, float]]],
) -> Table:
    """Each system at both points, against the reactor."""
    (r, _, _), (r_end, _, _) = stats
    table = Table(
        ["system", "measured to", "n", "p50", "p99", "max", "p50 / reactor", "p99 / reactor"]
    )
    for point, (ref, row) in enumerate(zip((r, r_end), stats, strict=True)):
        for (label, ends, _), s in zip(systems, row, strict=True):
            table.add(
                label,
                ends[point],
                s["n"],
                ms(s["p50"]),
                ms(s["p99"]),
                ms(s["max"]),
                ratio(safe_div(s["p50"], ref["p50"])),
                ratio(safe_div(s["p99"], ref["p99"])),
            )
    return table


def _notes(stats: list[list[dict[str, float]]], *, met: bool) -> list[str]:
    """Where each point is measured, and what would close a gap."""
    (r, p, q), (r_end, p_end, q_end) = stats
    notes = [
        "All three are woken by LISTEN/NOTIFY on the same server and measured from the moment "
        "the committing call returned to the client. A negative or near-zero figure means the "
        "wake-up raced ahead of the committing client's own reply.",
        "The goal is judged at the start of the call that claims the job, the same point for "
        "all three: each has woken up and none has touched the database for this job yet. "
        "At grace 0 a job is due when its notification arrives, and the reactor starts its "
        "claim from the listener's hand-over when a record slot is free, without arming a "
        "timer: the path a queue's worker loop takes.",
        "The second point, the claiming call returned, is not like for like: the reactor's "
        "one statement also writes the run (a 4 kB document here), so the reactor has done "
        "its whole job, while the queues' handlers have yet to start theirs. Reactor there: "
        f"p50 {ms(r_end['p50'])}, p99 {ms(r_end['p99'])}; procrastinate {ms(p_end['p50'])} / "
        f"{ms(p_end['p99'])}; pgqueuer {ms(q_end['p50'])} / {ms(q_end['p99'])}. Between the "
        "two points the reactor also checks out a pooled connection, with a check, which "
        "is a round trip of its own.",
    ]
    if not met:
        notes.append(
            "What would close the gap: to the claim's start, the reactor's path is the "
            "listener's hand-over and a record task's start, as short as a queue's; to the "
            "claim's return, the claiming call itself: "
            f"{ms(r_end['p50'] - r['p50'])} between the reactor's two medians, against "
            f"{ms(p_end['p50'] - p['p50'])} and {ms(q_end['p50'] - q['p50'])} for the queues' "
            "fetch; one round trip of it is the pooled connection's check, the rest the "
            "statement that writes the run, which is worth profiling on its own."
        )
    return notes


async def _reactor(dsn: str, samples: int, rate: float) -> Samples:
    async with await connect(dsn, "setup") as conn:
        ids = await insert_jobs(conn, samples, doc_bytes=4096)
    starts: dict[str, float] = {}
    returns: dict[str, float] = {}
    database = stamped(starts, returns)
    async with replicas(bench_settings(dsn, grace=0.0), 1, database=database) as running:
        await wait_for_first_scan(running)
        await anyio.sleep(0.5)
        done = await play(dsn, ids, rate=rate)
        with anyio.move_on_after(5):
            while len(returns) < len(ids):  # noqa: ASYNC110 - filled by the reactor's calls
                await anyio.sleep(0.05)
    return _since(done.committed_at, starts), _since(done.committed_at, returns)


async def _procrastinate(dsn: str, samples: int, rate: float) -> Samples:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
    fetched: dict[int, float] = {}
    started: dict[int, float] = {}

    @app.task(name="bench_event")
    async def bench_event(k: int) -> None:
        started.setdefault(k, time.monotonic())

    def keys(job: procrastinate.jobs.Job | None) -> list[int]:
        return [] if job is None else [int(str(job.task_kwargs["k"]))]

    _stamp_starts(app.job_manager, "fetch_job", keys, fetched)
    committed: dict[int, float] = {}
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        worker = asyncio.create_task(
            app.run_worker_async(concurrency=1, install_signal_handlers=False)
        )
        await anyio.sleep(1.0)
        begin = time.monotonic()
        for k in range(samples):
            await _pace(begin, k, rate)
            await bench_event.defer_async(k=k)
            committed[k] = time.monotonic()
        await _wait_for(started, samples)
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
    return _since(committed, fetched), _since(committed, started)


async def _pgqueuer(dsn: str, samples: int, rate: float) -> Samples:
    params = asyncpg_params(dsn)
    producer = await asyncpg.connect(**params)
    consumer = await asyncpg.connect(**params)
    try:
        queries = Queries(AsyncpgDriver(producer))
        await queries.install()
        pgq = PgQueuer.from_asyncpg_connection(consumer)
        fetched: dict[int, float] = {}
        started: dict[int, float] = {}

        @pgq.entrypoint("bench_event")
        async def bench_event(job: Job) -> None:
            assert job.payload is not None
            started.setdefault(int(job.payload), time.monotonic())

        def keys(jobs: list[Job]) -> list[int]:
            return [int(job.payload) for job in jobs if job.payload is not None]

        _stamp_starts(pgq.qm.queries, "dequeue", keys, fetched)
        worker = asyncio.create_task(pgq.run())
        await anyio.sleep(1.0)
        committed: dict[int, float] = {}
        begin = time.monotonic()
        for k in range(samples):
            await _pace(begin, k, rate)
            await queries.enqueue("bench_event", str(k).encode())
            committed[k] = time.monotonic()
        await _wait_for(started, samples)
        pgq.shutdown.set()
        with anyio.move_on_after(10):
            await worker
    finally:
        await producer.close()
        await consumer.close()
    return _since(committed, fetched), _since(committed, started)


def _stamp_starts(
    target: object,
    method: str,
    keys: Callable[[Any], Iterable[int]],
    into: dict[int, float],
) -> None:
    """Wrap ``target.method`` (a coroutine): each key its result holds is stamped with the
    moment the call that returned it started. The call itself is unchanged."""
    call: Callable[..., Awaitable[Any]] = getattr(target, method)

    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        result = await call(*args, **kwargs)
        for key in keys(result):
            into.setdefault(key, started)
        return result

    setattr(target, method, wrapped)


def _since(committed: dict[T, float], stamps: dict[T, float]) -> list[float]:
    """Per key stamped: its stamp minus its commit, in seconds."""
    return [stamps[k] - at for k, at in committed.items() if k in stamps]


async def _pace(begin: float, k: int, rate: float) -> None:
    wait = begin + k / rate - time.monotonic()
    if wait > 0:
        await anyio.sleep(wait)


async def _wait_for(started: dict[int, float], samples: int) -> None:
    with anyio.move_on_after(10):
        while len(started) < samples:  # noqa: ASYNC110 - filled by the queue's handler
            await anyio.sleep(0.05)
