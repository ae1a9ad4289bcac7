-- The trigger may be installed not to notify at all (`reactor migrate --no-notify`): its channel
-- argument is then '', the job is still queued, and the reactors poll the queue instead. For an
-- app that finishes many jobs a second this spares every finishing commit the server-wide NOTIFY
-- lock; the reactors find the mode in the catalog (the trigger's arguments) at their next check.

CREATE OR REPLACE FUNCTION reactor.hint_v1(channel text, job_id uuid, updated_at timestamptz)
    RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp AS
$$
BEGIN
    IF channel <> ''
       AND pg_notification_queue_usage()
           < coalesce(nullif(current_setting('reactor.notify_queue_limit', true), ''), '0.5')::float8
    THEN
        PERFORM pg_notify(channel, job_id::text || '@' || extract(epoch FROM updated_at));
    END IF;
END
$$;

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
    -- becomes eligible later (its results arrive in a second update); not at all when the
    -- trigger was installed not to notify.
    IF TG_ARGV[0] <> ''
       AND (TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM NEW.status
            OR (eligible AND NOT was_eligible)) THEN
        PERFORM reactor.hint_v1(TG_ARGV[0], NEW.id, NEW.updated_at);
    END IF;
    RETURN NULL;
END
$$;

-- A run's jobs queued again by a change to its run row. A job still queued gets a new version of
-- its queue row rather than none: a scan or a timer that judged the old version ("no run needed:
-- a tab saved it") then leaves the row alone instead of dropping a job that needs a run again.
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
             INSERT INTO reactor.pending AS p (job_id, since)
             SELECT j.id, least(j.updated_at, now())
               FROM %I.analysis_jobs j
              WHERE j.run_id = ANY($1)
                AND j.status IN (''complete'', ''failed'')
                AND j.deleted_at IS NULL
                AND j.doc_html IS NOT NULL
                AND j.results IS NOT NULL
                AND j.results <> ''{}''::jsonb
             ON CONFLICT (job_id) DO UPDATE SET since = least(p.since, EXCLUDED.since)
             RETURNING job_id, since)
         SELECT array_agg(job_id), array_agg(since) FROM queued', app_schema)
    INTO queued, queued_since
    USING run_ids;
    FOR i IN 1 .. coalesce(array_length(queued, 1), 0) LOOP
        PERFORM reactor.hint_v1(channel, queued[i], queued_since[i]);
    END LOOP;
END
$$;
