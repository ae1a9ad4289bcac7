-- What the mapping shapes: the reactor's functions that read the app's tables, and its
-- triggers on them, on the NOTIFY channel (@channel@, from REACTOR_CHANNEL). Repeatable:
-- `reactor migrate` applies it after the numbered migrations every time, so a changed channel
-- or mapping needs no new migration. Its names and values are the mapping's
-- (reactor/install/mapping.py), filled in by `reactor migrate` and shown by `reactor migrate --print`.
--
-- The trigger functions act only for the tables their triggers are on (see migration 0013):
-- app_table_v1 refuses any other before a column is read. They run with a search_path nobody
-- else can plant objects in, and name the app's tables schema-qualified.
UPDATE @reactor@.app_tables SET jobs = @jobs_name@, runs = @runs_name@;

-- True when a run row written for run_job (with run_saved_by) may be replaced by new_job: only
-- a worker row written for an earlier job of the same run (older created_at, ties broken by
-- id). It reads the newest committed jobs, not the caller's snapshot, which is what the
-- write's conflict check needs.
CREATE OR REPLACE FUNCTION @reactor@.outranks_v1(new_job @job_type@, run_job @job_type@,
                                               run_saved_by text)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp AS
$$
BEGIN
    RETURN coalesce(run_saved_by = @worker@, false)
       AND NOT EXISTS (SELECT 1
                         FROM @jobs@ rj, @jobs@ j
                        WHERE @rj.id@ = $2 AND @j.id@ = $1
                          AND @rank(rj)@ >= @rank(j)@);
END
$$;

-- The precedence rule of DESIGN.md, the newest committed jobs read as outranks_v1 reads them:
-- true when a run row written for run_job (with run_saved_by) may be replaced by new_job. Only
-- a worker row, and only one written for an earlier job of the same run (rule b), or for an
-- earlier finish of new_job itself (rule c): @reactor@.recorded says the row was written from
-- an updated_at the job no longer has (it was retried, or moved to another terminal value, or
-- touched, since). No recorded row: the row stands for the job as it is. outranks_v1 stays
-- for the replicas of the release before, while a rolling deploy runs both.
CREATE OR REPLACE FUNCTION @reactor@.outranks_v2(new_job @job_type@, run_job @job_type@,
                                               run_saved_by text)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp AS
$$
BEGIN
    IF NOT coalesce(run_saved_by = @worker@, false) THEN
        RETURN false;
    ELSIF $1 = $2 THEN
        RETURN EXISTS (SELECT 1
                         FROM @jobs@ j JOIN @reactor@.recorded w
                           ON w.run_id = @j.run@ AND w.job_id = @j.id@
                        WHERE @j.id@ = $1 AND w.job_updated_at <> @j.updated_at@);
    END IF;
    RETURN NOT EXISTS (SELECT 1
                         FROM @jobs@ rj, @jobs@ j
                        WHERE @rj.id@ = $2 AND @j.id@ = $1
                          AND @rank(rj)@ >= @rank(j)@);
END
$$;

