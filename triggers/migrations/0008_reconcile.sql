-- The level half of the design. The job table is the truth and reactor.pending only its index:
-- a reconcile walks the jobs that can still need a run and queues the ones the triggers never
-- saw (a data-only restore, logical replication, a disabled trigger, a deleted run row, queue
-- rows deleted by hand). The triggers below close the cheap roads at once; the walk is the
-- backstop for every road.

-- Where the walk stands, one row shared by every replica. A pass walks analysis_jobs in
-- (run_id, id) order, a chunk per statement; whichever replica holds the lease runs the next
-- chunk, so one pass runs at a time and survives the death of the replica that began it.
CREATE TABLE IF NOT EXISTS reactor.reconcile (
    singleton         boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    pass              bigint NOT NULL DEFAULT 0,     -- the pass in progress, or the last one
    -- The pass in progress; pass_started_at is NULL between passes.
    pass_started_at   timestamptz,
    cursor_run        uuid,
    cursor_job        uuid,
    pass_examined     bigint NOT NULL DEFAULT 0,
    pass_found        bigint NOT NULL DEFAULT 0,
    pass_example      uuid,
    owner             text,
    owner_until       timestamptz,
    -- Set when a pass should start at once (TRUNCATE analysis_runs, `reactor sweep --once`).
    requested_at      timestamptz,
    -- The last completed pass.
    last_started_at   timestamptz,
    last_finished_at  timestamptz,
    last_examined     bigint,
    last_found        bigint,
    last_example      uuid,
    -- Who ran it: a replica, `reactor sweep --once`, or the `reactor migrate` that installed
    -- the triggers (whose pass finds the jobs that finished before they existed: no drift).
    last_owner        text
);

INSERT INTO reactor.reconcile DEFAULT VALUES ON CONFLICT DO NOTHING;

-- Wakes the reactors about one job, unless the NOTIFY queue is too full for it: the queue row
-- is what matters, the NOTIFY only makes the reactors hear of it sooner. The payload is
-- `<job id>@<updated_at as unix seconds>`: the reactors aim their timers at updated_at + grace
-- by the database clock, not at receipt plus grace, which would add the time the app's
-- transaction ran after setting updated_at. When the queue is half
-- full (a session LISTENs without reading), the NOTIFY is skipped so that the app's commit can
-- never fail on it; the reactors' scan finds the queued job instead, and they report the
-- queue's state. The share can be set per database or role (`ALTER DATABASE ... SET
-- reactor.notify_queue_limit = '0.2'`); 0 never notifies.
CREATE OR REPLACE FUNCTION reactor.hint_v1(channel text, job_id uuid, updated_at timestamptz)
    RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp AS
$$
BEGIN
    IF pg_notification_queue_usage()
       < coalesce(nullif(current_setting('reactor.notify_queue_limit', true), ''), '0.5')::float8
    THEN
        PERFORM pg_notify(channel, job_id::text || '@' || extract(epoch FROM updated_at));
    END IF;
END
$$;

-- The job trigger, now waking the reactors through reactor.hint_v1.
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
        PERFORM reactor.hint_v1(TG_ARGV[0], NEW.id, NEW.updated_at);
    END IF;
    RETURN NULL;
END
$$;

-- Queues the jobs of the given runs that are row-locally eligible, and wakes the reactors about
-- them; the record statement decides which really need a run and the scan drops the rest. The
-- app's tables are found in the schema of the table whose trigger called (the search_path is
-- fixed), hence the dynamic statement.
CREATE OR REPLACE FUNCTION reactor.queue_runs_v1(app_schema name, run_ids uuid[], channel text)
    RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    queued uuid[];
    queued_since timestamptz[];
BEGIN
    EXECUTE format(
        'WITH queued AS (
             INSERT INTO reactor.pending (job_id, since)
             SELECT j.id, least(j.updated_at, now())
               FROM %I.analysis_jobs j
              WHERE j.run_id = ANY($1)
                AND j.status IN (''complete'', ''failed'')
                AND j.deleted_at IS NULL
                AND j.doc_html IS NOT NULL
                AND j.results IS NOT NULL
                AND j.results <> ''{}''::jsonb
             ON CONFLICT (job_id) DO NOTHING
             RETURNING job_id, since)
         SELECT array_agg(job_id), array_agg(since) FROM queued', app_schema)
    INTO queued, queued_since
    USING run_ids;
    FOR i IN 1 .. coalesce(array_length(queued, 1), 0) LOOP
        PERFORM reactor.hint_v1(channel, queued[i], queued_since[i]);
    END LOOP;
END
$$;

-- A run row that goes away, or changes so that it may no longer stand for its jobs (a client
-- row turned worker, a row moved to another job or run id), can leave a job of its run without
-- the run it needs: queue the run's jobs in the same transaction. TRUNCATE has no rows to look
-- at: it asks for a reconcile pass, which every replica sees at its next health check.
CREATE OR REPLACE FUNCTION reactor.run_changed_v1() RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        UPDATE reactor.reconcile SET requested_at = now();
    ELSE
        PERFORM reactor.queue_runs_v1(TG_TABLE_SCHEMA, ARRAY[OLD.id], TG_ARGV[0]);
    END IF;
    RETURN NULL;
END
$$;

-- A job hard-deleted while a worker row stands for it: under the precedence rule an earlier
-- job of the same run may now need a run again. Statement-level with a transition table, so a
-- bulk delete costs one set-based statement, not one per row.
CREATE OR REPLACE FUNCTION reactor.jobs_deleted_v1() RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    runs uuid[];
BEGIN
    EXECUTE format(
        'SELECT array_agg(DISTINCT r.id)
           FROM reactor_deleted_jobs d
           JOIN %I.analysis_runs r ON r.id = d.run_id AND r.job_id = d.id
          WHERE r.saved_by = ''worker''', TG_TABLE_SCHEMA)
    INTO runs;
    IF runs IS NOT NULL THEN
        PERFORM reactor.queue_runs_v1(TG_TABLE_SCHEMA, runs, TG_ARGV[0]);
    END IF;
    RETURN NULL;
END
$$;

-- This migration once built the walk's index here, analysis_jobs_reactor_walk_idx; migration 0015
-- replaced it with one the app's progress updates leave HOT and drops it where it exists. A new
-- install skips the build: on a big live table it took minutes only to be dropped.
