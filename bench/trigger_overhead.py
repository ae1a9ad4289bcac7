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
from pathlib import Path
from typing import Any

import anyio

from bench.conn import Conn, connect, dbname, scalar
from bench.result import BENCH_DIR, Context, Result, Table, conditions
from bench.server import Server, open_server
from bench.stats import ratio, safe_div
from bench.workload import bench_settings, replicas, wait_for_first_scan
from reactor import db, mapping_file, sql
from reactor.install import REFERENCE_INSTALL

TITLE = "Notify trigger overhead on the worker's commit throughput"
GOAL = (
    "throughput with the triggers >= 0.90x without, on either mapping; with them not notifying "
    ">= 0.95x"
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
    round_s = 1 if quick else 12
    # A palindrome, so that drift weighs on every configuration alike.
    block = [
        "with", "second with", "without", "second without", "quiet",
        "quiet", "second without", "without", "second with", "with",
    ]  # fmt: skip
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
                    (CLIENTS, per_client * order.count("with") * 3),
                )
                await conn.execute("VACUUM ANALYZE analysis_jobs")
            async with await connect(second_dsn, "setup") as conn:
                await conn.execute(
                    SECOND_FINISHABLE_JOBS, (CLIENTS, per_client * order.count("second with") * 2)
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
        cost = await _server_cost(server, 2_000 if quick else 20_000, 1 if quick else 3)

    def mean_tps(config: str, among: list[dict[str, Any]] = rounds) -> float:
        return statistics.fmean(r["tps"] for r in among if r["config"] == config)

    def cpu_share(config: str) -> float:
        return statistics.fmean(r["replica_cpu_share"] for r in rounds if r["config"] == config)

    share = safe_div(mean_tps("with"), mean_tps("without"))
    quiet_share = safe_div(mean_tps("quiet"), mean_tps("without"))
    second_share = safe_div(mean_tps("second with"), mean_tps("second without"))
    # Each block of rounds gives its own ratios; their spread shows the noise.
    blocks = [rounds[i : i + len(block)] for i in range(0, len(rounds), len(block))]
    with_blocks = [safe_div(mean_tps("with", b), mean_tps("without", b)) for b in blocks]
    quiet_blocks = [safe_div(mean_tps("quiet", b), mean_tps("without", b)) for b in blocks]
    second_blocks = [
        safe_div(mean_tps("second with", b), mean_tps("second without", b)) for b in blocks
    ]
    met = share >= 0.90 and second_share >= 0.90 and quiet_share >= 0.95
    table = Table(
        [
            "configuration",
            "rounds",
            "mean tps",
            "min tps",
            "max tps",
            "terminal share",
            "vs without",
        ]
    )
    for config, label in (
        ("with", "with the reactor's triggers"),
        ("quiet", "same triggers, installed with `reactor migrate --no-notify` (queue only)"),
        ("without", "without triggers"),
        ("second with", 'second mapping (app."Job"), with the reactor\'s triggers'),
        ("second without", "second mapping, without triggers"),
    ):
        values = [r["tps"] for r in rounds if r["config"] == config]
        shares = [r["terminal_share"] for r in rounds if r["config"] == config]
        against = "second without" if config.startswith("second ") else "without"
        table.add(
            label,
            len(values),
            f"{statistics.fmean(values):,.0f}",
            f"{min(values):,.0f}",
            f"{max(values):,.0f}",
            f"{statistics.fmean(shares):.1%}",
            ratio(safe_div(statistics.fmean(values), mean_tps(against))),
        )
    notes = [
        f"pgbench -M prepared, {CLIENTS} connections, 2 threads, {round_s:g} s per round; every "
        "transaction is one single-row UPDATE committed on its own (fsync off on this cluster, "
        "which makes commits cheap and the commit-time NOTIFY lock relatively larger).",
        f"'Without' drops the reactor's triggers ({', '.join(triggers.names)}); 'with' "
        "re-creates them as they were installed; 'quiet' installs them as `reactor migrate "
        "--no-notify` does, so the job is still queued in reactor.pending but nobody is "
        "notified (the replica polls the queue instead). Rounds in order: "
        + ", ".join(f"{r['config']} {r['tps']:,.0f}" for r in rounds)
        + f". The reference's listening replica accepted {notified:,} notifications.",
        "The second mapping (tests/mappings/second.sql, mapped by second.toml) runs the same "
        'two scripts on app."Job" in a database of its own: progress updates set "updatedAt" '
        "(naive UTC), terminal transitions set state to 'done' (an enum) by a bigint \"jobId\". "
        f"'With' and 'without' as above ({', '.join(second_triggers.names)}); its listening "
        "replica is a `reactor run` process with REACTOR_CONFIG naming second.toml (one process "
        "runs one mapping), so its CPU time is not in the shares below. Each replica idles "
        "while the other database's rounds run.",
        "The listening replica's share of one core during the rounds (this process's CPU "
        "time; pgbench runs in a child of its own): "
        + ", ".join(f"{config} {cpu_share(config):.1%}" for config in ("with", "quiet", "without"))
        + ". On this 2-core machine that is taken from PostgreSQL and pgbench; a replica on "
        "a host of its own would leave it to them.",
        "Server time per terminal update, one session finishing jobs in a loop inside the "
        "server (no round trips, no other client; median of "
        f"{1 if quick else 3}): without triggers {cost['without']:.1f} us, queued "
        f"{cost['quiet']:.1f} us, queued and notified {cost['with']:.1f} us. That is where "
        "each configuration's cost starts, before contention with the other clients and the "
        "replica multiplies it.",
        "The terminal share is counted from the table (jobs that went complete during the "
        f"round), not assumed. Ratio per block of {len(block)} rounds, with / without: "
        + ", ".join(ratio(b) for b in with_blocks)
        + "; queue only / without: "
        + ", ".join(ratio(b) for b in quiet_blocks)
        + "; second mapping, with / without: "
        + ", ".join(ratio(b) for b in second_blocks)
        + " (the spread is this shared machine's noise).",
    ]
    if not met:
        notes.append(
            "Below the goal. A finishing transaction pays for calling a trigger function at "
            "all and for queueing the job in reactor.pending (a row and two index entries, "
            "deleted again when its timer fires); by default also for the NOTIFY, whose "
            "commit-time lock on the server-wide queue serialises the notifying commits, and "
            "for the listening replica's work on this same 2-core machine (its backend woken "
            f"per notification, its event loop at {cpu_share('with'):.0%} of a core). The "
            f"server times above put the queue at {cost['quiet'] - cost['without']:.0f} us and "
            f"the NOTIFY at {cost['with'] - cost['quiet']:.0f} us more per finishing update, "
            f"on an update that costs {cost['without']:.0f} us without them; here 10% of "
            "10-20k single-row commits/s (1-2k jobs finishing per second, far above a real "
            "app's rate) pay it. What would close it is taking the queue off the app's commit "
            "path altogether: a mode without the trigger, in which the replicas poll a partial "
            "index of analysis_jobs by updated_at instead of reactor.pending, at the price of "
            "that index entry on each finishing update, and of later updates to a finished "
            "job's updated_at no longer being HOT."
        )
    headline = (
        f"{mean_tps('with'):,.0f} vs {mean_tps('without'):,.0f} tps: {ratio(share)} (goal >= "
        f"0.90x); with the trigger not notifying {ratio(quiet_share)} (goal >= 0.95x); second "
        f"mapping {mean_tps('second with'):,.0f} vs {mean_tps('second without'):,.0f} tps: "
        f"{ratio(second_share)}"
    )
    return Result(
        name="trigger_overhead",
        title=TITLE,
        goal=GOAL,
        met=met,
        headline=headline,
        table=table,
        figures={
            "rounds": rounds,
            "with_vs_without": share,
            "queue_only_vs_without": quiet_share,
            "second_with_vs_without": second_share,
            "block_ratios_with": with_blocks,
            "block_ratios_queue_only": quiet_blocks,
            "block_ratios_second_with": second_blocks,
            "notifications": notified,
            "server_us_per_terminal_update": cost,
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
        """Put ``with``, ``quiet`` or ``without`` in place."""
        for name in self.names:
            await conn.execute(f"DROP TRIGGER IF EXISTS {name} ON {self.table}")
        if config == "with":
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


LISTENING = """
SELECT count(*) > 0 FROM pg_stat_activity
 WHERE datname = %s AND application_name = 'reactor-listener'
"""


# One session finishes every job in a loop inside the server: no round trips, no other client,
# so the time per update is the server's own work for it, trigger and queue included.
FINISH_IN_A_LOOP = """
DO $$ DECLARE r record; BEGIN
  FOR r IN SELECT id FROM analysis_jobs WHERE status = 'running' LOOP
    UPDATE analysis_jobs SET status = 'complete', results = '{"verdicts": 3}', updated_at = now()
     WHERE id = r.id;
  END LOOP;
END $$
"""


async def _server_cost(server: Server, jobs: int, repetitions: int) -> dict[str, float]:
    """Microseconds of server time per terminal update, by configuration (median)."""
    dsn = await server.app_database("trigger_cost", with_audit=False)
    times: dict[str, list[float]] = {}
    async with await connect(dsn, "setup") as conn:
        triggers = await Triggers.read(conn)
        for _ in range(repetitions):
            for config in ("without", "quiet", "with"):
                await conn.execute("TRUNCATE analysis_jobs, reactor.pending")
                await conn.execute(
                    "INSERT INTO analysis_jobs (id, run_id, status, doc_html) "
                    "SELECT gen_random_uuid(), gen_random_uuid(), 'running', '<p>short</p>' "
                    "FROM generate_series(1, %s)",
                    (jobs,),
                )
                await conn.execute("VACUUM ANALYZE analysis_jobs")
                await triggers.install(conn, config)
                started = time.perf_counter()
                await conn.execute(FINISH_IN_A_LOOP)
                elapsed = time.perf_counter() - started
                times.setdefault(config, []).append(elapsed / jobs * 1e6)
    return {config: statistics.median(values) for config, values in times.items()}


async def _pgbench(
    server: Server, dsn: str, scripts: Path, files: list[str], seconds: int, k0: int
) -> float:
    argv = [
        str(server.bin_dir / "pgbench"), "-n", "-M", "prepared", "-c", str(CLIENTS), "-j", "2",
        "-T", str(seconds), "-D", f"k={k0}",
        *(arg for name in files for arg in ("-f", str(scripts / name))),
        dsn,
    ]  # fmt: skip
    done = await anyio.run_process(argv, check=False)
    out = done.stdout.decode()
    if done.returncode != 0:
        raise RuntimeError(f"pgbench failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
    if match is None:
        raise RuntimeError(f"no tps in pgbench output: {out[-2000:]}")
    return float(match.group(1))


async def _finished(conn: Conn, table: str) -> int:
    state = "state = 'done'" if table == SECOND_JOBS else "status = 'complete'"
    return int(await scalar(conn, f"SELECT count(*) FROM {table} WHERE {state}"))
