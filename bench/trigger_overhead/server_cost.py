"""Server time per committed update, timed inside the server by a procedure, by configuration,
and per part of the job trigger's function, each timed by its absence."""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass
from typing import NamedTuple

from bench.conn import Conn, connect, scalar
from bench.server import Server
from bench.trigger_overhead.triggers import Triggers

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


async def server_cost(server: Server, jobs: int, repetitions: int) -> ServerCost:
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


def parts_summary(cost: ServerCost) -> tuple[dict[str, dict[str, float]], str]:
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
