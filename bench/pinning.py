"""pinning: what the reactor pays per call for statements whose meaning does not depend on
the session defaults, direct and behind a transaction pooler.

Each pooled call used to be one bare autocommit statement on a connection whose session carried
the reactor's timeouts, with psycopg preparing a statement after its fifth run. Now a pool
connection that is a session of its own also gets READ COMMITTED and READ WRITE for the session
and stays a bare, prepared statement; one behind a pooler gets nothing for the session and no
prepared statements, and each call is pinned: ``BEGIN ISOLATION LEVEL READ COMMITTED READ
WRITE``, one ``set_config(..., true)``, the statement and ``COMMIT`` in one pipeline. The
pooler's variant is timed here on a direct connection set up as the reactor sets up one behind a
pooler, so that only the reactor's own cost is measured, not the pooler's hop.

Four variants, timed round robin, one connection each, on one database: before, now direct,
bare but unprepared (what giving up prepared statements costs by itself), now behind a pooler.
The statements: the watch loop's ``health``, the re-arm's ``upcoming`` (nothing inside grace),
``claim_hooks`` with nothing to claim, and ``record_jobs`` writing the run of one due job (a
fresh job for every call).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from bench.conn import Conn
from bench.result import Context, Result, Table, conditions
from bench.server import open_server
from bench.stats import ms, ratio, safe_div, summarize
from bench.workload import APP
from reactor import db
from reactor.install import REFERENCE_INSTALL

TITLE = "Per-call cost of pinning isolation and timeouts in every transaction"
GOAL = (
    "direct: no added cost (p50 within 0.05 ms of before); behind a pooler: pinning adds "
    "<= 0.2 ms at p50 to the unprepared statement (a tenth of a claim statement's ~1.8 ms)"
)

VARIANTS = (
    "before",
    "now, direct",
    "bare, unprepared",
    "now, behind a pooler",
)

# A due job's document: some weight, as a real one has.
DUE_DOCUMENT = "<p>cited</p>" * 100

NONE = "00000000-0000-0000-0000-000000000000"

Call = Callable[[str, dict[str, Any]], Awaitable[list[tuple[Any, ...]]]]


async def run(ctx: Context) -> Result:
    """Time every statement in every variant, interleaved call by call."""
    calls = 100 if ctx.quick else 2000
    settings: dict[str, Any] = {"calls_per_statement_and_variant": calls, "pool": "none"}
    async with open_server() as server:
        cond = await conditions(server, quick=ctx.quick)
        dsn = await server.app_database("pinning", with_audit=False)
        conns = [
            await _connect(dsn, prepared=True, session=True),
            await _connect(dsn, prepared=True, session=False),
            await _connect(dsn, prepared=False, session=True),
            await _connect(dsn, prepared=False, session=False),
        ]
        try:
            await db.configure_pooled(conns[1])
            assert db.is_own_session(conns[1])
            assert not db.is_own_session(conns[3])
            runners = [_bare(conns[0]), _now(conns[1]), _bare(conns[2]), _now(conns[3])]
            due: list[str] = []
            # The due jobs only now, after the other statements: in the queue, they would make
            # health and upcoming read thousands of rows that a real backlog rarely has.
            timings = await _time_all(runners, _cheap(), calls)
            async with await _connect(dsn, prepared=False, session=False) as setup:
                # Finished an hour ago, long past the grace.
                finished = APP.create(
                    count=calls * len(VARIANTS),
                    finished=True,
                    document=DUE_DOCUMENT,
                    verdicts='{"verdicts": [1, 2]}',
                    created_age=3600.0,
                    updated_age=3600.0,
                )
                cur = await setup.execute(*finished)
                due += [str(job) for job, _ in await cur.fetchall()]
            timings |= await _time_all(runners, _recording(due, len(runners)), calls)
        finally:
            for conn in conns:
                await conn.close()

    table = Table(
        ["statement", *VARIANTS, "direct - before", "pinning (pooler - bare)", "pooler / before"]
    )
    figures: dict[str, Any] = {}
    direct_added, pinning_added = [], []
    for name, by_variant in timings.items():
        stats = [summarize(by_variant[v]) for v in VARIANTS]
        figures[name] = dict(zip(VARIANTS, stats, strict=True))
        before, direct, bare, pooled = (x["p50"] for x in stats)
        direct_added.append(direct - before)
        pinning_added.append(pooled - bare)
        table.add(
            name,
            *(f"{ms(x['p50'])} / {ms(x['p99'])}" for x in stats),
            f"{(direct - before) * 1000:+.3f} ms",
            f"{(pooled - bare) * 1000:+.3f} ms",
            ratio(safe_div(pooled, before)),
        )
    met = max(direct_added) <= 0.00005 and max(pinning_added) <= 0.0002
    record = figures["record_jobs (1 due job)"]
    headline = (
        f"direct {max(direct_added) * 1000:+.3f} ms at worst; behind a pooler pinning adds "
        f"{min(pinning_added) * 1000:.3f}-{max(pinning_added) * 1000:.3f} ms at p50; "
        f"record_jobs {ms(record[VARIANTS[0]]['p50'])} before, "
        f"{ms(record[VARIANTS[1]]['p50'])} direct, {ms(record[VARIANTS[3]]['p50'])} pooled"
    )
    return Result(
        met=met,
        headline=headline,
        table=table,
        figures=figures,
        settings=settings,
        conditions=cond,
        notes=_notes(),
    )


def _notes() -> list[str]:
    """What a cell is, what a pooler adds, and what would shorten the pooled path."""
    return [
        "Cells are p50 / p99 per call, client-side, over a loopback TCP connection to the "
        "embedded server, from sending the statement to having its rows.",
        "Behind a pooler, round trips do not change: the four messages go out in one pipeline "
        "and the server answers them together. The added time is processing four messages "
        "instead of one: an explicit transaction, and the three statement bounds set LOCAL "
        "by one SELECT of literals (the TCP liveness settings are left out there: the "
        "server's client is the pooler). The statement count changes too: pg_stat_statements "
        "sees BEGIN, set_config and COMMIT besides each statement.",
        "bare, unprepared is the statement as before without psycopg's prepared statements, "
        "which break on PgBouncer before 1.21 (and on any version with max_prepared_statements "
        "= 0): its difference to before is the planning that preparing saved, the other part "
        "of what a call behind a pooler costs more.",
        "What would shorten the pooled path: PgBouncer 1.21 or later with "
        "max_prepared_statements > 0 keeps protocol-level prepared statements working, which "
        "would win back the planning share; the reactor cannot tell that setting from the "
        "client side, so it does not prepare behind any pooler.",
    ]


async def _connect(dsn: str, *, prepared: bool, session: bool) -> Conn:
    conn = await psycopg.AsyncConnection.connect(
        db.conninfo(dsn, "bench"),
        autocommit=True,
        **({} if prepared else {"prepare_threshold": None}),
    )
    if session:
        await db.configure(conn)
    return conn


def _bare(conn: Conn) -> Call:
    async def call(query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        cur = await conn.execute(query, params)
        return await cur.fetchall() if cur.description is not None else []

    return call


def _now(conn: Conn) -> Call:
    async def call(query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        return await db.call(conn, query, params)

    return call


Statement = Callable[[int, int], tuple[str, dict[str, Any]]]

GRACE_S = 120.0


def _cheap() -> dict[str, Statement]:
    return {
        "health": lambda i, v: (
            REFERENCE_INSTALL.query("health"),
            db.health_params(REFERENCE_INSTALL, GRACE_S, db.HealthCheck("bench", 15.0, 86400.0)),
        ),
        "upcoming": lambda i, v: (
            REFERENCE_INSTALL.query("upcoming"),
            {"grace": 3600.0, "limit": 1000},
        ),
        "claim_hooks (none)": lambda i, v: (
            REFERENCE_INSTALL.query("claim_hooks"),
            {"hooks": ["judge"], "limit": 10, "lease": 60.0, "max_attempts": 40, "replica": "b"},
        ),
    }


def _recording(due: list[str], variants: int) -> dict[str, Statement]:
    # Warm-up rounds (i < 0) name a job that does not exist: each due job is written once, in
    # a timed round.
    return {
        "record_jobs (1 due job)": lambda i, v: (
            REFERENCE_INSTALL.query("record_jobs"),
            {"grace": GRACE_S, "hooks": [], "ids": [due[i * variants + v] if i >= 0 else NONE]},
        ),
    }


async def _time_all(
    runners: list[Call], statements: dict[str, Statement], calls: int
) -> dict[str, dict[str, Any]]:
    timings: dict[str, dict[str, Any]] = {}
    for name, make in statements.items():
        samples: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
        for i in range(-5, calls):  # five rounds of warm-up (and psycopg's preparing)
            for v, (variant, runner) in enumerate(zip(VARIANTS, runners, strict=True)):
                query, params = make(i, v)
                started = time.perf_counter()
                await runner(query, params)
                if i >= 0:
                    samples[variant].append(time.perf_counter() - started)
        timings[name] = samples
    return timings
