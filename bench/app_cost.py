"""app_cost: what installing the reactor costs the app's worker, a whole job's life at a time.

pgbench plays the worker, measured from outside the reactor's process: each transaction of its
script is one job's life as the worker drives it, five commits in a row: the insert with a
32 KiB document, three progress updates that add verdicts to results (status stays 'running'),
and the finishing update that sets status 'complete'. Commits are durable (fsync on, as in
production), so the figure is what the app pays per job, not what a throwaway cluster does.

'With' is the reactor as `reactor migrate` installs it on analysis_jobs: its triggers and its
walk index, with one replica listening. 'Without' drops both, so the table carries only the
app's primary key. Rounds alternate ABBA and each starts from an empty table after a
checkpoint, so neither configuration inherits the other's table or dirty pages. Beside each
figure is the share of the app's updates that were HOT, counted by the server: an index whose
key or predicate names a column the progress updates change makes every update write index
entries, the cost this benchmark exists to catch.
"""

from __future__ import annotations

import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from bench.common import (
    Conn,
    Context,
    Result,
    Server,
    Table,
    conditions,
    connect,
    open_server,
    ratio,
    safe_div,
)
from bench.trigger_overhead import Triggers
from bench.workload import bench_settings, replicas, wait_for_first_scan

TITLE = "The reactor's cost to the app's worker, per job's life, with durable commits"
GOAL = "job lives/s with the reactor >= 0.97x without (pairwise median)"

CLIENTS = 2
DOCUMENTS = 16
DOC_BYTES = 32 * 1024
# Durable commits: the embedded cluster's defaults turn fsync off for tests.
DURABLE = {"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on"}

# One job's life; each statement commits on its own, as the worker's do. -M prepared turns :job
# into a parameter.
JOB_LIFE = """\\set n random(1, {documents})
INSERT INTO analysis_jobs (id, run_id, status, doc_html)
SELECT gen_random_uuid(), gen_random_uuid(), 'running', d.doc FROM bench_docs d WHERE d.i = :n
RETURNING id AS job \\gset
UPDATE analysis_jobs SET results = coalesce(results, '{{}}'::jsonb)
       || '{{"citations": {{"verdict": "ok", "checked": 41}}}}', updated_at = now()
 WHERE id = :job;
UPDATE analysis_jobs SET results = results
       || '{{"links": {{"verdict": "warn", "broken": 2}}}}', updated_at = now()
 WHERE id = :job;
UPDATE analysis_jobs SET results = results
       || '{{"style": {{"verdict": "ok", "notes": ["passive voice"]}}}}', updated_at = now()
 WHERE id = :job;
UPDATE analysis_jobs SET status = 'complete', updated_at = now() WHERE id = :job;
"""
UPDATES_PER_LIFE = 4

# The reactor's indexes on analysis_jobs, whatever this version calls them.
REACTOR_INDEXES = """
SELECT c.relname, pg_get_indexdef(i.indexrelid)
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
 WHERE i.indrelid = 'analysis_jobs'::regclass AND c.relname LIKE '%reactor%'
 ORDER BY 1
"""

UPDATE_COUNTS = """
SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'analysis_jobs'::regclass
"""


