-- The reactor's objects as the newest migration leaves them, in one place to read. Applied on
-- top of the app's tables (reference.sql) and followed by notify_triggers.sql, it must give the
-- same catalog as every file in migrations/; tests/integration/test_schema.py checks that.

CREATE SCHEMA reactor;

CREATE TABLE reactor.schema_version (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- analysis_runs.saved_by is part of reference.sql; migration 0002 adds it to older apps.

CREATE TABLE reactor.pending (
    job_id  uuid PRIMARY KEY,
    since   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX pending_since_idx ON reactor.pending (since);

CREATE FUNCTION reactor.job_changed_v1() RETURNS trigger
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

CREATE TABLE reactor.hook_outbox (
    run_id        uuid NOT NULL,
    job_id        uuid NOT NULL,
    hook          text NOT NULL,
    status        text NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'running', 'done', 'failed')),
    attempts      integer NOT NULL DEFAULT 0,
    last_error    text,
    available_at  timestamptz NOT NULL DEFAULT now(),
    leased_until  timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, job_id, hook)
);

CREATE INDEX hook_outbox_claim_idx
    ON reactor.hook_outbox (available_at)
    WHERE status IN ('pending', 'running');

CREATE FUNCTION reactor.outranks_v1(new_job uuid, run_job uuid, run_saved_by text)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    -- The schema of analysis_jobs when it was migrated (the reference schema's is public).
    SET search_path = pg_catalog, public, pg_temp AS
$$
BEGIN
    RETURN coalesce(run_saved_by, 'client') = 'worker'
       AND NOT EXISTS (SELECT 1
                         FROM analysis_jobs rj, analysis_jobs j
                        WHERE rj.id = run_job AND j.id = new_job
                          AND (rj.created_at, rj.id) >= (j.created_at, j.id));
END
$$;
