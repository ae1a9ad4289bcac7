-- An audit of every write to analysis_runs: who wrote (saved_by), for which job, and when by the
-- database clock. Not part of the reactor's schema: `reactor demo`, the tests and the benchmarks
-- install it to count lost, duplicate, clobbering and early writes from the database itself.
CREATE TABLE IF NOT EXISTS run_audit (
    seq        bigserial PRIMARY KEY,
    op         text NOT NULL,
    run_id     uuid NOT NULL,
    job_id     uuid NOT NULL,
    saved_by   text,
    at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE OR REPLACE FUNCTION run_audit_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_audit (op, run_id, job_id, saved_by)
    VALUES (TG_OP, NEW.id, NEW.job_id, NEW.saved_by);
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER run_audit AFTER INSERT OR UPDATE ON analysis_runs
    FOR EACH ROW EXECUTE FUNCTION run_audit_write();

-- name: verdict
-- DESIGN.md's invariants, counted from the database, plus the reactor's lateness. Run it when
-- the app has been quiet for longer than the grace window, or `lost` counts jobs in flight.
WITH worker AS (
    SELECT a.*, j.updated_at + make_interval(secs => %(grace)s) AS due_at
      FROM run_audit a JOIN analysis_jobs j ON j.id = a.job_id
     WHERE a.saved_by = 'worker'
), late AS (
    SELECT extract(epoch FROM at - due_at)::float8 AS s FROM worker
)
SELECT
    (SELECT count(*) FROM analysis_jobs) AS jobs,
    (SELECT count(*) FROM analysis_runs WHERE coalesce(saved_by, 'client') = 'client')
        AS saved_by_client,
    (SELECT count(*) FROM analysis_runs WHERE saved_by = 'worker') AS saved_by_worker,
    (SELECT count(*) FROM analysis_jobs j
      WHERE {{needs_run}} AND j.updated_at < now() - make_interval(secs => %(grace)s)) AS lost,
    (SELECT count(*) FROM (SELECT 1 FROM worker GROUP BY run_id, job_id HAVING count(*) > 1) d)
        AS dup,
    (SELECT count(*) FROM worker w
      WHERE EXISTS (SELECT 1 FROM run_audit p
                     WHERE p.run_id = w.run_id AND p.seq < w.seq
                       AND coalesce(p.saved_by, 'client') = 'client')) AS clobbered,
    (SELECT count(*) FROM worker WHERE at < due_at) AS early,
    (SELECT count(*) FROM worker w JOIN analysis_jobs j ON j.id = w.job_id
      WHERE j.status NOT IN ('complete', 'failed') OR j.deleted_at IS NOT NULL
         OR j.doc_html IS NULL OR j.results IS NULL OR j.results = '{}'::jsonb) AS wrong,
    (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s) FROM late)::float8 AS lateness_p50,
    (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY s) FROM late)::float8 AS lateness_p99,
    (SELECT max(s) FROM late) AS lateness_max
