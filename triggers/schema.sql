-- The reactor's objects as the newest migration leaves them, in one place to read, and what a
-- first install applies (rendered for the mapping in force; idempotent, so a printed script may
-- be applied twice). Applied on
-- top of the app's tables (reference.sql) and followed by notify_triggers.sql, it must give the
-- same catalog as every file in migrations/; tests/integration/test_schema.py checks that.

CREATE SCHEMA IF NOT EXISTS @reactor@;

CREATE TABLE IF NOT EXISTS @reactor@.schema_version (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- The reference schema has runs.saved_by (reference.sql); migration 0002 added it to older apps.
ALTER TABLE @runs@
    ADD COLUMN IF NOT EXISTS @saved_by@ text CHECK (@saved_by@ IN @saved_by_values@);

CREATE TABLE IF NOT EXISTS @reactor@.pending (
    job_id  @job_type@ PRIMARY KEY,
    since   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS pending_since_idx ON @reactor@.pending (since);

-- The app's tables the triggers were installed on. regclass: an oid that follows a rename and
-- is dumped and restored by name. mapping_digest: what `reactor migrate` installed for the
-- mapping file (reactor/db/drift.py); `reactor run` refuses a file that renders otherwise.
CREATE TABLE IF NOT EXISTS @reactor@.app_tables (
    singleton       boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    jobs            regclass NOT NULL,
    runs            regclass NOT NULL,
    mapping_digest  text
);

INSERT INTO @reactor@.app_tables (jobs, runs) VALUES (@jobs_name@, @runs_name@)
    ON CONFLICT DO NOTHING;

-- Jobs whose write failed on their own data, until a write of theirs succeeds. A job stays in
-- @reactor@.pending meanwhile; the record statements leave it out until retry_at, or at once
-- once the app touches the job (a new updated_at is new data). `reactor migrate` and
-- `reactor sweep --once` release every job set aside.
CREATE TABLE IF NOT EXISTS @reactor@.set_aside (
    job_id           @job_type@ PRIMARY KEY,
    job_updated_at   timestamptz,             -- the job's updated_at when its write failed
    error            text NOT NULL,           -- the error's first line
    sqlstate         text,
    failures         integer NOT NULL DEFAULT 1,
    first_failed_at  timestamptz NOT NULL DEFAULT now(),
    last_failed_at   timestamptz NOT NULL DEFAULT now(),
    retry_at         timestamptz NOT NULL
);

-- What each worker row of the runs table was written from, one row per run key the reactor
-- wrote: the job, and the job's updated_at it read (migration 0022). A worker row whose job has
-- another updated_at now stands for an earlier finish of it, which the job's last finish
-- replaces (outranks_v2, notify_triggers.sql). No row: the row stands for the job as it is.
CREATE TABLE IF NOT EXISTS @reactor@.recorded (
    run_id          @run_type@ PRIMARY KEY,
    job_id          @job_type@ NOT NULL,
    job_updated_at  timestamptz NOT NULL
);

-- The app's table a trigger function was called for: the installed one, or a partition of it.
-- Anything else is refused before the caller's row is read.
CREATE OR REPLACE FUNCTION @reactor@.app_table_v1(which text, relid oid) RETURNS regclass
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp AS
$$
DECLARE
    installed regclass;
BEGIN
    SELECT CASE which WHEN 'jobs' THEN t.jobs WHEN 'runs' THEN t.runs END
      INTO installed FROM @reactor@.app_tables t;
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

CREATE OR REPLACE FUNCTION @reactor@.hint_v1(channel text, job_id @job_type@, updated_at timestamptz)
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

CREATE TABLE IF NOT EXISTS @reactor@.hook_outbox (
    run_id        @run_type@ NOT NULL,
    job_id        @job_type@ NOT NULL,
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
    -- The replica whose lease a running row is under: when the others see it die, they take
    -- the row back at once rather than when the lease runs out.
    leased_by     text,
    -- A row stands for one finish of its (run, job): a later finish's write queues it again
    -- (finish counts them; the idempotency key carries it). job_updated_at: the finish it was
    -- queued for (NULL: before migration 0022).
    finish        integer NOT NULL DEFAULT 0,
    job_updated_at timestamptz,
    PRIMARY KEY (run_id, job_id, hook)
);

CREATE UNIQUE INDEX IF NOT EXISTS hook_outbox_id_idx ON @reactor@.hook_outbox (id);

-- Open rows only: the claim, the health and status counts, the next-due lookup.
CREATE INDEX IF NOT EXISTS hook_outbox_open_idx
    ON @reactor@.hook_outbox (available_at) INCLUDE (status, hook, created_at)
    WHERE status IN ('pending', 'running');

-- Parked rows only: the failure counts and listings.
CREATE INDEX IF NOT EXISTS hook_outbox_failed_idx
    ON @reactor@.hook_outbox (updated_at)
    WHERE status = 'failed';

-- Settled rows only: the retention job, oldest first.
CREATE INDEX IF NOT EXISTS hook_outbox_settled_idx
    ON @reactor@.hook_outbox (updated_at)
    WHERE status IN ('done', 'superseded', 'cancelled');

-- The reconcile's shared state (see queries.sql, reconcile_step), one row.
CREATE TABLE IF NOT EXISTS @reactor@.reconcile (
    singleton         boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    pass              bigint NOT NULL DEFAULT 0,     -- the pass in progress, or the last one
    -- The pass in progress; pass_started_at is NULL between passes.
    pass_started_at   timestamptz,
    cursor_run        @run_type@,
    cursor_job        @job_type@,
    pass_examined     bigint NOT NULL DEFAULT 0,
    pass_found        bigint NOT NULL DEFAULT 0,
    pass_example      @job_type@,
    owner             text,
    owner_until       timestamptz,
    -- Set when a pass should start at once (TRUNCATE analysis_runs, `reactor sweep --once`).
    requested_at      timestamptz,
    -- The last completed pass.
    last_started_at   timestamptz,
    last_finished_at  timestamptz,
    last_examined     bigint,
    last_found        bigint,
    last_example      @job_type@,
    -- Who ran it: a replica, `reactor sweep --once`, or the `reactor migrate` that installed
    -- the triggers (whose pass finds the jobs that finished before they existed: no drift).
    last_owner        text
);

INSERT INTO @reactor@.reconcile DEFAULT VALUES ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS @reactor@.replicas (
    id            text PRIMARY KEY,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    session_pid   integer,
    grace_seconds float8,
    write_error   text
);

-- The doorbell (migration 0020): while a replica polls the queue under a stream of jobs, it
-- keeps its channel's row awake and the job trigger skips its NOTIFY. Unlogged: renewing it
-- waits for no WAL flush, and a crash or a promotion leaves it empty, where every job notifies.
CREATE UNLOGGED TABLE IF NOT EXISTS @reactor@.doorbell (
    channel      text PRIMARY KEY,
    awake_until  timestamptz NOT NULL
);

-- The install lock (migration 0021): a lease on this row says which session runs `reactor
-- migrate` now (reactor/db/migrations.py); only the owner may change it. The session that
-- installs holds it from the start.
CREATE TABLE IF NOT EXISTS @reactor@.install_lock (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    pid            integer,
    usesysid       oid,
    backend_start  timestamptz,
    taken_at       timestamptz
);

INSERT INTO @reactor@.install_lock (pid, usesysid, backend_start, taken_at)
VALUES (pg_backend_pid(),
        (SELECT a.usesysid FROM pg_stat_activity a WHERE a.pid = pg_backend_pid()),
        (SELECT a.backend_start FROM pg_stat_activity a WHERE a.pid = pg_backend_pid()),
        now())
ON CONFLICT DO NOTHING;

-- What the mapping shapes (the trigger functions, outranks_v1, queue_runs_v2, the triggers and
-- the reconcile's walk index) is in notify_triggers.sql, which every `reactor migrate` applies.
