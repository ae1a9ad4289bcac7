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

-- The app's tables the triggers were installed on. regclass: an oid that follows a rename and
-- is dumped and restored by name.
CREATE TABLE reactor.app_tables (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    jobs       regclass NOT NULL,
    runs       regclass NOT NULL
);

INSERT INTO reactor.app_tables (jobs, runs) VALUES ('analysis_jobs', 'analysis_runs');

-- Jobs whose write failed on their own data, until a write of theirs succeeds. A job stays in
-- reactor.pending meanwhile; the record statements leave it out until retry_at, or at once
-- once the app touches the job (a new updated_at is new data). `reactor migrate` and
-- `reactor sweep --once` release every job set aside.
CREATE TABLE reactor.set_aside (
    job_id           uuid PRIMARY KEY,
    job_updated_at   timestamptz,             -- the job's updated_at when its write failed
    error            text NOT NULL,           -- the error's first line
    sqlstate         text,
    failures         integer NOT NULL DEFAULT 1,
    first_failed_at  timestamptz NOT NULL DEFAULT now(),
    last_failed_at   timestamptz NOT NULL DEFAULT now(),
    retry_at         timestamptz NOT NULL
);

-- The app's table a trigger function was called for: the installed one, or a partition of it.
-- Anything else is refused before the caller's row is read.
CREATE FUNCTION reactor.app_table_v1(which text, relid oid) RETURNS regclass
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    installed regclass;
BEGIN
    SELECT CASE which WHEN 'jobs' THEN t.jobs WHEN 'runs' THEN t.runs END
      INTO installed FROM reactor.app_tables t;
    IF installed IS NULL
       OR (relid <> installed
           AND installed NOT IN (SELECT a.relid FROM pg_partition_ancestors(relid) AS a)) THEN
        RAISE EXCEPTION 'reactor: a reactor trigger function was called for table %, not the '
                        'app''s % table %', relid::regclass, which, installed
              USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN installed;
END
$$;

CREATE FUNCTION reactor.hint_v1(channel text, job_id uuid, updated_at timestamptz)
    RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    -- A setting of the app's sessions: read in the app's commit, so a value that is not a
    -- number must not fail it. A number that matches the pattern always casts.
    setting text := current_setting('reactor.notify_queue_limit', true);
    queue_limit float8 := 0.5;
BEGIN
    IF setting ~ '^\s*([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\s*$' THEN
        queue_limit := setting::float8;
    END IF;
    IF channel <> '' AND pg_notification_queue_usage() < queue_limit THEN
        PERFORM pg_notify(channel, job_id::text || '@' || extract(epoch FROM updated_at));
    END IF;
END
$$;

CREATE FUNCTION reactor.job_changed_v1() RETURNS trigger
    LANGUAGE plpgsql
    -- It runs in the app's transactions, as the app's role, which need not see the reactor's
    -- schema: it acts as its owner instead, with a search_path nobody else can plant objects in.
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    eligible boolean;
    was_eligible boolean;
BEGIN
    -- First, before any column of the row is read: another table's columns could be of types
    -- whose casts or operators run their owner's code with this function's rights.
    PERFORM reactor.app_table_v1('jobs', TG_RELID);
    -- The row-local half of "needs a run"; analysis_runs decides the rest at record time.
    eligible := NEW.deleted_at IS NULL AND NEW.doc_html IS NOT NULL
                AND NEW.results IS NOT NULL AND NEW.results <> '{}'::jsonb;
    was_eligible := TG_OP = 'UPDATE' AND OLD.status IN ('complete', 'failed')
                    AND OLD.deleted_at IS NULL AND OLD.doc_html IS NOT NULL
                    AND OLD.results IS NOT NULL AND OLD.results <> '{}'::jsonb;
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

