-- The walk's index named results in its predicate, and PostgreSQL makes an update HOT only when
-- no indexed column changes, the columns of a partial index's predicate included: every progress
-- update of a running job (it adds verdicts to results) had to write a new entry into every
-- index of analysis_jobs. The replacement names only columns that change once in a job's life:
-- status when it finishes, deleted_at when it is deleted, doc_html when the app trims it. The
-- app's progress updates, which touch results and updated_at, are HOT again; the results half of
-- the row-local predicate is read from the job row by the statements that use the index (the
-- reconcile only for the few walked jobs that no run row stands for).
SELECT 'analysis_jobs_reactor_walk_idx is replaced by analysis_jobs_reactor_finished_idx'
    AS migration_0015;

-- After this transaction `reactor migrate` builds analysis_jobs_reactor_finished_idx on
-- analysis_jobs (run_id, id) WHERE the job is terminal, not deleted and holds its document,
-- CONCURRENTLY, and drops analysis_jobs_reactor_walk_idx: see reactor/db/indexes.py. Built
-- without blocking the app's writes; `reactor migrate` drops a build that a crash left invalid
-- before it tries again.
