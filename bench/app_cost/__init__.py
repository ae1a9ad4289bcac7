"""app_cost: what installing the reactor costs the app's worker, a whole job's life at a time.

pgbench plays the worker, measured from outside the reactor's process: each transaction of its
script is one job's life as the worker drives it, five commits in a row: the insert with a
32 KiB document, three progress updates that add verdicts to results (status stays 'running'),
and the finishing update that sets status 'complete'. Commits are durable (fsync on, as in
production), so the figure is what the app pays per job, not what a throwaway cluster does.
One reactor replica listens throughout every round, as in production.

Several installs on analysis_jobs are compared in one run (CONFIGS): none of the reactor's
triggers or indexes; a trigger that does nothing but notify on the transition into a terminal
status, the floor PostgreSQL sets for any install that notifies; the triggers and the walk index
exactly as `reactor migrate` left them (read back from the catalog, so whatever SQL the code
under test installs is what is measured), divided by that floor; the same with the job triggers
installed not to notify (`reactor migrate --no-notify`), divided by none; and 'none' a second
time under another name. Two more, for a measurement only: the default and the quiet install
with the queue, reactor.pending, made UNLOGGED right after the install (its rows, their index
entries and the replica's deletes then write no WAL), each divided by the same floor as its
logged twin and compared with that twin's round of the same set: how much of the gap to the
floor is the queue row's WAL. Durable commits on a shared VM's disk and CPUs can
vary by a factor of two between two rounds a few seconds apart, so a single comparison means
little: the second 'none' states the noise floor, and an effect is only an effect where it
stands clear of it.

The rounds run in sets: every install once per set, back to back, in an order that rotates from
set to set as the rows of a Williams square, so that each install runs in every position and
after every other install equally often. Each install is compared with its floor's round of its
own set; the median of those per-set ratios and their interquartile range are the figure. Each
round starts from an empty table after a checkpoint, so no install inherits another's table or
dirty pages. Per round the server also counts the WAL written, the share of the app's updates that
were HOT (an index whose key or predicate names a column an update changes makes that update
write index entries), and the time spent in the job trigger's function (track_functions).
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from bench import pgbench
from bench.conn import Conn, connect, dbname, scalar
from bench.result import Context, Result, Table, conditions
from bench.server import Server, open_server
from bench.stats import percentile, ratio, safe_div
from bench.trigger_overhead import Triggers
from bench.workload import (
    APP,
    RESULTS,
    bench_settings,
    insert_jobs,
    replicas,
    wait_for_first_scan,
    wait_until_recorded,
)

TITLE = "The reactor's cost to the app's worker, per job's life, with durable commits"
GOAL = (
    "job lives/s as `reactor migrate` installs it >= 0.99x of a trigger that only notifies (the "
    "floor of a notifying install; median of per-set ratios); installed not to notify >= 0.99x "
    "of no trigger; also: WAL per life <= 1.10x, HOT share >= 0.95 of none's, the job trigger "
    "<= 25 us per finishing update"
)

CLIENTS = 2
DOCUMENTS = 16
DOC_BYTES = 32 * 1024
# Durable commits: the embedded cluster's defaults turn fsync off for tests.
DURABLE = {"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on"}
SERVER = {
    **DURABLE,
    # Times PL/pgSQL functions, the job trigger's among them (pg_stat_user_functions).
    "track_functions": "pl",
    # Every round starts from an empty table, so vacuum has nothing to carry from one round to
    # the next; a worker arriving at a random moment in some rounds would only add its own I/O
    # and WAL to whichever install happened to be running.
    "autovacuum": "off",
}

# Fourteen sets: a Williams square over seven installs is fourteen rows (the square and its
# mirror).
SETS = 14
ROUND_S = 5
QUICK_ROUND_S = 2


@dataclass(frozen=True)
class Config:
    """One install on analysis_jobs: the job triggers' form and whether the reactor's indexes
    are there. ``extra`` is SQL run after that, for a variant of the installed objects;
    ``queue_unlogged`` makes the queue (reactor.pending) UNLOGGED after it, where every other
    install has it logged, as installed. ``twin``: the install it is that variant of."""

    label: str
    job_triggers: str  # "with" (as installed), "quiet" (--no-notify), "notify_only", "without"
    indexes: bool
    floor: str  # the install this one is divided by: what PostgreSQL makes its like pay at least
    extra: tuple[str, ...] = ()
    queue_unlogged: bool = False
    twin: str | None = None


# The installs compared, by name; a variant is one more entry. Each is divided by its floor:
# a notifying install by 'notify_only', a trigger that does nothing but pg_notify on the
# transition into a terminal status (what every notifying commit pays: the trigger call and the
# commit-time lock on the cluster's notification queue), the rest by BASELINE, no trigger.
# NOISE is the baseline again under another name, so its ratio shows the noise.
CONFIGS: dict[str, Config] = {
    "none": Config("no reactor triggers or index on analysis_jobs", "without", False, "none"),
    "none_again": Config(
        "none again, as if another install: the noise floor", "without", False, "none"
    ),
    "notify_only": Config(
        "a trigger that only notifies on the transition: the notifying floor",
        "notify_only",
        False,
        "none",
    ),
    "default": Config(
        "as `reactor migrate` installs it: triggers and walk index", "with", True, "notify_only"
    ),
    "quiet": Config(
        "the same, job triggers installed not to notify (--no-notify)", "quiet", True, "none"
    ),
    # A measurement only: what an unlogged queue would save (a real one would need the queue
    # rebuilt after a crash or a promotion, which empties it).
    "default_unlogged": Config(
        "default, queue unlogged: reactor.pending SET UNLOGGED after the install",
        "with",
        True,
        "notify_only",
        queue_unlogged=True,
        twin="default",
    ),
    "quiet_unlogged": Config(
        "quiet, queue unlogged: reactor.pending SET UNLOGGED after the install",
        "quiet",
        True,
        "none",
        queue_unlogged=True,
        twin="quiet",
    ),
}
BASELINE = "none"
NOISE = "none_again"

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

# The schema of the functions the reactor's triggers on analysis_jobs call: the reactor's.
REACTOR_SCHEMA = """
SELECT DISTINCT p.pronamespace::regnamespace::text
  FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
 WHERE t.tgrelid = 'analysis_jobs'::regclass AND NOT t.tgisinternal AND t.tgname LIKE 'reactor%'
