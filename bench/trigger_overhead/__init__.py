"""trigger_overhead: the worker's commit throughput with the notify triggers vs without them.

pgbench plays the worker: several connections commit single-row UPDATEs as fast as they can;
90% are progress updates of running jobs (the update trigger's WHEN clause rules them out
before its function is called) and 10% are terminal transitions, each
finishing a job that was running (the trigger fires: it queues the job in reactor.pending and
notifies). A reactor replica listens throughout, as in production. The two configurations
alternate ABBA, so drift (table growth, cache warmth) cancels out.

The same rounds run, interleaved with those, on the second mapping (tests/mappings/second.sql
and second.toml: another schema, quoted camelCase names, a bigint id, an enum status, naive UTC
times), with and without its triggers, in a database of its own; its listening replica is a
``reactor run`` process with REACTOR_CONFIG naming that mapping, since one process runs one
mapping.
"""

from __future__ import annotations

import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import anyio

from bench import pgbench
from bench.conn import Conn, connect, dbname, scalar
from bench.result import BENCH_DIR, Context, Result, Table, conditions
from bench.server import Server, open_server
from bench.stats import ratio, safe_div
from bench.workload import bench_settings, replicas, wait_for_first_scan
from reactor import db
from reactor.install import REFERENCE_INSTALL, sql
from reactor.testing import mapping_file

TITLE = "Notify trigger overhead on the worker's commit throughput"
GOAL = (
    "throughput as `reactor migrate` installs the triggers >= 0.90x of a trigger that only "
    "notifies (the floor of a notifying install); installed not to notify >= 0.90x of no trigger"
)

CLIENTS = 6
PROGRESS_JOBS = 10_000

PROGRESS_SCRIPT = f"""\\set n random(1, {PROGRESS_JOBS})
UPDATE analysis_jobs SET updated_at = now() WHERE id = md5('p' || :n)::uuid;
"""

# :k is a per-client counter (pgbench keeps a client's variables between transactions), so each
# terminal transition finishes a job that is still running.
FINISH_SCRIPT = """\\set k :k + 1
UPDATE analysis_jobs SET status = 'complete', results = '{"verdicts": 3}', updated_at = now()
 WHERE id = md5('f' || :client_id || '-' || :k)::uuid;
"""

# The second mapping's app: its tables, its mapping, and the same two scripts on them. Its ids
# are bigints: progress jobs 1..PROGRESS_JOBS, and client c's k-th job to finish SECOND_IDS *
# (c + 1) + k.
SECOND_DIR = BENCH_DIR.parent / "tests" / "mappings"
SECOND_JOBS = 'app."Job"'
SECOND_CHANNEL = "second_jobs_terminal"
SECOND_IDS = 1_000_000_000

SECOND_PROGRESS_SCRIPT = f"""\\set n random(1, {PROGRESS_JOBS})
UPDATE app."Job" SET "updatedAt" = now() AT TIME ZONE 'UTC' WHERE "jobId" = :n;
"""

SECOND_FINISH_SCRIPT = f"""\\set k :k + 1
UPDATE app."Job" SET state = 'done', verdicts = '{{"verdicts": 3}}',
       "updatedAt" = now() AT TIME ZONE 'UTC'
 WHERE "jobId" = {SECOND_IDS}::bigint * (:client_id + 1) + :k;
"""

SECOND_PROGRESS_JOBS = """
INSERT INTO app."Job" ("jobId", "reportKey", state, html, "ownerId")
SELECT g, 'r' || g, 'running', repeat('<p>citation</p>', 100), gen_random_uuid()
  FROM generate_series(1, %s) g
"""

SECOND_FINISHABLE_JOBS = f"""
INSERT INTO app."Job" ("jobId", "reportKey", state, html, "ownerId")
SELECT {SECOND_IDS}::bigint * (c + 1) + k, 'f' || c || '-' || k, 'running', '<p>short</p>',
       gen_random_uuid()
  FROM generate_series(0, %s - 1) c, generate_series(1, %s) k
"""

