"""An app with history: millions of finished jobs, each with its run, loaded in bulk.

scan_scale, reconcile and migrate_online measure against the same kind of database: only the
newest ``window`` jobs still carry ``doc_html`` (the app's trim window), every job is finished
and has its run. Loading runs without primary keys, which are built afterwards, as a restore
would: at 10M rows that is minutes rather than tens of minutes.
"""

from __future__ import annotations

from bench.conn import Conn, scalar

LOAD_JOBS = """
INSERT INTO analysis_jobs (id, run_id, status, doc_html, results, created_at, updated_at)
SELECT md5('j' || g)::uuid, md5('r' || g)::uuid,
       CASE WHEN g %% 10 = 0 THEN 'failed' ELSE 'complete' END,
       CASE WHEN g > %(total)s - %(window)s
            THEN '<p class="citation">cited work ' || g || '</p>' END,
       '{"verdicts": 3}', t - interval '1 minute', t
  FROM generate_series(%(lo)s, %(hi)s) g,
       LATERAL (SELECT %(newest)s::timestamptz - (%(total)s - g) * %(spacing)s
                       * interval '1 second' AS t) ts
"""

# Who saved the runs of the history: the tabs, or a mix with the reactor's worker rows.
ALL_CLIENT = "'client'"
MOSTLY_CLIENT = "CASE WHEN random() < 0.7 THEN 'client' ELSE 'worker' END"


async def load_history(
    conn: Conn,
    total: int,
    window: int,
    *,
    saved_by: str = ALL_CLIENT,
    spacing: float = 0.25,
    job_key: str = "id",
    past_triggers: bool = False,
) -> None:
    """Add ``total`` finished jobs, the newest ``window`` with doc_html, each with its run.

    The app's tables must exist and be empty. Triggers on them, if any, are the caller's to
    disable, or, with ``past_triggers``, off for the load alone: the rows of a history already
    have their runs, so they never pass through the reactor's triggers. ``saved_by`` is an SQL
    expression (:data:`ALL_CLIENT`, :data:`MOSTLY_CLIENT`). Jobs finished ``spacing`` seconds
    apart, the newest two hours ago. ``job_key`` is the job table's primary key (a partitioned
    table's includes its partition key).
    """
    if past_triggers:
        await conn.execute("ALTER TABLE analysis_jobs DISABLE TRIGGER USER")
    await conn.execute("ALTER TABLE analysis_jobs DROP CONSTRAINT analysis_jobs_pkey")
    await conn.execute("ALTER TABLE analysis_runs DROP CONSTRAINT analysis_runs_pkey")
    newest = await scalar(conn, "SELECT now() - interval '2 hours'")
    chunk = 1_000_000
    for lo in range(1, total + 1, chunk):
        params = {
            "total": total,
            "window": window,
            "lo": lo,
            "hi": min(total, lo + chunk - 1),
            "newest": newest,
            "spacing": spacing,
        }
        await conn.execute(LOAD_JOBS, params)
    await conn.execute(
        "INSERT INTO analysis_runs (id, job_id, results, saved_by) "
        f"SELECT run_id, id, results, {saved_by} FROM analysis_jobs"
    )
    await conn.execute(f"ALTER TABLE analysis_jobs ADD PRIMARY KEY ({job_key})")
    await conn.execute("ALTER TABLE analysis_runs ADD PRIMARY KEY (id)")
    if past_triggers:
        await conn.execute("ALTER TABLE analysis_jobs ENABLE TRIGGER USER")
