"""lateness: how long after its grace window a browserless job's run is recorded.

Lateness is the audit row's time minus ``updated_at + grace``, both by the database clock. Two
reactor replicas run in-process while a worker finishes jobs at a steady rate and browser tabs
save 70% of them inside the grace window; the same workload then runs, in a second database on
the same server, against two containers of the article's 30-second sweep. The worker and the
tabs run in a child process, as the app does in production, so the replicas' event loop is
their own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from bench import baseline
from bench.common import (
    Conn,
    Context,
    Result,
    Table,
    conditions,
    connect,
    ms,
    open_server,
    ratio,
    safe_div,
    summarize,
)
from bench.loadgen import play_elsewhere
from bench.workload import (
    bench_settings,
    insert_jobs,
    replicas,
    stamped,
    wait_for_first_scan,
    wait_until_recorded,
)
from reactor import audit

TITLE = "Lateness of recorded runs past updated_at + grace (database clock)"
GOAL = "p99 <= 10 ms; mean >= 1000x lower than the article's 30 s sweep"

LATENESS = """
SELECT extract(epoch FROM a.at - (j.updated_at + make_interval(secs => %(grace)s)))::float8
  FROM run_audit a JOIN analysis_jobs j ON j.id = a.job_id
 WHERE a.saved_by = 'worker'