-- The one function a job-finishing commit of the app's calls, so it is kept to one call: the
-- guard, the queueing and the hint are inline. What it writes is one row of the queue. It is
-- kept to few statements: PL/pgSQL prepares each expression once per transaction, and an app's
-- finishing commit is a transaction of its own, so every statement here is paid per job.
CREATE OR REPLACE FUNCTION @reactor@.job_changed_v1() RETURNS trigger
    LANGUAGE plpgsql
    -- It runs in the app's transactions, as the app's role, which need not see the reactor's
    -- schema: it acts as its owner instead, with a search_path nobody else can plant objects in.
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
BEGIN
    -- First, before any column of the row is read: another table's columns could be of types
    -- whose casts or operators run their owner's code with this function's rights. The table
    -- the mapping names, in its schema, is the app's, and costs two comparisons; any other (a
    -- partition, the table renamed since migrate) gets app_table_v1's check of the installed
    -- table by oid, which refuses what is not it.
    IF TG_TABLE_NAME <> @jobs_table_name@ OR TG_TABLE_SCHEMA <> @jobs_schema_name@ THEN
        PERFORM @reactor@.app_table_v1('jobs', TG_RELID);
    END IF;
    -- The row-local half of "needs a run"; the runs table decides the rest at record time. A
    -- job that finishes again is queued too: back from a retry (it was not eligible), or moved
    -- from one terminal value to another, its last finish replaces the run of its earlier one.
    IF @eligible(NEW)@
       AND NOT (TG_OP = 'UPDATE' AND @eligible(OLD)@
                AND @OLD.status@ IS NOT DISTINCT FROM @NEW.status@) THEN
        INSERT INTO @reactor@.pending (job_id, since)
        VALUES (@NEW.id@, least(@NEW.updated_at@, now()))
            ON CONFLICT (job_id) DO UPDATE SET since = EXCLUDED.since;
    ELSIF TG_OP = 'UPDATE' AND @OLD.status@ IS NOT DISTINCT FROM @NEW.status@ THEN
        -- A terminal job updated with its status unchanged, not newly eligible: nothing to
        -- say.
        RETURN NULL;
    END IF;
    -- Wake the reactors on the transition into a terminal status, and when a terminal job
    -- becomes eligible later (its results arrive in a second update); not at all when the
    -- trigger was installed not to notify, nor while a replica keeps the channel's doorbell
    -- awake (it polls the queue: migration 0020), nor when the NOTIFY queue is past the limit
    -- (the app's sessions may set reactor.notify_queue_limit; one that is not a number is
    -- ignored, so it never fails the app's commit): the queued row is enough. The bell is read
    -- without a lock, against this transaction's start: a job queued by a transaction that
    -- began while the bell was awake has its since before awake_until, inside the windows
    -- the awake replicas go on polling for a grace after the bell falls silent.
    -- The bell is its own IF: a condition that reads a table is run by the executor, where one
    -- that reads none is evaluated as a plain expression, so the quiet install pays nothing for
    -- it.
    IF TG_ARGV[0] <> ''
       AND pg_notification_queue_usage()
           < (CASE WHEN current_setting('reactor.notify_queue_limit', true)
                        ~ '^\s*([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\s*$'
                   THEN current_setting('reactor.notify_queue_limit', true)::float8
                   ELSE 0.5 END) THEN
        IF NOT EXISTS (SELECT 1 FROM @reactor@.doorbell b
                        WHERE b.channel = TG_ARGV[0] AND b.awake_until > now()) THEN
            -- Installed with --spread (the second argument): on the channel of the job's share
            -- (reactor/core/ownership.py, share_of), which only the replica that owns it
            -- LISTENs on.
            PERFORM pg_notify(CASE WHEN TG_ARGV[1] = 'spread'
                                   THEN TG_ARGV[0] || '.' || @share(NEW)@
                                   ELSE TG_ARGV[0] END,
                              @NEW.id@::text || '@' || extract(epoch FROM @NEW.updated_at@));
        END IF;
    END IF;
    RETURN NULL;
END
$$;

-- Queues the eligible jobs of the given runs, and hints each on the channel.
CREATE OR REPLACE FUNCTION @reactor@.queue_runs_v2(run_ids @run_type@[], channel text)
    RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp AS
$$
#variable_conflict use_column
DECLARE
    queued_ids @job_type@[];
    queued_since timestamptz[];
BEGIN
    WITH queued AS (
        INSERT INTO @reactor@.pending AS p (job_id, since)
        SELECT @j.id@, least(@j.updated_at@, now())
          FROM @jobs@ j
         WHERE @j.run@ = ANY($1) AND @eligible(j)@
        ON CONFLICT (job_id) DO UPDATE SET since = least(p.since, EXCLUDED.since)
        RETURNING p.job_id, p.since)
    SELECT array_agg(q.job_id), array_agg(q.since) INTO queued_ids, queued_since FROM queued q;
    FOR i IN 1 .. coalesce(array_length(queued_ids, 1), 0) LOOP
        PERFORM @reactor@.hint_v1($2, queued_ids[i], queued_since[i]);
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION @reactor@.run_changed_v1() RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
BEGIN
    PERFORM @reactor@.app_table_v1('runs', TG_RELID);
    -- What the reactor kept of a deleted run row goes with it: @reactor@.recorded holds one
    -- row per run row, not one per write.
    IF TG_OP = 'TRUNCATE' THEN
        UPDATE @reactor@.reconcile SET requested_at = now();
        DELETE FROM @reactor@.recorded;
    ELSE
        IF TG_OP = 'DELETE' THEN
            DELETE FROM @reactor@.recorded WHERE run_id = @OLD.key@;
        END IF;
        PERFORM @reactor@.queue_runs_v2(ARRAY[@OLD.key@], TG_ARGV[0]);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION @reactor@.jobs_deleted_v1() RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
#variable_conflict use_column
DECLARE
    worker_runs @run_type@[];
BEGIN
    PERFORM @reactor@.app_table_v1('jobs', TG_RELID);
    SELECT array_agg(DISTINCT @r.key@) INTO worker_runs
      FROM reactor_deleted_jobs d
      JOIN @runs@ r ON @r.key@ = @d.run@ AND @r.job@ = @d.id@
     WHERE @r.saved_by@ = @worker@;
    IF worker_runs IS NOT NULL THEN
        PERFORM @reactor@.queue_runs_v2(worker_runs, TG_ARGV[0]);
    END IF;
    RETURN NULL;
END
$$;

-- Two job triggers because an INSERT has no OLD row. WHEN keeps them to terminal rows, so an
-- update of a running job (its progress) never calls the function; @reactor@.job_changed_v1
-- decides the rest. The WHEN is kept this small because PostgreSQL reads it back from the
-- catalog and prepares it again in every statement that updates a job, whatever the row: the
-- finer test it once held (status changed, or not yet eligible) cost a progress update more
-- than the function costs an update of a terminal job. There is no column list: an app's BEFORE
-- trigger may set status on an update that names other columns.
CREATE OR REPLACE TRIGGER @reactor@_job_insert
    AFTER INSERT ON @jobs@
    FOR EACH ROW
    WHEN (@NEW.status@ IN @terminal@)
    EXECUTE FUNCTION @reactor@.job_changed_v1(@channel@, @spread@);

CREATE OR REPLACE TRIGGER @reactor@_job_update
    AFTER UPDATE ON @jobs@
    FOR EACH ROW
    WHEN (@NEW.status@ IN @terminal@)
    EXECUTE FUNCTION @reactor@.job_changed_v1(@channel@, @spread@);

CREATE OR REPLACE TRIGGER @reactor@_jobs_delete
    AFTER DELETE ON @jobs@
    REFERENCING OLD TABLE AS reactor_deleted_jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION @reactor@.jobs_deleted_v1(@channel@);

-- A run row deleted, or changed so that it may stop standing for a job: from client to worker,
-- to another job, or to another run id. The reactor's own replacement of an earlier job's row
-- passes here too; the scan finds that the run's jobs need nothing and drops them.
CREATE OR REPLACE TRIGGER @reactor@_run_delete
    AFTER DELETE ON @runs@
    FOR EACH ROW
    EXECUTE FUNCTION @reactor@.run_changed_v1(@channel@);

CREATE OR REPLACE TRIGGER @reactor@_run_update
    AFTER UPDATE ON @runs@
    FOR EACH ROW
    WHEN (@OLD.key@ IS DISTINCT FROM @NEW.key@
          OR (@NEW.saved_by@ = @worker@
              AND (@OLD.saved_by@ IS DISTINCT FROM @worker@
                   OR @OLD.job@ IS DISTINCT FROM @NEW.job@)))
    EXECUTE FUNCTION @reactor@.run_changed_v1(@channel@);

CREATE OR REPLACE TRIGGER @reactor@_runs_truncate
    AFTER TRUNCATE ON @runs@
    FOR EACH STATEMENT
    EXECUTE FUNCTION @reactor@.run_changed_v1(@channel@);

-- Nobody but the owner calls a reactor function unless granted (`reactor migrate
-- --print-grants` grants the runtime role the one it calls). Triggers fire without EXECUTE;
-- creating one on a reactor function needs it. Functions a later migration adds are covered.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @reactor@ FROM PUBLIC;

-- A migrate is the operator's word that the app's tables or the mapping may have changed: every
-- job set aside because its write failed is tried again at once.
DELETE FROM @reactor@.set_aside;

-- After this file, `reactor migrate` builds the reconcile's walk index on the job table,
-- CONCURRENTLY, outside any transaction (reactor/db/indexes.py describes it): neither its key
-- nor its predicate names a column a job's progress or finish changes, so the app's updates of
-- a job stay HOT (migrations 0015 and 0016 replaced two that named results, then status).