CREATE TABLE reactor.hook_outbox (
    run_id        uuid NOT NULL,
    job_id        uuid NOT NULL,
    hook          text NOT NULL,
    -- pending -> running -> done | pending (retry) | failed (parked); superseded: the run held a
    -- later job when the row was claimed; cancelled: by an operator.
    status        text NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'running', 'done', 'failed', 'superseded',
                                    'cancelled')),
    -- Claims so far; the fencing token of a lease, so it only grows.
    attempts      integer NOT NULL DEFAULT 0,
    last_error    text,
    available_at  timestamptz NOT NULL DEFAULT now(),
    leased_until  timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    -- The short id `reactor hooks` shows and takes.
    id            bigint GENERATED ALWAYS AS IDENTITY,
    -- attempts before the last `reactor hooks retry`: the schedule counts from there.
    retry_base    integer NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, job_id, hook)
);

CREATE UNIQUE INDEX hook_outbox_id_idx ON reactor.hook_outbox (id);

-- Open rows only: the claim, the health and status counts, the next-due lookup.
CREATE INDEX hook_outbox_open_idx
    ON reactor.hook_outbox (available_at) INCLUDE (status, hook, created_at)
    WHERE status IN ('pending', 'running');

-- Parked rows only: the failure counts and listings.
CREATE INDEX hook_outbox_failed_idx
    ON reactor.hook_outbox (updated_at)
    WHERE status = 'failed';

-- Settled rows only: the retention job, oldest first.
CREATE INDEX hook_outbox_settled_idx
    ON reactor.hook_outbox (updated_at)
    WHERE status IN ('done', 'superseded', 'cancelled');

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

-- The reconcile's shared state (see queries.sql, reconcile_step), one row.
CREATE TABLE reactor.reconcile (
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

INSERT INTO reactor.reconcile DEFAULT VALUES;

CREATE FUNCTION reactor.queue_runs_v2(run_ids uuid[], channel text)
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
               FROM %s j
              WHERE j.run_id = ANY($1)
                AND j.status IN (''complete'', ''failed'')
                AND j.deleted_at IS NULL
                AND j.doc_html IS NOT NULL
                AND j.results IS NOT NULL
                AND j.results <> ''{}''::jsonb
             ON CONFLICT (job_id) DO UPDATE SET since = least(p.since, EXCLUDED.since)
             RETURNING job_id, since)
         SELECT array_agg(job_id), array_agg(since) FROM queued',
        (SELECT t.jobs FROM reactor.app_tables t))
    INTO queued, queued_since
    USING run_ids;
    FOR i IN 1 .. coalesce(array_length(queued, 1), 0) LOOP
        PERFORM reactor.hint_v1(channel, queued[i], queued_since[i]);
    END LOOP;
END
$$;

CREATE FUNCTION reactor.run_changed_v1() RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
BEGIN
    PERFORM reactor.app_table_v1('runs', TG_RELID);
    IF TG_OP = 'TRUNCATE' THEN
        UPDATE reactor.reconcile SET requested_at = now();
    ELSE
        PERFORM reactor.queue_runs_v2(ARRAY[OLD.id], TG_ARGV[0]);
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION reactor.jobs_deleted_v1() RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    runs uuid[];
BEGIN
    PERFORM reactor.app_table_v1('jobs', TG_RELID);
    EXECUTE format(
        'SELECT array_agg(DISTINCT r.id)
           FROM reactor_deleted_jobs d
           JOIN %s r ON r.id = d.run_id AND r.job_id = d.id
          WHERE r.saved_by = ''worker''', (SELECT t.runs FROM reactor.app_tables t))
    INTO runs;
    IF runs IS NOT NULL THEN
        PERFORM reactor.queue_runs_v2(runs, TG_ARGV[0]);
    END IF;
    RETURN NULL;
END
$$;

-- The reconcile's walk, and the road from a run to its jobs. Its key and predicate name only
-- columns that change once in a job's life, so the app's progress updates (results, updated_at)
-- stay HOT; the statements that use it read the results half of the predicate from the row.
CREATE INDEX analysis_jobs_reactor_finished_idx
    ON analysis_jobs (run_id, id)
    WHERE status IN ('complete', 'failed')
      AND deleted_at IS NULL
      AND doc_html IS NOT NULL;

CREATE TABLE reactor.replicas (
    id            text PRIMARY KEY,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    session_pid   integer
);
