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

CREATE FUNCTION reactor.notify_terminal_v1() RETURNS trigger
    LANGUAGE plpgsql AS
$$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], NEW.id::text);
    RETURN NULL;
END
$$;

CREATE INDEX analysis_jobs_reactor_due_idx
    ON analysis_jobs (updated_at, id)
    WHERE status IN ('complete', 'failed')
      AND deleted_at IS NULL
      AND doc_html IS NOT NULL
      AND results IS NOT NULL
      AND results <> '{}'::jsonb;

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