async def run(ctx: Context) -> Result:
    """Set up one database, then alternate the configurations round by round."""
    quick = ctx.quick
    round_s = 2 if quick else 20
    order = ["with", "without", "without", "with"] * (1 if quick else 2)
    settings: dict[str, Any] = {
        "clients": CLIENTS,
        "round_s": round_s,
        "order": " ".join(order),
        "document_bytes": DOC_BYTES,
        "commits_per_job_life": 1 + UPDATES_PER_LIFE,
        "listening_replicas": 1,
        **DURABLE,
    }
    rounds: list[dict[str, Any]] = []
    async with open_server(DURABLE) as server:
        cond = await conditions(server, quick=quick)
        dsn = await server.app_database("app_cost", with_audit=False)
        async with await connect(dsn, "setup") as conn:
            await conn.execute(
                "CREATE TABLE bench_docs AS SELECT i, bench_doc(i, %s) AS doc "
                "FROM generate_series(1, %s) i",
                (DOC_BYTES, DOCUMENTS),
            )
            reactor = await Installed.read(conn)
        with tempfile.TemporaryDirectory(prefix="bench-pgbench-") as tmp:
            script = Path(tmp) / "job_life.sql"
            script.write_text(JOB_LIFE.format(documents=DOCUMENTS))
            async with replicas(
                bench_settings(dsn, grace=3600.0, scan_interval=3600.0), 1
            ) as running:
                await wait_for_first_scan(running)
                for config in order:
                    async with await connect(dsn, "setup") as conn:
                        await conn.execute("TRUNCATE analysis_jobs, reactor.pending")
                        await reactor.install(conn, config == "with")
                        await conn.execute("CHECKPOINT")
                        before = await _update_counts(conn)
                    # The replica runs in this process and pgbench in a child of its own: this
                    # process's CPU time over the round is what the replica took from the box.
                    cpu = time.process_time()
                    lives, tps = await _pgbench(server, dsn, script, round_s)
                    cpu = time.process_time() - cpu
                    async with await connect(dsn, "check") as conn:
                        updates, hot = await _settled_counts(conn, before, lives)
                    rounds.append(
                        {
                            "config": config,
                            "tps": tps,
                            "lives": lives,
                            "updates": updates,
                            "hot": hot,
                            "hot_ratio": safe_div(hot, updates),
                            "replica_cpu_share": cpu / round_s,
                        }
                    )

    def of(config: str, key: str) -> list[float]:
        return [r[key] for r in rounds if r["config"] == config]

    # ABBA: rounds 2i and 2i+1 are one pair, measured back to back.
    pairs = [rounds[i : i + 2] for i in range(0, len(rounds), 2)]
    pair_ratios = [
        safe_div(
            next(r["tps"] for r in pair if r["config"] == "with"),
            next(r["tps"] for r in pair if r["config"] == "without"),
        )
        for pair in pairs
    ]
    median = statistics.median(pair_ratios)
    hot_with = safe_div(sum(of("with", "hot")), sum(of("with", "updates")))
    hot_without = safe_div(sum(of("without", "hot")), sum(of("without", "updates")))
    met = median >= 0.97
    table = Table(
        ["configuration", "rounds", "mean job lives/s", "min", "max", "HOT updates", "vs without"]
    )
    for config, label in (
        ("with", "with the reactor (triggers, walk index, a listening replica)"),
        ("without", "without the reactor's triggers and index"),
    ):
        values = of(config, "tps")
        hot_share = safe_div(sum(of(config, "hot")), sum(of(config, "updates")))
        table.add(
            label,
            len(values),
            f"{statistics.fmean(values):,.1f}",
            f"{min(values):,.1f}",
            f"{max(values):,.1f}",
            f"{hot_share:.1%}",
            ratio(safe_div(statistics.fmean(values), statistics.fmean(of("without", "tps")))),
        )
    notes = [
        f"pgbench -M prepared, {CLIENTS} connections, {round_s:g} s per round; one pgbench "
        f"transaction is one job's life, {1 + UPDATES_PER_LIFE} statements each committed on "
        f"its own: the insert with a {DOC_BYTES // 1024} KiB document (TOASTed), three progress "
        "updates adding verdicts to results, and the finishing update. fsync, full_page_writes "
        "and synchronous_commit on.",
        "Rounds in order (job lives/s, HOT share of the updates): "
        + ", ".join(f"{r['config']} {r['tps']:,.1f} ({r['hot_ratio']:.0%})" for r in rounds)
        + ". Pairwise ratios, with / without: "
        + ", ".join(ratio(x) for x in pair_ratios)
        + f"; median {ratio(median)}, range {ratio(min(pair_ratios))}-{ratio(max(pair_ratios))}.",
        f"'With' is what `reactor migrate` installs on analysis_jobs: the triggers "
        f"({', '.join(reactor.triggers.names)}) and the index ({', '.join(reactor.index_names)}); "
        "'without' drops them, leaving the app's primary key. Each round starts from an "
        "empty table (TRUNCATE) after a CHECKPOINT.",
        f"HOT: {hot_with:.1%} of the updates with the reactor, {hot_without:.1%} without "
        "(n_tup_hot_upd / n_tup_upd over each round's updates). The progress updates change "
        "results and updated_at only, which no index names, so they stay HOT either way; the "
        "finishing update changes status, which the walk index's predicate names, so with the "
        f"reactor it writes index entries: at most {UPDATES_PER_LIFE - 1} in "
        f"{UPDATES_PER_LIFE} updates can be HOT. That one cold update per job is the index's "
        "whole price.",
    ]
    cpu_with = statistics.fmean(of("with", "replica_cpu_share"))
    cpu_without = statistics.fmean(of("without", "replica_cpu_share"))
    notes.append(
        f"The listening replica's share of one core during the rounds: {cpu_with:.1%} with, "
        f"{cpu_without:.1%} without (this process's CPU time; pgbench runs in a child). On "
        "this 2-core machine it is taken from PostgreSQL and pgbench."
    )
    if not met:
        notes.append(
            "Below the goal. Per job the reactor adds, on the finishing update only: the "
            "trigger call, the job's row and two index entries in reactor.pending, a NOTIFY "
            "(whose commit-time lock on the server-wide queue serialises the two clients' "
            "finishing commits), the walk index's entry, and that update's loss of HOT; and "
            "for each notification, the replica's backend and event loop wake. Commits are "
            f"cheap on this disk ({statistics.fmean(of('without', 'tps')) * 5:,.0f} durable "
            "commits/s without the reactor), so those costs weigh more than on a server whose "
            "commits wait for a disk, and at this rate of jobs finishing (hundreds per second, "
            "far above a real app's) the replica's CPU comes out of the same two cores. What "
            "would close it: a replica on a host of its own, or the triggers installed not to "
            "notify (`reactor migrate --no-notify`), whose cost trigger_overhead measures."
        )
    with_tps = statistics.fmean(of("with", "tps"))
    without_tps = statistics.fmean(of("without", "tps"))
    headline = (
        f"{with_tps:,.1f} vs {without_tps:,.1f} job lives/s: {ratio(median)} pairwise median "
        f"(range {ratio(min(pair_ratios))}-{ratio(max(pair_ratios))}; goal >= 0.97x); "
        f"HOT {hot_with:.0%} with, "
        f"{hot_without:.0%} without"
    )
    return Result(
        name="app_cost",
        title=TITLE,
        goal=GOAL,
        met=met,
        headline=headline,
        table=table,
        figures={
            "rounds": rounds,
            "pair_ratios": pair_ratios,
            "median_ratio": median,
            "hot_ratio_with": hot_with,
            "hot_ratio_without": hot_without,
            "replica_cpu_share_with": cpu_with,
            "replica_cpu_share_without": cpu_without,
        },
        settings=settings,
        conditions=cond,
        notes=notes,
    )