"""


async def run(ctx: Context) -> Result:
    """Measure the reactor, then the baseline sweep, under the same load."""
    quick = ctx.quick
    grace = 1 if quick else 2  # whole seconds: the article's query casts its grace to int
    rate = 50.0 if quick else 100.0
    load_s = 3.0 if quick else 75.0
    tick = 2.0 if quick else 30.0
    jobs = int(rate * load_s)
    doc_bytes = 32 * 1024
    save_ratio = 0.7
    tab_delay = (0.05 * grace, 0.6 * grace)
    settings: dict[str, Any] = {
        "jobs": jobs,
        "rate_per_s": rate,
        "load_s": load_s,
        "grace_s": grace,
        "tab_save_ratio": save_ratio,
        "tab_delay_s": list(tab_delay),
        "doc_bytes": doc_bytes,
        "reactor_replicas": 2,
        "scan_interval_s": 30.0,
        "baseline_containers": 2,
        "baseline_tick_s": tick,
        "baseline_batch": 500,
    }
    async with open_server() as server:
        cond = await conditions(server, quick=quick)
        if quick:
            cond["note"] = f"--quick: baseline tick shortened to {tick:g} s (the article's is 30 s)"

        # The reactor: two replicas, as in a rolling deploy.
        dsn = await server.app_database("lateness_reactor")
        async with await connect(dsn, "check") as conn:
            ids = await insert_jobs(conn, jobs, doc_bytes=doc_bytes)
            settings_r = bench_settings(dsn, grace=float(grace))
            stamps: dict[str, float] = {}
            async with replicas(settings_r, 2, database=stamped(stamps)) as running:
                await wait_for_first_scan(running)
                r_play = await play_elsewhere(
                    dsn, ids, rate=rate, save_ratio=save_ratio, tab_delay=tab_delay
                )
                r_missing = await wait_until_recorded(conn, within=grace + 60)
                await anyio.sleep(1.2)  # a loser's busy retry (1 s) is a statement too
                counters = [r.reactor.database for r in running]
                statements = sum(getattr(d, "record_calls", 0) for d in counters)
            r_late = await _lateness(conn, grace)
            r_by_job = await _lateness_by_job(conn, grace)
            r_verdict = await audit.verdict(conn, grace)

        # The baseline: the article's sweep in two containers with independent tick phases.
        dsn = await server.app_database("lateness_baseline")
        async with await connect(dsn, "check") as conn:
            ids = await insert_jobs(conn, jobs, doc_bytes=doc_bytes)
            sweeps = [
                baseline.Sweep(dsn, grace=grace, tick=tick, phase=phase)
                for phase in baseline.phases(2, tick, seed=11)
            ]
            async with anyio.create_task_group() as tg:
                for sweep in sweeps:
                    await tg.start(sweep.run)
                b_play = await play_elsewhere(
                    dsn, ids, rate=rate, save_ratio=save_ratio, tab_delay=tab_delay
                )
                b_missing = await wait_until_recorded(conn, within=2 * tick + grace + 60)
                tg.cancel_scope.cancel()
            b_late = await _lateness(conn, grace)
            b_verdict = await audit.verdict(conn, grace)

    r, b = summarize(r_late), summarize(b_late)
    # Where the reactor's lateness goes, for the jobs it recorded: the worker's finish round trip
    # (updated_at is its transaction's start), then timer to claim on the reactor's own clock,
    # then the rest (the claim statement up to the audit row, plus scheduling noise).
    trip = [r_play.round_trip[j] for j in r_by_job if j in r_play.round_trip]
    timer = [stamps[j] - r_play.committed_at[j] - grace for j in r_by_job if j in stamps]
    rest = [
        late - r_play.round_trip[j] - (stamps[j] - r_play.committed_at[j] - grace)
        for j, late in r_by_job.items()
        if j in stamps and j in r_play.round_trip
    ]
    parts = {
        "finish_round_trip": summarize(trip),
        "timer_to_claim": summarize(timer),
        "claim_statement_and_rest": summarize(rest),
    }
    improvement = safe_div(b["mean"], r["mean"])
    met = r["p99"] <= 0.010 and improvement >= 1000
    table = Table(["design", "runs recorded", "p50", "p99", "max", "mean", "baseline mean / this"])
    table.add(
        "reactor (2 replicas)",
        r["n"],
        ms(r["p50"]),
        ms(r["p99"]),
        ms(r["max"]),
        ms(r["mean"]),
        ratio(improvement),
    )
    table.add(
        f"article sweep ({tick:g} s tick, 2 containers)",
        b["n"],
        ms(b["p50"]),
        ms(b["p99"]),
        ms(b["max"]),
        ms(b["mean"]),
        ratio(1.0),
    )
    plot = _plot(ctx.results_dir, r_late, b_late, tick)
    notes = [
        f"Offered load: {jobs} jobs at {rate:g}/s; tabs saved {r_play.saved_by_tabs} (reactor "
        f"run) and {b_play.saved_by_tabs} (baseline run); the worker fell behind its schedule "
        f"by at most {ms(max(r_play.behind_s, b_play.behind_s))}.",
        "Invariants from the audit trigger (lost/dup/clobbered/early/wrong): reactor "
        f"{_invariants(r_verdict)}, baseline {_invariants(b_verdict)}; still unrecorded at the "
        f"end: reactor {r_missing}, baseline {b_missing}.",
        f"The two replicas sent {statements:,} record statements for {jobs:,} finished jobs "
        f"({safe_div(statements, jobs):.2f} per job): each replica arms a timer for every "
        "job, tab-saved or not, and the one that loses the row lock retries after 1 s.",
        "Where the reactor's lateness goes (p50 / p99): the worker's finish statement, from "
        "its transaction's start (= updated_at) to its commit returning, "
        f"{_pair(parts['finish_round_trip'])}; commit to the start of the claim beyond the "
        f"grace (notification, timer wake-up, task start; the replica's own clock) "
        f"{_pair(parts['timer_to_claim'])}; the claim statement up to the audit row, and the "
        f"rest, {_pair(parts['claim_statement_and_rest'])}. The sweep's is up to one tick "
        "plus its batch.",
    ]
    if r["p99"] > 0.010:
        slowest = max(parts.items(), key=lambda item: item[1]["p99"])[0].replace("_", " ")
        notes.append(
            f"p99 above 10 ms; the largest tail of the three parts above is '{slowest}'. On "
            "this shared 2-core box the worker, the tabs, both replicas and PostgreSQL compete "
            "for the same CPUs. What would shorten it: one record statement per job instead of "
            "one per replica (only the replica that wins a cheap advisory lock or a hash of "
            "the job id fires; the others keep a later safety timer), and running the reactor "
            "on a core of its own."
        )
    headline = (
        f"reactor p99 {ms(r['p99'])} (goal <= 10 ms), mean {ms(r['mean'])} vs the sweep's "
        f"{ms(b['mean'])}: {ratio(improvement)} lower (goal >= 1000x)"
    )
    return Result(
        name="lateness",
        title=TITLE,
        goal=GOAL,
        met=met,
        headline=headline,
        table=table,
        figures={
            "reactor": {**r, "invariants": r_verdict.as_dict(), "unrecorded": r_missing},
            "baseline": {**b, "invariants": b_verdict.as_dict(), "unrecorded": b_missing},
            "mean_improvement": improvement,
            "tab_saves": {"reactor": r_play.saved_by_tabs, "baseline": b_play.saved_by_tabs},
            "worker_behind_s": max(r_play.behind_s, b_play.behind_s),
            "baseline_sweeps": [s.sweeps for s in sweeps],
            "reactor_record_statements": statements,
            "reactor_lateness_parts": parts,
        },
        settings=settings,
        conditions=cond,
        notes=notes,
        plots=[plot],
    )


async def _lateness_by_job(conn: Conn, grace: int) -> dict[str, float]:
    query = LATENESS.replace("SELECT ", "SELECT a.job_id::text, ", 1)
    cur = await conn.execute(query, {"grace": grace})
    return {job_id: float(late) for job_id, late in await cur.fetchall()}


def _pair(s: dict[str, float]) -> str:
    return f"{ms(s['p50'])} / {ms(s['p99'])}"


async def _lateness(conn: Conn, grace: int) -> list[float]:
    cur = await conn.execute(LATENESS, {"grace": grace})
    return [float(row[0]) for row in await cur.fetchall()]


def _invariants(v: audit.Verdict) -> str:
    return f"{v.lost}/{v.dup}/{v.clobbered}/{v.early}/{v.wrong}"


def _plot(results_dir: Path, reactor: list[float], sweep: list[float], tick: float) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    name = "lateness_cdf.png"
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for values, label in (
        (reactor, "reactor, 2 replicas"),
        (sweep, f"article sweep, {tick:g} s tick"),
    ):
        if not values:
            continue
        xs = sorted(max(v * 1000, 0.01) for v in values)
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=f"{label} (n={len(xs)})")
    ax.set_xscale("log")
    ax.set_xlabel("lateness past updated_at + grace (ms, log scale)")
    ax.set_ylabel("share of recorded runs")
    ax.set_ylim(0, 1.01)
    ax.axvline(10, color="grey", linestyle=":", linewidth=1)
    ax.text(10 * 1.1, 0.05, "10 ms", color="grey")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("Lateness CDF (database clock)")
    fig.tight_layout()
    results_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(results_dir / name)
    plt.close(fig)
    return name