# The reactor's triggers on the job table as installed, whatever this version calls them, with
# the definitions of their functions.
REACTOR_TRIGGERS = """
SELECT t.tgname, pg_get_triggerdef(t.oid), t.tgfoid::regproc::text, pg_get_functiondef(t.tgfoid)
  FROM pg_trigger t
 WHERE t.tgrelid = %s::regclass AND NOT t.tgisinternal AND t.tgname LIKE 'reactor%%'
 ORDER BY t.tgname
"""


async def run(ctx: Context) -> Result:
    """Calibrate, create enough jobs to finish, then alternate the configurations."""
    quick = ctx.quick
    round_s = 1 if quick else 10
    # A palindrome, so that drift weighs on every configuration alike; its two halves measure
    # every configuration twice the same way, so the ratio of a configuration's second round to
    # its first is the noise of a comparison of like with like.
    half = ["with", "second with", "without", "notify_only", "second without", "quiet"]
    block = half + half[::-1]
    order = block * (1 if quick else 3)
    settings: dict[str, Any] = {
        "clients": CLIENTS,
        "pgbench_threads": 2,
        "round_s": round_s,
        "order": " ".join(order),
        "mix": "90% progress updates, 10% terminal transitions",
        "progress_jobs": PROGRESS_JOBS,
        "listening_replicas": 1,
    }
    rounds: list[dict[str, Any]] = []
    async with open_server() as server:
        cond = await conditions(server, quick=quick)
        dsn = await server.app_database("triggers", with_audit=False)
        second_dsn = await _second_database(server)
        with tempfile.TemporaryDirectory(prefix="bench-pgbench-") as tmp:
            scripts = Path(tmp)
            (scripts / "progress.sql").write_text(PROGRESS_SCRIPT)
            (scripts / "finish.sql").write_text(FINISH_SCRIPT)
            (scripts / "second_progress.sql").write_text(SECOND_PROGRESS_SCRIPT)
            (scripts / "second_finish.sql").write_text(SECOND_FINISH_SCRIPT)
            async with await connect(dsn, "setup") as conn:
                await conn.execute(
                    "INSERT INTO analysis_jobs (id, run_id, status, doc_html) "
                    "SELECT md5('p' || g)::uuid, gen_random_uuid(), 'running', "
                    "       repeat('<p>citation</p>', 100) "
                    "FROM generate_series(1, %s) g",
                    (PROGRESS_JOBS,),
                )
                await conn.execute("VACUUM ANALYZE analysis_jobs")
                triggers = await Triggers.read(conn)
            async with await connect(second_dsn, "setup") as conn:
                await conn.execute(SECOND_PROGRESS_JOBS, (PROGRESS_JOBS,))
                await conn.execute(f"VACUUM ANALYZE {SECOND_JOBS}")
                second_triggers = await Triggers.read(conn, SECOND_JOBS)
            # Calibrate on progress updates alone, to know how many jobs the rounds will finish.
            calibration = await _pgbench(server, dsn, scripts, ["progress.sql"], min(round_s, 3), 0)
            per_client = math.ceil(calibration * round_s * 0.1 / CLIENTS * 3) + 100
            async with await connect(dsn, "setup") as conn:
                await conn.execute(
                    "INSERT INTO analysis_jobs (id, run_id, status, doc_html) "
                    "SELECT md5('f' || c || '-' || k)::uuid, gen_random_uuid(), 'running', "
                    "       '<p>short</p>' "
                    "FROM generate_series(0, %s - 1) c, generate_series(1, %s) k",
                    (CLIENTS, per_client * sum(not c.startswith("second ") for c in order)),
                )
                await conn.execute("VACUUM ANALYZE analysis_jobs")
            async with await connect(second_dsn, "setup") as conn:
                await conn.execute(
                    SECOND_FINISHABLE_JOBS,
                    (CLIENTS, per_client * sum(c.startswith("second ") for c in order)),
                )
                await conn.execute(f"VACUUM ANALYZE {SECOND_JOBS}")
            settings["finishable_jobs_per_client_round"] = per_client
            apps = {
                "": (dsn, triggers, ["progress.sql@9", "finish.sql@1"]),
                "second ": (
                    second_dsn,
                    second_triggers,
                    ["second_progress.sql@9", "second_finish.sql@1"],
                ),
            }
            done_rounds = {prefix: 0 for prefix in apps}
            async with (
                replicas(bench_settings(dsn, grace=3600.0, scan_interval=3600.0), 1) as running,
                _second_replica(second_dsn),
            ):
                await wait_for_first_scan(running)
                for config in order:
                    prefix = "second " if config.startswith("second ") else ""
                    app_dsn, installed, files = apps[prefix]
                    async with await connect(app_dsn, "setup") as conn:
                        await installed.install(conn, config.removeprefix(prefix))
                        await conn.execute(f"VACUUM {installed.table}")
                        done_before = await _finished(conn, installed.table)
                    # This process is the reference's listening replica (pgbench is a child of
                    # its own): its CPU time over the round is what the replica took.
                    cpu = time.process_time()
                    k0 = done_rounds[prefix] * per_client
                    tps = await _pgbench(server, app_dsn, scripts, files, round_s, k0)
                    done_rounds[prefix] += 1
                    cpu = time.process_time() - cpu
                    async with await connect(app_dsn, "check") as conn:
                        finished = await _finished(conn, installed.table) - done_before
                    rounds.append(
                        {
                            "config": config,
                            "tps": tps,
                            "terminal": finished,
                            "terminal_share": safe_div(finished, tps * round_s),
                            "replica_cpu_share": cpu / round_s,
                        }
                    )
                notified = int(
                    running[0].reactor.metrics.notifications.labels("accepted")._value.get()
                )
        server_cost = await _server_cost(server, 2_000 if quick else 20_000, 1 if quick else 3)
        cost, progress_cost = server_cost.finishing, server_cost.progress
        parts_saved, parts_text = _parts_summary(server_cost)

    def mean_tps(config: str, among: list[dict[str, Any]] = rounds) -> float:
        return statistics.fmean(r["tps"] for r in among if r["config"] == config)

    def cpu_share(config: str) -> float:
        return statistics.fmean(r["replica_cpu_share"] for r in rounds if r["config"] == config)

    # Each configuration against its floor: the default install against the notify-only
    # trigger, everything else against no trigger; per block of rounds, for the spread.
    floors = {"with": "notify_only", "quiet": "without", "notify_only": "without"}
    floors["second with"] = "second without"
    blocks = [rounds[i : i + len(block)] for i in range(0, len(rounds), len(block))]
    shares = {c: safe_div(mean_tps(c), mean_tps(f)) for c, f in floors.items()}
    per_block = {
        c: [safe_div(mean_tps(c, b), mean_tps(f, b)) for b in blocks] for c, f in floors.items()
    }
    # Like against like: each configuration's round in the second half of a block over its
    # round in the first half.
    noise = [
        safe_div(b[len(block) - 1 - i]["tps"], b[i]["tps"])
        for b in blocks
        for i in range(len(half))
        if len(b) == len(block)
    ]
    noise_text = f"{ratio(statistics.median(noise))} [{ratio(min(noise))}-{ratio(max(noise))}]"
    share, quiet_share, second_share = shares["with"], shares["quiet"], shares["second with"]
    met = share >= 0.90 and quiet_share >= 0.90
    table = Table(
        [
            "configuration",
            "rounds",
            "mean tps",
            "min tps",
            "max tps",
            "terminal share",
            "vs its floor",
            "floor",
            "server us/finishing commit",
        ]
    )
    for config, label in (
        ("with", "as `reactor migrate` installs the triggers"),
        ("notify_only", "a trigger that only notifies on the transition (the notifying floor)"),
        ("quiet", "the triggers installed with `reactor migrate --no-notify` (queue only)"),
        ("without", "no trigger"),
        ("second with", 'second mapping (app."Job"), with the reactor\'s triggers'),
        ("second without", "second mapping, no trigger"),
    ):
        values = [r["tps"] for r in rounds if r["config"] == config]
        terminal = [r["terminal_share"] for r in rounds if r["config"] == config]
        table.add(
            label,
            len(values),
            f"{statistics.fmean(values):,.0f}",
            f"{min(values):,.0f}",
            f"{max(values):,.0f}",
            f"{statistics.fmean(terminal):.1%}",
            ratio(shares[config]) if config in floors else "1 (floor)",
            floors.get(config, "-"),
            f"{cost[config]:.1f}" if config in cost else "-",
        )
    notes = [
        f"pgbench -M prepared, {CLIENTS} connections, 2 threads, {round_s:g} s per round; every "
        "transaction is one single-row UPDATE committed on its own (fsync off on this cluster, "
        "which makes commits cheap and the commit-time NOTIFY lock relatively larger).",
        f"'Without' drops the reactor's triggers ({', '.join(triggers.names)}); 'with' "
        "re-creates them as they were installed; 'quiet' installs them as `reactor migrate "
        "--no-notify` does, so the job is still queued in reactor.pending but nobody is "
        "notified (the replica polls the queue instead); 'notify_only' is a trigger that does "
        "nothing but pg_notify on the transition into a terminal status, on the reactor's "
        "channel with its payload: what every notifying install pays at least, the commit-time "
        "lock on the cluster's notification queue included. Rounds in order: "
        + ", ".join(f"{r['config']} {r['tps']:,.0f}" for r in rounds)
        + f". The reference's listening replica accepted {notified:,} notifications.",
        f"Noise: each block is a palindrome of {len(block)} rounds, so every configuration is "
        "measured twice in it the same way; its second round over its first, over all "
        f"configurations and blocks: median {noise_text} (min-max). A ratio inside that range "
        "is not told apart from its floor.",
        "Ratio to its floor per block of rounds: "
        + "; ".join(
            f"{c} / {f}: " + ", ".join(ratio(v) for v in per_block[c]) for c, f in floors.items()
        )
        + ".",
        "The second mapping (tests/mappings/second.sql, mapped by second.toml) runs the same "
        'two scripts on app."Job" in a database of its own: progress updates set "updatedAt" '
        "(naive UTC), terminal transitions set state to 'done' (an enum) by a bigint \"jobId\". "
        f"'With' and 'without' as above ({', '.join(second_triggers.names)}); its listening "
        "replica is a `reactor run` process with REACTOR_CONFIG naming second.toml (one process "
        "runs one mapping), so its CPU time is not in the shares below. Each replica idles "
        "while the other database's rounds run.",
        "The listening replica's share of one core during the rounds (this process's CPU "
        "time; pgbench runs in a child of its own): "
        + ", ".join(
            f"{config} {cpu_share(config):.1%}"
            for config in ("with", "notify_only", "quiet", "without")
        )
        + ". On this 2-core machine that is taken from PostgreSQL and pgbench.",
        "Server time per finishing commit: one session finishes jobs in a procedure that "
        "COMMITs after each update, inside the server (no round trips, no other client, no "
        f"listener; median of {1 if quick else 3} rotated repetitions): no trigger "
        f"{cost['without']:.1f} us, notify only {cost['notify_only']:.1f} us, queued "
        f"{cost['quiet']:.1f} us, queued and notified {cost['with']:.1f} us. The default "
        f"install's own share is {cost['with'] - cost['notify_only']:.1f} us above the "
        f"notifying floor, the quiet one's {cost['quiet'] - cost['without']:.1f} us above none. "
        "With reactor.pending unlogged (what an unlogged queue would save, at the price of a "
        f"rebuild after every crash and failover): queued {cost['quiet unlogged']:.1f} us, "
        f"queued and notified {cost['with unlogged']:.1f} us.",
        "Server time per progress update, the same way (each job updated once, still running, "
        f"before it finishes): no trigger {progress_cost['without']:.1f} us, notify only "
        f"{progress_cost['notify_only']:.1f} us, queued {progress_cost['quiet']:.1f} us, queued "
        f"and notified {progress_cost['with']:.1f} us. No trigger function runs on these; what "
        "a trigger adds is its WHEN, prepared again in every statement.",
        parts_text,
    ]
    if not met:
        notes.append(
            "Below the goal. Above its floor a finishing commit pays the reactor's trigger "
            "function and the job's row in reactor.pending (a row and two index entries, "
            "deleted again when its timer fires): the server times above. Here 10% of 10-20k "
            "single-row commits/s (1-2k jobs finishing per second, far above a real app's "
            "rate) pay it, with the listening replica's work on the same 2 cores."
        )
    headline = (
        f"default {ratio(share)} of notify-only ({mean_tps('with'):,.0f} vs "
        f"{mean_tps('notify_only'):,.0f} tps, goal >= 0.90x); quiet {ratio(quiet_share)} of no "
        f"trigger (goal >= 0.90x); notify-only {ratio(shares['notify_only'])} of no trigger; "
        f"second mapping {ratio(second_share)}; noise {noise_text}"
    )
    return Result(
        met=met,
        headline=headline,
        table=table,
        figures={
            "rounds": rounds,
            "floors": floors,
            "vs_floor": shares,
            "block_ratios_vs_floor": per_block,
            "noise_like_with_like": noise,
            "notifications": notified,
            "server_us_per_finishing_commit": cost,
            "server_us_per_progress_update": progress_cost,
            "trigger_parts_us_saved": parts_saved,
            "trigger_parts_us": {
                f"{install}: {part}": times for (install, part), times in server_cost.parts.items()
            },
            "calibration_tps": calibration,
        },
        settings=settings,
        conditions=cond,
        notes=notes,
    )


