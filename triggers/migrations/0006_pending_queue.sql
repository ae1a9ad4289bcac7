-- A durable queue of the jobs that may need a run, so the fallback scan reads the unrecorded
-- backlog instead of every finished job that still holds its document (the whole trim window,
-- millions of rows in a busy app).
--
-- The trigger (notify_triggers.sql) adds a job in the transaction that makes it eligible: the
-- row-local half of "needs a run" turns true, usually the transition into complete/failed.
-- The reactor removes it once it records the run, or once a scan finds it needs none (a tab
-- saved it). `since` orders the queue: the job's updated_at when it became eligible.
CREATE TABLE IF NOT EXISTS reactor.pending (
    job_id  uuid PRIMARY KEY,
    since   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS pending_since_idx ON reactor.pending (since);

-- One trigger function for both jobs: queue the job when it becomes eligible, and wake the
-- reactors. NOTIFY takes a cluster-wide lock at commit, so it is sent about once per job.
CREATE OR REPLACE FUNCTION reactor.job_changed_v1() RETURNS trigger
    LANGUAGE plpgsql
    -- It runs in the app's transactions, as the app's role, which need not see the reactor's
    -- schema: it acts as its owner instead, with a search_path nobody else can plant objects in.
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    -- The row-local half of "needs a run"; analysis_runs decides the rest at record time.
    eligible boolean := NEW.deleted_at IS NULL AND NEW.doc_html IS NOT NULL
                        AND NEW.results IS NOT NULL AND NEW.results <> '{}'::jsonb;
    was_eligible boolean := TG_OP = 'UPDATE' AND OLD.status IN ('complete', 'failed')
                            AND OLD.deleted_at IS NULL AND OLD.doc_html IS NOT NULL
                            AND OLD.results IS NOT NULL AND OLD.results <> '{}'::jsonb;
BEGIN
    IF eligible AND NOT was_eligible THEN
        INSERT INTO reactor.pending (job_id, since)
        VALUES (NEW.id, least(NEW.updated_at, now()))
            ON CONFLICT (job_id) DO UPDATE SET since = EXCLUDED.since;
    END IF;
    -- Wake the reactors on the transition into a terminal status, and when a terminal job
    -- becomes eligible later (its results arrive in a second update).
    IF TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM NEW.status
       OR (eligible AND NOT was_eligible) THEN
        PERFORM pg_notify(TG_ARGV[0], NEW.id::text);
    END IF;
    RETURN NULL;
END
$$;

-- The jobs that already needed a run when this was installed were once queued here, in one
-- statement over the whole table. `reactor migrate` now ends with a reconcile pass instead
-- (migration 0008), in chunks and after the triggers exist, so nothing is missed in between.

-- Replaced by the queue and by reactor.job_changed_v1's triggers.
DROP TRIGGER IF EXISTS reactor_terminal_insert ON analysis_jobs;
DROP TRIGGER IF EXISTS reactor_terminal_update ON analysis_jobs;
DROP FUNCTION IF EXISTS reactor.notify_terminal_v1();
DROP INDEX IF EXISTS analysis_jobs_reactor_due_idx;
