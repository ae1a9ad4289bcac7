-- A job's finish could not be HOT: the walk index's predicate named status, and PostgreSQL makes
-- an update HOT only when no indexed column changes, the columns of a partial index's predicate
-- included. So every finishing update wrote a new heap tuple and an entry in every index of
-- analysis_jobs, the app's primary key included. The replacement names no column that a job's
-- progress or its finish changes: (run_id, id) where the job is not deleted and holds its
-- document. The reconcile's walk reads the status from the few job rows no run row stands for,
-- as it reads results already.
SELECT 'analysis_jobs_reactor_finished_idx is replaced by analysis_jobs_reactor_run_idx'
    AS migration_0016;

-- After this transaction `reactor migrate` builds analysis_jobs_reactor_run_idx on analysis_jobs
-- (run_id, id) WHERE deleted_at IS NULL AND doc_html IS NOT NULL, CONCURRENTLY, and drops
-- analysis_jobs_reactor_finished_idx: see reactor/db/indexes.py.