class Triggers:
    """The reactor's triggers on a job table as installed; ``quiet`` is the product's own
    no-NOTIFY mode (``reactor migrate --no-notify``): the jobs are queued, never notified."""

    def __init__(self, table: str, definitions: list[tuple[str, str]]) -> None:
        self.table = table
        self.definitions = definitions  # (name, CREATE TRIGGER ...)

    @property
    def names(self) -> list[str]:
        """The trigger names."""
        return [name for name, _ in self.definitions]

    @classmethod
    async def read(cls, conn: Conn, table: str = "analysis_jobs") -> Triggers:
        """Read the triggers installed on ``table``."""
        cur = await conn.execute(REACTOR_TRIGGERS, (table,))
        rows = await cur.fetchall()
        if not rows:
            raise RuntimeError(f"no reactor trigger on {table}; nothing to measure")
        return cls(table, [(name, trigger_sql) for name, trigger_sql, _, _ in rows])

    async def install(self, conn: Conn, config: str) -> None:
        """Put ``with``, ``quiet``, ``notify_only`` or ``without`` in place."""
        for name in self.names:
            await conn.execute(f"DROP TRIGGER IF EXISTS {name} ON {self.table}")
        for name in ("bench_notify_only", "bench_notify_only_insert"):
            await conn.execute(f"DROP TRIGGER IF EXISTS {name} ON {self.table}")
        if config == "notify_only":
            if self.table != "analysis_jobs":
                raise ValueError("the notify-only floor is written for the reference tables")
            await conn.execute(NOTIFY_ONLY)
        elif config == "with":
            for _, trigger_sql in self.definitions:
                await conn.execute(trigger_sql)
        elif config == "quiet":
            # What `reactor migrate --no-notify` installs: the same triggers, with no channel,
            # rendered for the mapping in force (the reference).
            text = REFERENCE_INSTALL.render(sql.repeatable().text, channel="")
            await conn.execute(text)


