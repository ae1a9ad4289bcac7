"""event_latency: from the commit of a terminal UPDATE to the start of the reactor's claim.

With grace 0, the reactor arms each notified job for "now" and claims it at once. The claim's
start is stamped by wrapping ``Database.record_jobs`` (no product change); the worker stamps
the moment its autocommit UPDATE returns, on the same monotonic clock in the same process.
The alternatives are two PostgreSQL task queues, also woken by LISTEN/NOTIFY, on the same
server: procrastinate (psycopg) and pgqueuer (asyncpg), from the return of the enqueue's commit
to the start of the handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import time
from typing import Any

import anyio
import asyncpg  # type: ignore[import-untyped]  # asyncpg ships no type information
import procrastinate
from pgqueuer import PgQueuer, Queries
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job

from bench.common import (
    Context,
    Result,
    Table,
    asyncpg_params,
    conditions,
    connect,
    ms,
    open_server,
    ratio,
    safe_div,
    summarize,
)
from bench.workload import (
    bench_settings,
    insert_jobs,
    play,
    replicas,
    stamped,
    wait_for_first_scan,
)

TITLE = "Event latency at grace 0: terminal commit -> start of the reactor's claim"
GOAL = "p50 and p99 below both procrastinate's and pgqueuer's enqueue-commit -> handler start"


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
        reactor_s = await _reactor(
            await server.app_database("ev_reactor", with_audit=False), samples, rate
        )
        proc_s = await _procrastinate(
            server.dsn_for(await server.create_database("ev_procrastinate")), samples, rate
        )
        pgq_s = await _pgqueuer(
            server.dsn_for(await server.create_database("ev_pgqueuer")), samples, rate
        )

    r, p, q = summarize(reactor_s), summarize(proc_s), summarize(pgq_s)
    met = r["p50"] < min(p["p50"], q["p50"]) and r["p99"] < min(p["p99"], q["p99"])
    table = Table(["system", "n", "p50", "p99", "max", "p50 / reactor", "p99 / reactor"])
    for label, s in (
        ("reactor (grace 0)", r),
        ("procrastinate 3 (psycopg)", p),
        ("pgqueuer (asyncpg)", q),
    ):
        table.add(
            label,
            s["n"],
            ms(s["p50"]),
            ms(s["p99"]),
            ms(s["max"]),
            ratio(safe_div(s["p50"], r["p50"])),
            ratio(safe_div(s["p99"], r["p99"])),
        )
    notes = [
        "All three are woken by LISTEN/NOTIFY on the same server and measured from the moment "
        "the committing call returned to the client. A negative or near-zero figure means the "
        "wake-up raced ahead of the committing client's own reply.",
        "The reactor's figure ends where its claim statement starts (Database.record_jobs is "
        "entered); the alternatives' ends where the handler starts, after their fetch. The "
        "reactor's claim statement itself is part of lateness, not of this figure.",
    ]
    if not met:
        notes.append(
            "What would close the gap: the reactor's path is notification -> deadline heap -> "
            "timer task wake-up -> record task; at grace 0 it could skip the heap and hand the "
            "id straight to a record slot."
        )
    headline = (
        f"reactor p50 {ms(r['p50'])} / p99 {ms(r['p99'])}; procrastinate {ms(p['p50'])} / "
        f"{ms(p['p99'])}; pgqueuer {ms(q['p50'])} / {ms(q['p99'])}"
    )
    return Result(
        name="event_latency",
        title=TITLE,
        goal=GOAL,
        met=met,
        headline=headline,
        table=table,
        figures={"reactor": r, "procrastinate": p, "pgqueuer": q},
        settings=settings,
        conditions=cond,
        notes=notes,
    )


async def _reactor(dsn: str, samples: int, rate: float) -> list[float]:
    async with await connect(dsn, "setup") as conn:
        ids = await insert_jobs(conn, samples, doc_bytes=4096)
    stamps: dict[str, float] = {}
    async with replicas(bench_settings(dsn, grace=0.0), 1, database=stamped(stamps)) as running:
        await wait_for_first_scan(running)
        await anyio.sleep(0.5)
        done = await play(dsn, ids, rate=rate)
        with anyio.move_on_after(5):
            while len(stamps) < len(ids):  # noqa: ASYNC110 - filled by the reactor's calls
                await anyio.sleep(0.05)
    return [stamps[i] - done.committed_at[i] for i in ids if i in stamps]


async def _procrastinate(dsn: str, samples: int, rate: float) -> list[float]:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
    started: dict[int, float] = {}

    @app.task(name="bench_event")
    async def bench_event(k: int) -> None:
        started.setdefault(k, time.monotonic())

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
    return [started[k] - committed[k] for k in committed if k in started]


async def _pgqueuer(dsn: str, samples: int, rate: float) -> list[float]:
    params = asyncpg_params(dsn)
    producer = await asyncpg.connect(**params)
    consumer = await asyncpg.connect(**params)
    try:
        queries = Queries(AsyncpgDriver(producer))
        await queries.install()
        pgq = PgQueuer.from_asyncpg_connection(consumer)
        started: dict[int, float] = {}

        @pgq.entrypoint("bench_event")
        async def bench_event(job: Job) -> None:
            assert job.payload is not None
            started.setdefault(int(job.payload), time.monotonic())

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
    return [started[k] - committed[k] for k in committed if k in started]


async def _pace(begin: float, k: int, rate: float) -> None:
    wait = begin + k / rate - time.monotonic()
    if wait > 0:
        await anyio.sleep(wait)


async def _wait_for(started: dict[int, float], samples: int) -> None:
    with anyio.move_on_after(10):
        while len(started) < samples:  # noqa: ASYNC110 - filled by the queue's handler
            await anyio.sleep(0.05)
