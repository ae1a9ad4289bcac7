-- Trust boundaries.
--
-- 1. The trigger functions act as their owner (SECURITY DEFINER), since the app's role need not
--    see the reactor's schema. Until now they found the app's tables through the schema of the
--    table whose trigger called them (TG_TABLE_SCHEMA), and PUBLIC could execute them, so any
--    role could hang them on a temporary table next to a temporary view of its own making and
--    run its code as their owner. Now they act only for the tables `reactor migrate` installed
--    them on (reactor.app_tables, by oid, refreshed by every migrate), refuse any other before
--    they read a column of its row, and read the app's tables by that oid alone. No reactor
--    function is executable by PUBLIC any more (notify_triggers.sql revokes it on every migrate).
-- 2. A job whose run can never be written (the app's own constraint or trigger rejects the row)
--    is set aside with its error instead of failing every batch it heads (reactor.set_aside).
-- 3. A malformed reactor.notify_queue_limit setting no longer fails the app's commit.

-- The app's tables the triggers were installed on. regclass: an oid that follows a rename and
-- is dumped and restored by name.
CREATE TABLE IF NOT EXISTS reactor.app_tables (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    jobs       regclass NOT NULL,
    runs       regclass NOT NULL
);

INSERT INTO reactor.app_tables (jobs, runs) VALUES ('analysis_jobs', 'analysis_runs')
    ON CONFLICT DO NOTHING;

-- Jobs whose write failed on their own data, until a write of theirs succeeds. A job stays in
-- reactor.pending meanwhile; the record statements leave it out until retry_at, or at once
-- once the app touches the job (a new updated_at is new data). `reactor migrate` and
-- `reactor sweep --once` release every job set aside.
CREATE TABLE IF NOT EXISTS reactor.set_aside (
    job_id           uuid PRIMARY KEY,
    job_updated_at   timestamptz,             -- the job's updated_at when its write failed
    error            text NOT NULL,           -- the error's first line
    sqlstate         text,
    failures         integer NOT NULL DEFAULT 1,
    first_failed_at  timestamptz NOT NULL DEFAULT now(),
    last_failed_at   timestamptz NOT NULL DEFAULT now(),
    retry_at         timestamptz NOT NULL
);

-- The runtime roles of an existing install keep working: whoever may queue jobs today gets what
-- the new objects need, and EXECUTE on the precedence rule, which it had through PUBLIC.
DO $$
DECLARE
    grantee name;
BEGIN
    FOR grantee IN
        SELECT DISTINCT r.rolname
          FROM pg_class c
         CROSS JOIN LATERAL aclexplode(c.relacl) AS a
          JOIN pg_roles r ON r.oid = a.grantee
         WHERE c.oid = 'reactor.pending'::regclass AND a.privilege_type = 'INSERT'
           AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON reactor.set_aside TO %I', grantee);
        EXECUTE format('GRANT EXECUTE ON FUNCTION reactor.outranks_v1(uuid, uuid, text) TO %I',
                       grantee);
    END LOOP;
END
$$;

-- The app's table a trigger function was called for: the installed one, or a partition of it.
-- Anything else is refused before the caller's row is read.
CREATE OR REPLACE FUNCTION reactor.app_table_v1(which text, relid oid) RETURNS regclass
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

CREATE OR REPLACE FUNCTION reactor.hint_v1(channel text, job_id uuid, updated_at timestamptz)
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

CREATE OR REPLACE FUNCTION reactor.job_changed_v1() RETURNS trigger
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

-- A run's jobs queued again by a change to its run row (see 0012 for why a queued job gets a
-- new version of its queue row). The jobs table is the installed one, never a name the caller
-- passed: v1 took the schema as an argument.
CREATE OR REPLACE FUNCTION reactor.queue_runs_v2(run_ids uuid[], channel text)
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

CREATE OR REPLACE FUNCTION reactor.run_changed_v1() RETURNS trigger
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

CREATE OR REPLACE FUNCTION reactor.jobs_deleted_v1() RETURNS trigger
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

DROP FUNCTION IF EXISTS reactor.queue_runs_v1(name, uuid[], text);