async def _second_database(server: Server) -> str:
    """A scratch database with the second mapping's tables and the reactor installed on them."""
    dsn = server.dsn_for(await server.create_database("triggers_second"))
    async with await connect(dsn, "setup") as conn:
        await conn.execute((SECOND_DIR / "second.sql").read_text())
        second = mapping_file.load(str(SECOND_DIR / "second.toml"))
        await db.migrate(conn, second, channel=SECOND_CHANNEL)
    return dsn


@asynccontextmanager
async def _second_replica(dsn: str, within: float = 30.0) -> AsyncIterator[None]:
    """A `reactor run` process on the second mapping, LISTENing on entry, stopped on exit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTOR_")}
    env.update(
        DATABASE_URL=dsn,
        REACTOR_CONFIG=str(SECOND_DIR / "second.toml"),
        REACTOR_CHANNEL=SECOND_CHANNEL,
        REACTOR_GRACE_SECONDS="3600",
        REACTOR_SCAN_INTERVAL_SECONDS="3600",
        REACTOR_HTTP_ADDR="",
        REACTOR_DASHBOARD_ADDR="",
        REACTOR_LOG_LEVEL="WARNING",
    )
    with tempfile.TemporaryFile() as log:
        process = await anyio.open_process(
            [sys.executable, "-m", "reactor", "run"], env=env, stdout=log, stderr=log
        )
        try:
            async with await connect(dsn, "check") as conn:
                with anyio.fail_after(within):
                    while not await scalar(conn, LISTENING, (dbname(dsn),)):
                        if process.returncode is not None:
                            log.seek(0)
                            raise RuntimeError(f"reactor run exited: {log.read()[-2000:]!r}")
                        await anyio.sleep(0.2)
            yield
        finally:
            process.terminate()
            with anyio.move_on_after(15):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


# The floor of a notifying install: a trigger that does nothing but notify on the transition
# into a terminal status, on the reactor's channel with the reactor's payload, so that the
# listening replica receives the same messages. It pays what PostgreSQL makes every notifying
# commit pay (the trigger call, the NOTIFY queued, the commit-time lock on the cluster's
# notification queue, the listener signalled); nothing of the reactor's own.
NOTIFY_ONLY = """
CREATE OR REPLACE FUNCTION public.bench_notify_only() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], NEW.id::text || '@' || extract(epoch FROM NEW.updated_at));
    RETURN NULL;