"""

UPDATE_COUNTS = """
SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'analysis_jobs'::regclass
"""

# The job trigger's own time: total_time includes what it calls (the queue insert, the NOTIFY's
# queueing), so only the trigger function is summed, never its callees as well.
TRIGGER_TIME = """
SELECT coalesce(sum(total_time), 0), coalesce(sum(calls), 0) FROM pg_stat_user_functions
 WHERE (schemaname = %s AND funcname LIKE 'job\\_changed%%')
    OR (schemaname = 'public' AND funcname = 'bench_notify_only')
"""

# The queue's persistence: 'p' logged, 'u' unlogged.
QUEUE_PERSISTENCE = "SELECT relpersistence FROM pg_class WHERE oid = %s::regclass"

# The foreign keys to or from the queue: a logged table may not reference an unlogged one, so
# any of these could stand in the way of SET UNLOGGED.
QUEUE_FOREIGN_KEYS = """
SELECT conname, conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint
 WHERE contype = 'f' AND (conrelid = %(queue)s::regclass OR confrelid = %(queue)s::regclass)
"""

# The record check: jobs finished with an unlogged queue, recorded by a replica of short grace.
CHECK_JOBS = 20
CHECK_GRACE_S = 0.5

PGBENCH_SESSIONS = """
SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = 'pgbench'
"""


@dataclass(frozen=True)
class Counters:
    """The server's running totals that a round is the difference of."""

    wal: int  # pg_current_wal_lsn() as a number of bytes
    updates: int
    hot: int
    trigger_ms: float
    trigger_calls: int


