-- The precedence rule as a function, so the write's conflict check sees the newest committed
-- jobs. A subquery in ON CONFLICT ... WHERE reads the statement's snapshot: a later job of the
-- same run, created after the statement began and already recorded by another replica, would
-- be invisible, and its run row would be taken for an orphan and overwritten by the older job.
-- A VOLATILE PL/pgSQL function takes a fresh snapshot for each query it runs (READ COMMITTED).
--
-- True when the run row written for job run_job (saved by run_saved_by) may be replaced by
-- job new_job: only a worker row, and only one written for an earlier job of the run (older
-- created_at, ties broken by id). NULL saved_by is a legacy client row.
CREATE OR REPLACE FUNCTION reactor.outranks_v1(new_job uuid, run_job uuid, run_saved_by text)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS
$$
BEGIN
    RETURN coalesce(run_saved_by, 'client') = 'worker'
       AND NOT EXISTS (SELECT 1
                         FROM analysis_jobs rj, analysis_jobs j
                        WHERE rj.id = run_job AND j.id = new_job
                          AND (rj.created_at, rj.id) >= (j.created_at, j.id));
END
$$;
