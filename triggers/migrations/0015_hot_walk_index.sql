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

-- reactor: outside-transaction
-- The jobs that can still need a run, in (run_id, id) order: the reconcile's walk and the
-- triggers' road from a run to its jobs. Partial on the document, so it holds the app's trim
-- window of finished jobs rather than the whole table. Built without blocking the app's writes;
-- `reactor migrate` drops a build that a crash left invalid before it tries again.
CREATE INDEX CONCURRENTLY IF NOT EXISTS analysis_jobs_reactor_finished_idx
    ON analysis_jobs (run_id, id)
    WHERE status IN ('complete', 'failed')
      AND deleted_at IS NULL
      AND doc_html IS NOT NULL;

DROP INDEX CONCURRENTLY IF EXISTS analysis_jobs_reactor_walk_idx;
