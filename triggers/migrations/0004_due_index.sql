-- Once built a partial index on analysis_jobs (updated_at, id) for the scan; migration 0006
-- replaced the scan's road with the pending queue and drops that index where it exists. A new
-- install skips the build: on a big live table it blocked the app's writes only to be dropped.
SELECT 'analysis_jobs_reactor_due_idx is no longer built' AS migration_0004;
