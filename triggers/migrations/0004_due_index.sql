-- Keeps the fallback scan and the re-arm query off a sequential scan. The predicate is the
-- row-local half of "needs a run", so the index holds only finished jobs that still carry their
-- document: it grows with the app's trim window, not with the table.
CREATE INDEX IF NOT EXISTS analysis_jobs_reactor_due_idx
    ON analysis_jobs (updated_at, id)
    WHERE status IN ('complete', 'failed')
      AND deleted_at IS NULL
      AND doc_html IS NOT NULL
      AND results IS NOT NULL
      AND results <> '{}'::jsonb;