class Installed:
    """The reactor's objects on analysis_jobs as `reactor migrate` left them."""

    def __init__(self, triggers: Triggers, indexes: list[tuple[str, str]]) -> None:
        self.triggers = triggers
        self.indexes = indexes  # (name, CREATE INDEX ...)

    @property
    def index_names(self) -> list[str]:
        """The index names."""
        return [name for name, _ in self.indexes]

    @classmethod
    async def read(cls, conn: Conn) -> Installed:
        """Read the installed triggers and indexes."""
        cur = await conn.execute(REACTOR_INDEXES)
        indexes = [(str(name), str(definition)) for name, definition in await cur.fetchall()]
        if not indexes:
            raise RuntimeError("no reactor index on analysis_jobs; nothing to measure")
        return cls(await Triggers.read(conn), indexes)

    async def install(self, conn: Conn, present: bool) -> None:
        """Put the triggers and indexes in place, or remove them (on an empty table: instant)."""
        await self.triggers.install(conn, "with" if present else "without")
        for name, definition in self.indexes:
            await conn.execute(f"DROP INDEX IF EXISTS {name}")
            if present:
                await conn.execute(definition)


async def _update_counts(conn: Conn) -> tuple[int, int]:
    cur = await conn.execute(UPDATE_COUNTS)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def _settled_counts(conn: Conn, before: tuple[int, int], lives: int) -> tuple[int, int]:
    """(updates, HOT updates) of the round, once every pgbench session has flushed its counts.

    A backend flushes its statistics when it exits, which may come a moment after pgbench
    returns: wait until the round's updates are all counted (a life cut off by the end of the
    round may add a few more).
    """
    expected = lives * UPDATES_PER_LIFE
    with anyio.move_on_after(10):
        while True:
            upd, hot = await _update_counts(conn)
            if upd - before[0] >= expected:
                break
            await anyio.sleep(0.1)
    upd, hot = await _update_counts(conn)
    return upd - before[0], hot - before[1]


async def _pgbench(server: Server, dsn: str, script: Path, seconds: int) -> tuple[int, float]:
    """(job lives completed, job lives per second)."""
    argv = [
        str(server.bin_dir / "pgbench"), "-n", "-M", "prepared", "-c", str(CLIENTS),
        "-j", str(CLIENTS), "-T", str(seconds), "-f", str(script), dsn,
    ]  # fmt: skip
    done = await anyio.run_process(argv, check=False)
    out = done.stdout.decode()
    if done.returncode != 0:
        raise RuntimeError(f"pgbench failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
    lives = re.search(r"number of transactions actually processed: (\d+)", out)
    if tps is None or lives is None:
        raise RuntimeError(f"no tps in pgbench output: {out[-2000:]}")
    return int(lives.group(1)), float(tps.group(1))