async def run(ctx: Context) -> Result:
    """Set up one database, then run the sets of rounds, every install once per set."""
    quick = ctx.quick
    round_s = QUICK_ROUND_S if quick else ROUND_S
    sets = 1 if quick else SETS
    orders = set_orders(list(CONFIGS), sets)
    settings: dict[str, Any] = {
        "clients": CLIENTS,
        "round_s": round_s,
        "sets": sets,
        "configs": ", ".join(CONFIGS),
        "document_bytes": DOC_BYTES,
        "commits_per_job_life": 1 + UPDATES_PER_LIFE,
        "listening_replicas": 1,
        "queue_unlogged": ", ".join(n for n, c in CONFIGS.items() if c.queue_unlogged),
        **SERVER,
    }
    rounds: list[dict[str, Any]] = []
    async with open_server(SERVER) as server:
        cond = await conditions(server, quick=quick)
        dsn = await server.app_database("app_cost", with_audit=False)
        async with await connect(dsn, "setup") as conn:
            await add_documents(conn)
            reactor = await Installed.read(conn)
            track_functions = str(await scalar(conn, "SHOW track_functions"))
        with tempfile.TemporaryDirectory(prefix="bench-pgbench-") as tmp:
            script = Path(tmp) / "job_life.sql"
            script.write_text(JOB_LIFE.format(documents=DOCUMENTS))
            async with replicas(
                bench_settings(dsn, grace=3600.0, scan_interval=3600.0), 1
            ) as running:
                await wait_for_first_scan(running)
                # A round that is not counted: the fresh cluster's first rounds create the WAL
                # segments that later rounds recycle, and would be slower for it.
                await _round(server, dsn, script, reactor, "default", round_s)
                for number, order in enumerate(orders, 1):
                    for position, name in enumerate(order, 1):
                        found = await _round(server, dsn, script, reactor, name, round_s)
                        rounds.append({"set": number, "position": position, **found})
        # Uncounted: the installs with the queue unlogged still get their jobs recorded.
        checks = [
            await record_check(dsn, reactor, config)
            for config in CONFIGS.values()
            if config.queue_unlogged
        ]

    summary = {name: _summarize(name, rounds) for name in CONFIGS}
    unlogged = {name: c.twin for name, c in CONFIGS.items() if c.twin is not None}
    twins = {name: paired(rounds, name, twin) for name, twin in unlogged.items()}
    default, quiet, noise = summary["default"], summary["quiet"], summary[NOISE]
    floor = summary["notify_only"]
    goals = [
        ("default >= 0.99x notify-only", default["median"] >= 0.99, ratio(default["median"])),
        ("quiet >= 0.99x none", quiet["median"] >= 0.99, ratio(quiet["median"])),
        (
            "default WAL per life <= 1.10x none's",
            default["wal_vs_base"] <= 1.10,
            ratio(default["wal_vs_base"]),
        ),
        (
            "default HOT share >= 0.95 of none's",
            default["hot_vs_base"] >= 0.95,
            f"{default['hot_vs_base']:.2f}",
        ),
        (
            "job trigger <= 25 us per finishing update (default)",
            None if math.isnan(default["trigger_us"]) else default["trigger_us"] <= 25,
            f"{default['trigger_us']:.1f} us",
        ),
    ]
    verdicts = {True: "met", False: "missed", None: "not measured"}
    met = bool(goals[0][1]) and bool(goals[1][1])

    table = Table(
        [
            "install",
            "sets",
            "lives/s vs its floor: median [IQR]",
            "floor",
            "mean lives/s",
            "WAL/life",
            "WAL vs none",
            "HOT share",
            "HOT vs none",
            "trigger us/finish",
        ]
    )
    for name, config in CONFIGS.items():
        s = summary[name]
        table.add(
            f"{name}: {config.label}",
            s["sets"],
            "1 (baseline)" if name == BASELINE else _spread(s),
            config.floor,
            f"{s['mean_tps']:,.1f}",
            f"{s['wal_per_life'] / 1024:,.1f} KiB",
            ratio(s["wal_vs_base"]),
            f"{s['hot_share']:.1%}",
            f"{s['hot_vs_base']:.2f}",
            "-" if math.isnan(s["trigger_us"]) else f"{s['trigger_us']:.1f}",
        )

    noise_text = (
        f"none vs none: median {noise['median']:.2f}, IQR [{noise['q1']:.2f}-{noise['q3']:.2f}]"
    )
    notes = [
        f"pgbench -M prepared, {CLIENTS} connections, {round_s:g} s per round; one pgbench "
        f"transaction is one job's life, {1 + UPDATES_PER_LIFE} statements each committed on "
        f"its own: the insert with a {DOC_BYTES // 1024} KiB document (TOASTed), three progress "
        "updates adding verdicts to results, and the finishing update. fsync, full_page_writes "
        "and synchronous_commit on; autovacuum off (every round starts from an empty table); "
        "one reactor replica listening throughout.",
        f"{sets} set(s) of {len(CONFIGS)} rounds, each install once per set, in an order that "
        "rotates from set to set (rows of a Williams square: every install in every position, "
        "after every other, equally often), after one uncounted warm-up round. Each round "
        "starts from an empty table (TRUNCATE) after a CHECKPOINT. Lives/s vs none is each "
        "set's ratio to its floor's round in that set ('default' and 'default_unlogged' to "
        "'notify_only', every other to 'none'): median and interquartile range over the sets.",
        f"Noise floor, {noise_text}: 'none_again' is the same install as 'none', so its "
        "spread is what this machine's disk and CPU do between two rounds of one set. A ratio "
        "whose IQR overlaps that one is not told apart from no cost at all: "
        + ", ".join(
            f"{name} {'clear of it' if _clear(summary[name], noise) else 'within it'}"
            for name in CONFIGS
            if name not in (BASELINE, NOISE)
        )
        + ".",
        "Sets (job lives/s): "
        + "; ".join(
            f"{number}: "
            + ", ".join(f"{r['config']} {r['tps']:,.0f}" for r in rounds if r["set"] == number)
            for number in range(1, sets + 1)
        )
        + ".",
        f"'default' is what `reactor migrate` left on analysis_jobs, read back from the catalog: "
        f"the triggers ({', '.join(reactor.triggers.names)}) and the index "
        f"({'; '.join(definition for _, definition in reactor.indexes)}). 'quiet' renders the "
        "job triggers as `reactor migrate --no-notify` does (jobs queued in reactor.pending, "
        "nobody notified). 'none' drops the reactor's triggers and index on analysis_jobs, "
        "leaving the app's primary key; the reactor's schema and its triggers on analysis_runs "
        "stay (restored as installed before every round). 'notify_only' is 'none' plus a "
        "trigger that does nothing but pg_notify on the transition into a terminal status, on "
        "the reactor's channel with its payload (the listening replica receives the same "
        "messages): the floor PostgreSQL sets for any install that notifies.",
        "WAL per life: pg_current_wal_lsn() after the round minus before (after the "
        "checkpoint), over the round's job lives; what the replica writes meanwhile is "
        "included. HOT share: n_tup_hot_upd / n_tup_upd over the round's updates. Trigger "
        "time: pg_stat_user_functions.total_time of the reactor's job_changed* functions (of "
        "bench_notify_only for 'notify_only') "
        f"(track_functions = {track_functions}), over the round's job lives; it includes the "
        "functions the trigger calls, not the NOTIFY's work at commit. Stats are read after "
        "pgbench's sessions have exited, which flushes them.",
        "Goals: "
        + "; ".join(f"{text}: {verdicts[ok]} ({value})" for text, ok, value in goals)
        + f" (quiet's trigger: {quiet['trigger_us']:.1f} us per finish; the notify-only "
        f"trigger's: {floor['trigger_us']:.1f} us; notify-only vs none: {_spread(floor)}).",
        "Queue unlogged (a measurement only: an unlogged queue would need a rebuild after "
        "every crash and promotion): "
        + "; ".join(
            f"{name} {_spread(summary[name])} of {CONFIGS[name].floor} vs {twin}'s "
            f"{_spread(summary[twin])}, {_spread(twins[name])} of {twin} in the same set, "
            f"so {gap_closed(summary[name], summary[twin])} of {twin}'s gap to its floor; "
            f"WAL/life {summary[name]['wal_per_life'] / 1024:,.1f} KiB vs "
            f"{summary[twin]['wal_per_life'] / 1024:,.1f} KiB"
            for name, twin in unlogged.items()
        )
        + ". The share of the gap is (unlogged median - logged median) / (1 - logged median). "
        + checks_text(checks),
        "The listening replica's share of one core during the rounds (this process's CPU "
        "time; pgbench runs in a child): "
        + ", ".join(f"{name} {summary[name]['replica_cpu_share']:.1%}" for name in CONFIGS)
        + ". On this machine that is taken from PostgreSQL and pgbench.",
    ]
    if default["hot_vs_base"] < 0.95:
        notes.append(
            "HOT: the progress updates change results and updated_at only, which no reactor "
            "index names, so they stay HOT; the finishing update changes status, which the "
            "walk index's predicate names, so with the index it writes index entries: at most "
            f"{UPDATES_PER_LIFE - 1} in {UPDATES_PER_LIFE} of the app's updates can be HOT. "
            "That is a property of the index as designed, not noise."
        )
    if not met:
        notes.append(
            "Below the goal. Above its floor the reactor adds, on the finishing update only: "
            "its trigger function (the guard, the eligibility test, the notification queue's "
            "limit), the job's row and its index entries in reactor.pending, the walk index's "
            "entry and that update's loss of HOT. The NOTIFY itself, whose commit-time lock on "
            "the server-wide queue serialises the clients' finishing commits, is in the floor: "
            "'notify_only' against 'none' is its price. At this rate of jobs finishing "
            "(hundreds per second, far above a real app's) the replica's CPU also comes out of "
            "the same cores."
        )
    headline = (
        f"default {_spread(default)} of notify-only's {floor['mean_tps']:,.0f}, quiet "
        f"{_spread(quiet)} of none's {summary[BASELINE]['mean_tps']:,.0f} job lives/s "
        f"(notify-only {_spread(floor)} of none; {noise_text}); WAL/life "
        f"{ratio(default['wal_vs_base'])}; HOT {default['hot_share']:.0%} vs "
        f"{summary[BASELINE]['hot_share']:.0%}; trigger {default['trigger_us']:.1f} us/finish; "
        "queue unlogged: " + ", ".join(f"{name} {_spread(summary[name])}" for name in unlogged)
    )
    return Result(
        met=met,
        headline=headline,
        table=table,
        figures={
            "rounds": rounds,
            "orders": orders,
            "configs": summary,
            "vs_logged_twin": twins,
            "record_checks": checks,
            "noise_floor": {k: noise[k] for k in ("median", "q1", "q3", "ratios")},
            "goals": {text: ok for text, ok, _ in goals},
        },
        settings=settings,
        conditions=cond,
        notes=notes,
    )