END
$f$;
CREATE TRIGGER bench_notify_only AFTER UPDATE ON analysis_jobs FOR EACH ROW
    WHEN (NEW.status IN ('complete', 'failed') AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION public.bench_notify_only('analysis_jobs_terminal');
CREATE TRIGGER bench_notify_only_insert AFTER INSERT ON analysis_jobs FOR EACH ROW
    WHEN (NEW.status IN ('complete', 'failed'))
    EXECUTE FUNCTION public.bench_notify_only('analysis_jobs_terminal');
"""

LISTENING = """
SELECT count(*) > 0 FROM pg_stat_activity
 WHERE datname = %s AND application_name = 'reactor-listener'
"""


# One session finishes every job in a loop inside the server, each in a transaction of its own
# (a procedure may COMMIT): no round trips, no other client, so the time per job is the server's
# own work for a finishing commit, trigger, queue and the NOTIFY's commit-time share included.
FINISH_EACH = """
CREATE OR REPLACE PROCEDURE public.bench_finish_each() LANGUAGE plpgsql AS $$
DECLARE r record; BEGIN
  FOR r IN SELECT id FROM analysis_jobs WHERE status = 'running' LOOP
    UPDATE analysis_jobs SET status = 'complete', results = '{"verdicts": 3}', updated_at = now()
     WHERE id = r.id;
    COMMIT;
  END LOOP;
END $$
"""

# The same for a progress update of every running job: its status stays 'running', so no
# trigger's function runs; what it pays is each job trigger's WHEN, which PostgreSQL reads back
# from the catalog and prepares again in every statement that updates the table.
PROGRESS_EACH = """
CREATE OR REPLACE PROCEDURE public.bench_progress_each() LANGUAGE plpgsql AS $$
DECLARE r record; BEGIN
  FOR r IN SELECT id FROM analysis_jobs WHERE status = 'running' LOOP
    UPDATE analysis_jobs SET results = '{"verdicts": 1}', updated_at = now() WHERE id = r.id;
    COMMIT;
  END LOOP;
END $$
"""

# The configurations timed per finishing commit, in the order each repetition runs them; the
# last two with reactor.pending unlogged, the road an unlogged queue would save.
COST_CONFIGS = ("without", "notify_only", "quiet", "with", "quiet unlogged", "with unlogged")


class TriggerPart(NamedTuple):
    """One part of the job trigger's function: what it is, the pattern that finds it, what
    stands in its place, and whether it runs in the quiet install (the notification's parts
    run only where the trigger notifies)."""

    text: str
    pattern: str
    replacement: str
    quiet_too: bool


# The parts of the job trigger's function, each timed by its absence: the function as
# installed (pg_get_functiondef) with one part cut out by a pattern that must match exactly
# once, so a change of the function's text stops this benchmark instead of measuring nothing.
TRIGGER_PARTS: dict[str, TriggerPart] = {
    "guard": TriggerPart(
        "the check that the table is the mapped one (two name comparisons)",
        r"IF TG_TABLE_NAME <> .*?END IF;",
        "",
        True,
    ),
    "definer": TriggerPart(
        "SECURITY DEFINER and its fixed search_path (set and restored at every call)",
        r" SECURITY DEFINER\n SET search_path TO [^\n]*",
        "",
        True,
    ),
    "queue row": TriggerPart(
        "the job's row in reactor.pending (INSERT ... ON CONFLICT, two index entries)",
        r"INSERT INTO \S+\.pending .*?EXCLUDED\.since;",
        "NULL;",
        True,
    ),
    "conflict clause": TriggerPart(
        (
            "the queue row's ON CONFLICT (a plain INSERT instead: a job queued already, by "
            "the reconcile or a run's deletion, would fail the app's commit)"
        ),
        r"\s+ON CONFLICT \(job_id\) DO UPDATE SET since = EXCLUDED\.since;",
        ";",
        True,
    ),
    "queue limit": TriggerPart(
        "the notification queue's limit (pg_notification_queue_usage and the setting)",
        r"\s+AND pg_notification_queue_usage\(\).*?ELSE 0\.5 END\)",
        "",
        False,
    ),
    "doorbell": TriggerPart(
        "the doorbell's read (one indexed row, no lock)",
        r"IF NOT EXISTS \(SELECT 1 FROM \S+\.doorbell .*?\) THEN",
        "IF true THEN",
        False,
    ),
    "body": TriggerPart(
        "the whole body: what is left is the call of a PL/pgSQL trigger function",
        r"AS \$function\$.*\$function\$",
        "AS $function$ BEGIN RETURN NULL; END $function$",
        True,
    ),
}


@dataclass
class ServerCost:
    """Microseconds of server time per committed update, by configuration (median); and per
    finishing commit with one part of the job trigger cut out, by install and part (each
    repetition's time, in order)."""

    finishing: dict[str, float]
    progress: dict[str, float]
    parts: dict[tuple[str, str], list[float]]


def without_part(function_sql: str, part: str) -> str:
    """The job trigger's function as installed (``function_sql``), ``part`` cut out."""
    cut_out = TRIGGER_PARTS[part]
    cut, found = re.subn(cut_out.pattern, lambda _: cut_out.replacement, function_sql, flags=re.S)
    if found != 1:
        raise RuntimeError(f"the job trigger's {part} matched {found} times; update TRIGGER_PARTS")
    return cut


async def _server_cost(server: Server, jobs: int, repetitions: int) -> ServerCost:
    """Server time per progress update and per finishing commit, by configuration."""
    dsn = await server.app_database("trigger_cost", with_audit=False)
    times: dict[str, list[float]] = {}
    progress: dict[str, list[float]] = {}
    parts: dict[tuple[str, str], list[float]] = {}
    # Every configuration, then the job trigger's function with each of its parts cut out, in
    # the quiet and the default install ("as installed" again among them, for their spread).
    cut_configs: list[tuple[str, str | None]] = [(config, None) for config in COST_CONFIGS]
    for install in ("quiet", "with"):
        cut_configs.append((install, "as installed"))
        for cut, cut_out in TRIGGER_PARTS.items():
            if install == "with" or cut_out.quiet_too:
                cut_configs.append((install, cut))
    async with await connect(dsn, "setup") as conn:
        triggers = await Triggers.read(conn)
        function_sql = str(
            await scalar(conn, "SELECT pg_get_functiondef('reactor.job_changed_v1'::regproc)")
        )
        await conn.execute(FINISH_EACH)
        await conn.execute(PROGRESS_EACH)
        for repetition in range(repetitions):
            # Rotated, so that no configuration always runs first or after the same one.
            shift = repetition % len(cut_configs)
            for config, part in cut_configs[shift:] + cut_configs[:shift]:
                await conn.execute("TRUNCATE analysis_jobs, reactor.pending")
                persistence = "UNLOGGED" if config.endswith(" unlogged") else "LOGGED"
                await conn.execute(f"ALTER TABLE reactor.pending SET {persistence}")
                await conn.execute(
                    "INSERT INTO analysis_jobs (id, run_id, status, doc_html) "
                    "SELECT gen_random_uuid(), gen_random_uuid(), 'running', '<p>short</p>' "
                    "FROM generate_series(1, %s)",
                    (jobs,),
                )
                await conn.execute("VACUUM ANALYZE analysis_jobs")
                await triggers.install(conn, config.removesuffix(" unlogged"))
                await conn.execute(function_sql)
                if part is not None:
                    if part != "as installed":
                        await conn.execute(without_part(function_sql, part))
                    parts.setdefault((config, part), []).append(
                        await _us_per_job(conn, "bench_finish_each", jobs)
                    )
                    continue
                progress.setdefault(config, []).append(
                    await _us_per_job(conn, "bench_progress_each", jobs)
                )
                times.setdefault(config, []).append(
                    await _us_per_job(conn, "bench_finish_each", jobs)
                )
        await conn.execute(function_sql)
    return ServerCost(
        {config: statistics.median(values) for config, values in times.items()},
        {config: statistics.median(values) for config, values in progress.items()},
        parts,
    )


def _parts_summary(cost: ServerCost) -> tuple[dict[str, dict[str, float]], str]:
    """What each part of the job trigger saves when cut out, by install (median over the
    repetitions of the function as installed minus the function without it, each repetition
    paired with itself), and the note that says so with its noise."""
    saved: dict[str, dict[str, float]] = {}
    phrases = []
    for install, name in (("quiet", "quiet install"), ("with", "default install")):
        whole = cost.parts[(install, "as installed")]
        saved[install] = {
            part: statistics.median(w - c for w, c in zip(whole, times, strict=True))
            for (of, part), times in cost.parts.items()
            if of == install and part != "as installed"
        }
        call = statistics.median(cost.parts[(install, "body")]) - cost.finishing["without"]
        twice = abs(statistics.median(whole) - cost.finishing[install])
        phrases.append(
            f"{name} {statistics.median(whole):.1f} us as installed (spread over the "
            f"repetitions {max(whole) - min(whole):.1f} us; {twice:.1f} us from the same "
            "install timed among the configurations above): "
            + ", ".join(
                f"{part} {value:.1f}" for part, value in saved[install].items() if part != "body"
            )
            + f"; the body {saved[install]['body']:.1f}, and the call of an empty trigger "
            f"function {call:.1f} over no trigger"
        )
    parts = "; ".join(f"{name}, {part.text}" for name, part in TRIGGER_PARTS.items())
    return saved, (
        "What each part of the job trigger's function costs, per finishing commit, timed the "
        "same way by its absence (the function as installed, re-created with one part cut out; "
        "median over the repetitions of as installed minus without it, in us): "
        + "; ".join(phrases)
        + f". The parts: {parts}. A part saved less than the spread is not told apart from "
        "nothing."
    )


async def _us_per_job(conn: Conn, procedure: str, jobs: int) -> float:
    """Microseconds per job of one CALL of ``procedure``, which updates ``jobs`` jobs."""
    started = time.perf_counter()
    await conn.execute(f"CALL public.{procedure}()")
    return (time.perf_counter() - started) / jobs * 1e6


async def _pgbench(
    server: Server, dsn: str, scripts: Path, files: list[str], seconds: int, k0: int
) -> float:
    argv = [
        str(server.bin_dir / "pgbench"), "-n", "-M", "prepared", "-c", str(CLIENTS), "-j", "2",
        "-T", str(seconds), "-D", f"k={k0}",
        *(arg for name in files for arg in ("-f", str(scripts / name))),
        dsn,
    ]  # fmt: skip
    _, tps = pgbench.report(await anyio.run_process(argv, check=False))
    return tps


async def _finished(conn: Conn, table: str) -> int:
    state = "state = 'done'" if table == SECOND_JOBS else "status = 'complete'"
    return int(await scalar(conn, f"SELECT count(*) FROM {table} WHERE {state}"))
