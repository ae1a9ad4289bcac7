-- A retried job's artifact holds its last finish. The reactor's worker row of a run stood for
-- the job it was written from, whatever became of that job after: a job that failed, was
-- retried and finished again kept its first finish's row. The reactor now keeps, per run key
-- it wrote, the job and the job's updated_at it wrote the row from (one row per artifact, not
-- per write), written by the record statement itself. A worker row written from an updated_at
-- the job no longer has stands for an earlier finish, and the job's last finish replaces it
-- after its grace (outranks_v2, notify_triggers.sql). The app's tables and its commits are
-- untouched: nothing here is written by the app's triggers.
CREATE TABLE IF NOT EXISTS @reactor@.recorded (
    run_id          @run_type@ PRIMARY KEY,
    job_id          @job_type@ NOT NULL,
    job_updated_at  timestamptz NOT NULL
);

-- The worker rows written before this migration stand for their job as it is now: nothing is
-- written again by the upgrade, and a finish after it is told apart. One pass over the worker
-- rows, reading the job of each; the app's tables take no lock but a read's.
INSERT INTO @reactor@.recorded (run_id, job_id, job_updated_at)
SELECT @r.key@, @r.job@, @j.updated_at@
  FROM @runs@ r JOIN @jobs@ j ON @j.id@ = @r.job@
 WHERE @r.saved_by@ = @worker@ AND @j.run@ = @r.key@
ON CONFLICT (run_id) DO NOTHING;

-- A hook row stands for one finish of its (run, job): a later finish's write queues the row
-- again (finish counts them, and the idempotency key carries it) rather than finding it there
-- and adding nothing. job_updated_at is the finish the row was queued for; NULL before this.
ALTER TABLE @reactor@.hook_outbox ADD COLUMN IF NOT EXISTS finish integer NOT NULL DEFAULT 0;
ALTER TABLE @reactor@.hook_outbox ADD COLUMN IF NOT EXISTS job_updated_at timestamptz;

-- The precedence rule with the later finish in it. notify_triggers.sql, which `reactor migrate`
-- applies right after this file, gives it its body; it is declared here, never outranking,
-- so that the runtime roles of an existing install can be granted it below.
CREATE OR REPLACE FUNCTION @reactor@.outranks_v2(new_job @job_type@, run_job @job_type@,
                                               run_saved_by text)
    RETURNS boolean
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    RETURN false;
REVOKE ALL ON FUNCTION @reactor@.outranks_v2(@job_type@, @job_type@, text) FROM PUBLIC;

-- The runtime roles of an existing install keep working: whoever may queue jobs today gets
-- what the record statement now writes and calls.
DO $$
DECLARE
    grantee name;
BEGIN
    FOR grantee IN
        SELECT DISTINCT r.rolname
          FROM pg_class c
         CROSS JOIN LATERAL aclexplode(c.relacl) AS a
          JOIN pg_roles r ON r.oid = a.grantee
         WHERE c.oid = '@reactor@.pending'::regclass AND a.privilege_type = 'INSERT'
           AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON @reactor@.recorded TO %I', grantee);
        EXECUTE format('GRANT EXECUTE ON FUNCTION @reactor@.outranks_v2(@job_type@, @job_type@, '
                       'text) TO %I', grantee);
    END LOOP;
END
$$;