async def add_documents(conn: Conn) -> None:
    """The documents the job lives write (``bench_docs``), made once in each database."""
    await conn.execute(
        "CREATE TABLE bench_docs AS SELECT i, bench_doc(i, %s) AS doc"
        " FROM generate_series(1, %s) i",
        (DOC_BYTES, DOCUMENTS),
    )


def set_orders(names: Sequence[str], sets: int) -> list[list[str]]:
    """The order of each set: the rows of a Williams square over ``names``, in turn.

    In a Williams square every name is once in each position, and follows every other name
    exactly once (for an odd count, the square and its mirror together), so neither a slot
    in the set nor a predecessor's after-effects favour any install.
    """
    n = len(names)
    first = [0]
    for step in range(1, n):
        first.append((step + 1) // 2 if step % 2 else n - step // 2)
    rows = [[(k + shift) % n for k in first] for shift in range(n)]
    if n % 2:
        rows += [list(reversed(row)) for row in rows]
    return [[names[k] for k in rows[i % len(rows)]] for i in range(sets)]


async def _round(
    server: Server, dsn: str, script: Path, reactor: Installed, name: str, seconds: int
) -> dict[str, Any]:
    """One round of ``seconds`` on install ``name``, from an empty table; what it measured."""
    async with await connect(dsn, "setup") as conn:
        await conn.execute(f"TRUNCATE analysis_jobs, {reactor.schema}.pending")
        await reactor.install(conn, CONFIGS[name])
        await conn.execute("CHECKPOINT")
        before = await _counters(conn, reactor.schema)
    # The replica runs in this process and pgbench in a child of its own: this process's CPU
    # time over the round is what the replica took from the box.
    cpu = time.process_time()
    lives, tps = await _pgbench(server, dsn, script, seconds)
    cpu = time.process_time() - cpu
    async with await connect(dsn, "check") as conn:
        await _settle(conn, dbname(dsn), before, lives)
        after = await _counters(conn, reactor.schema)
    return {
        "config": name,
        "tps": tps,
        "lives": lives,
        "wal_bytes": after.wal - before.wal,
        "updates": after.updates - before.updates,
        "hot": after.hot - before.hot,
        "trigger_ms": after.trigger_ms - before.trigger_ms,
        "trigger_calls": after.trigger_calls - before.trigger_calls,
        "replica_cpu_share": cpu / seconds,
    }


def _summarize(name: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One install's figures over the run: per-set ratios to its floor, and totals (WAL and HOT
    against the baseline's)."""
    mine = [r for r in rounds if r["config"] == name]
    base = {r["set"]: r for r in rounds if r["config"] == BASELINE}
    floor = {r["set"]: r for r in rounds if r["config"] == CONFIGS[name].floor}
    ratios = [safe_div(r["tps"], floor[r["set"]]["tps"]) for r in mine]
    lives = sum(r["lives"] for r in mine)
    base_lives = sum(r["lives"] for r in base.values())
    wal_per_life = safe_div(sum(r["wal_bytes"] for r in mine), lives)
    base_wal = safe_div(sum(r["wal_bytes"] for r in base.values()), base_lives)
    hot_share = safe_div(sum(r["hot"] for r in mine), sum(r["updates"] for r in mine))
    base_hot = safe_div(
        sum(r["hot"] for r in base.values()), sum(r["updates"] for r in base.values())
    )
    return {
        "sets": len(mine),
        "ratios": ratios,
        "median": statistics.median(ratios),
        "q1": percentile(ratios, 0.25),
        "q3": percentile(ratios, 0.75),
        "mean_tps": statistics.fmean(r["tps"] for r in mine),
        "wal_per_life": wal_per_life,
        "wal_vs_base": safe_div(wal_per_life, base_wal),
        "hot_share": hot_share,
        "hot_vs_base": safe_div(hot_share, base_hot),
        "trigger_calls": sum(r["trigger_calls"] for r in mine),
        # No calls counted: no trigger, or a server not timing functions (not zero time).
        "trigger_us": safe_div(sum(r["trigger_ms"] for r in mine) * 1000, lives)
        if sum(r["trigger_calls"] for r in mine)
        else math.nan,
        "replica_cpu_share": statistics.fmean(r["replica_cpu_share"] for r in mine),
    }


def paired(rounds: list[dict[str, Any]], name: str, other: str, **among: Any) -> dict[str, Any]:
    """``name``'s rounds over ``other``'s of the same set (and of the same ``among``, e.g. the
    client count): the median of those ratios and their interquartile range."""

    def mine(config: str) -> list[dict[str, Any]]:
        return [
            r
            for r in rounds
            if r["config"] == config and all(r[key] == value for key, value in among.items())
        ]

    theirs = {r["set"]: r["tps"] for r in mine(other)}
    ratios = [safe_div(r["tps"], theirs[r["set"]]) for r in mine(name)]
    return {
        "ratios": ratios,
        "median": statistics.median(ratios),
        "q1": percentile(ratios, 0.25),
        "q3": percentile(ratios, 0.75),
    }


def gap_closed(unlogged: dict[str, Any], logged: dict[str, Any]) -> str:
    """The share of the logged install's gap to its floor that the unlogged one closes."""
    gap = 1 - logged["median"]
    if gap <= 0:
        return "none (the logged install is at or above its floor: no gap)"
    return f"{(unlogged['median'] - logged['median']) / gap:.0%}"


def checks_text(checks: list[dict[str, Any]]) -> str:
    """The record checks, in a sentence."""
    return (
        "Record check (uncounted, after the rounds): "
        + "; ".join(
            f"{c['config']} (reactor.pending relpersistence '{c['persistence']}'): "
            f"{c['jobs'] - c['missing']} of {c['jobs']} finished jobs recorded by a replica of "
            f"{CHECK_GRACE_S:g} s grace, {c['left_in_queue']} left in the queue"
            for c in checks
        )
        + (
            f"; foreign keys to or from the queue: {checks[0]['foreign_keys'] or 'none'}."
            if checks
            else "."
        )
    )


async def set_queue_persistence(conn: Conn, schema: str, *, unlogged: bool) -> None:
    """Make the queue UNLOGGED, or LOGGED as installed, unless it already is (an empty table:
    the rewrite is instant, and its indexes follow it)."""
    queue = f"{schema}.pending"
    wanted = "u" if unlogged else "p"
    if str(await scalar(conn, QUEUE_PERSISTENCE, (queue,))) == wanted:
        return
    await conn.execute(f"ALTER TABLE {queue} SET {'UNLOGGED' if unlogged else 'LOGGED'}")
    found = str(await scalar(conn, QUEUE_PERSISTENCE, (queue,)))
    if found != wanted:
        raise RuntimeError(f"{queue} is '{found}' after the ALTER, not '{wanted}'")


async def record_check(dsn: str, reactor: Installed, config: Config) -> dict[str, Any]:
    """Whether jobs finished with ``config`` in place get recorded: CHECK_JOBS jobs finished
    one by one by the worker, then a replica with a short grace (and scan interval) given
    30 s to record them all; with what was left in the queue afterwards."""
    queue = f"{reactor.schema}.pending"
    async with await connect(dsn, "check") as conn:
        await conn.execute(f"TRUNCATE analysis_jobs, {queue}")
        await reactor.install(conn, config)
        persistence = str(await scalar(conn, QUEUE_PERSISTENCE, (queue,)))
        cur = await conn.execute(QUEUE_FOREIGN_KEYS, {"queue": queue})
        keys = ", ".join(f"{n} ({a} -> {b})" for n, a, b in await cur.fetchall())
        ids = await insert_jobs(conn, CHECK_JOBS, doc_bytes=2000)
        settings = bench_settings(dsn, grace=CHECK_GRACE_S, scan_interval=1.0)
        async with replicas(settings, 1) as running:
            await wait_for_first_scan(running)
            for job in ids:
                await conn.execute(*APP.finish(job, verdicts=RESULTS))
            missing = await wait_until_recorded(conn, within=30)
        left = int(await scalar(conn, f"SELECT count(*) FROM {queue}"))
    return {
        "config": config.label.split(":")[0],
        "persistence": persistence,
        "jobs": len(ids),
        "missing": missing,
        "left_in_queue": left,
        "foreign_keys": keys,
    }


def _clear(s: dict[str, Any], noise: dict[str, Any]) -> bool:
    """Whether the interquartile ranges of ``s`` and the noise floor do not overlap."""
    return bool(s["q3"] < noise["q1"] or s["q1"] > noise["q3"])


def _spread(s: dict[str, Any]) -> str:
    """A median ratio with its interquartile range, e.g. ``0.93x [0.91-0.95]``."""
    return f"{s['median']:.2f}x [{s['q1']:.2f}-{s['q3']:.2f}]"


class Installed:
    """The reactor's objects on the app's tables as `reactor migrate` left them."""

    def __init__(
        self,
        triggers: Triggers,
        run_triggers: Triggers,
        indexes: list[tuple[str, str]],
        schema: str,
    ) -> None:
        self.triggers = triggers
        self.run_triggers = run_triggers
        self.indexes = indexes  # (name, CREATE INDEX ...)
        self.schema = schema

    @classmethod
    async def read(cls, conn: Conn) -> Installed:
        """Read the installed triggers and indexes, and the reactor's schema."""
        cur = await conn.execute(REACTOR_INDEXES)
        indexes = [(str(name), str(definition)) for name, definition in await cur.fetchall()]
        if not indexes:
            raise RuntimeError("no reactor index on analysis_jobs; nothing to measure")
        return cls(
            await Triggers.read(conn),
            await Triggers.read(conn, "analysis_runs"),
            indexes,
            str(await scalar(conn, REACTOR_SCHEMA)),
        )

    async def install(self, conn: Conn, config: Config) -> None:
        """Put ``config`` in place (on an empty table: instant)."""
        # The quiet form re-renders every trigger the reactor has, analysis_runs' too: put
        # those back as installed first, so that a quiet round leaves nothing to the next.
        await self.run_triggers.install(conn, "with")
        await self.triggers.install(conn, config.job_triggers)
        for name, definition in self.indexes:
            await conn.execute(f"DROP INDEX IF EXISTS {name}")
            if config.indexes:
                await conn.execute(definition)
        for statement in config.extra:
            await conn.execute(statement)
        await set_queue_persistence(conn, self.schema, unlogged=config.queue_unlogged)


async def _counters(conn: Conn, schema: str) -> Counters:
    wal = int(await scalar(conn, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))
    cur = await conn.execute(UPDATE_COUNTS)
    row = await cur.fetchone()
    assert row is not None
    cur = await conn.execute(TRIGGER_TIME, (schema,))
    timed = await cur.fetchone()
    assert timed is not None
    return Counters(wal, int(row[0]), int(row[1]), float(timed[0]), int(timed[1]))


async def _settle(conn: Conn, database: str, before: Counters, lives: int) -> None:
    """Wait until every pgbench session has flushed its statistics.

    A backend flushes them as it exits (before it leaves pg_stat_activity), which may come a
    moment after pgbench returns: wait until the sessions are gone and the round's updates are
    all counted (a life cut off by the end of the round may add a few more).
    """
    expected = before.updates + lives * UPDATES_PER_LIFE
    with anyio.move_on_after(10):
        # The server has no event for either: poll.
        while int(await scalar(conn, PGBENCH_SESSIONS, (database,))) > 0:  # noqa: ASYNC110
            await anyio.sleep(0.05)
        while int(await scalar(conn, UPDATE_COUNTS)) < expected:  # noqa: ASYNC110
            await anyio.sleep(0.1)


async def _pgbench(server: Server, dsn: str, script: Path, seconds: int) -> tuple[int, float]:
    """(job lives completed, job lives per second)."""
    argv = [
        str(server.bin_dir / "pgbench"), "-n", "-M", "prepared", "-c", str(CLIENTS),
        "-j", str(CLIENTS), "-T", str(seconds), "-f", str(script), dsn,
    ]  # fmt: skip
    return pgbench.report(await anyio.run_process(argv, check=False))
