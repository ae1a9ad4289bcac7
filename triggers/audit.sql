-- An audit of every write to the runs table: who wrote (saved_by), for which job, and when by the
-- database clock. Not part of the reactor's schema: `reactor demo`, the tests and the benchmarks
-- install it to count lost, duplicate, clobbering and early writes from the database itself.
-- Rendered through the mapping (reactor.testing.audit.ddl), like every other statement: the ids take
-- the types of the mapped columns, and each pair of a database has its own audit (@audit@:
-- run_audit for the pair in the reactor schema, <schema>_run_audit for another).
CREATE TABLE IF NOT EXISTS @audit@ (
    seq        bigserial PRIMARY KEY,
    op         text NOT NULL,
    run_id     @run_type@ NOT NULL,
    job_id     @job_type@ NOT NULL,
    saved_by   text,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The job's updated_at when the row was written: which finish of the job it holds.
    job_updated_at  timestamptz
);
ALTER TABLE @audit@ ADD COLUMN IF NOT EXISTS job_updated_at timestamptz;
-- Deletions are recorded too (TRUNCATE as one row with the least ids of their types, which no
-- write names): a run written again after the app deleted it is a new write, not a duplicate,
-- and lands on no client row.
CREATE INDEX IF NOT EXISTS @audit_index@ ON @audit@ (run_id, seq);
CREATE OR REPLACE FUNCTION @audit_write@() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        INSERT INTO @audit@ (op, run_id, job_id)
        VALUES (TG_OP, @least_run@, @least_job@);
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO @audit@ (op, run_id, job_id, saved_by)
        VALUES (TG_OP, @OLD.key@, @OLD.job@, @OLD.saved_by@);
    ELSE
        INSERT INTO @audit@ (op, run_id, job_id, saved_by, job_updated_at)
        VALUES (TG_OP, @NEW.key@, @NEW.job@, @NEW.saved_by@,
                (SELECT @j.updated_at@ FROM @jobs@ j WHERE @j.id@ = @NEW.job@));
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER run_audit AFTER INSERT OR UPDATE OR DELETE ON @runs@
    FOR EACH ROW EXECUTE FUNCTION @audit_write@();
CREATE OR REPLACE TRIGGER run_audit_truncate AFTER TRUNCATE ON @runs@
    FOR EACH STATEMENT EXECUTE FUNCTION @audit_write@();
-- Stretches of time a test or benchmark caused a fault in (the server down, the network cut): a
-- worker write whose wait overlaps one, due before it ended and written after it began, is
-- left out of the lateness figures, which then show what the reactor does outside the faults.
CREATE TABLE IF NOT EXISTS run_audit_excused (
    from_at    timestamptz NOT NULL,
    until_at   timestamptz NOT NULL
);
-- The audit sees every write, even one made with the triggers bypassed (a restore, replication).
ALTER TABLE @runs@ ENABLE ALWAYS TRIGGER run_audit;
ALTER TABLE @runs@ ENABLE ALWAYS TRIGGER run_audit_truncate;

-- name: verdict
-- DESIGN.md's invariants, counted from the database, plus the reactor's lateness outside the
-- excused stretches. Run it when
-- the app has been quiet for longer than the grace window, or `lost` counts jobs in flight.
-- A row saved by anything but the worker (a client, or NULL: a legacy row) is a client's.
-- A job may finish more than once (a retry): each worker write is judged by the finish it was
-- written from, the job's updated_at the audit recorded with it.
WITH worker AS (
    SELECT a.*,
           coalesce(a.job_updated_at, @j.updated_at@) + make_interval(secs => %(grace)s)
               AS due_at,
           -- What the run row was just before this write: the run's previous event.
           (SELECT p.op || ':' || CASE WHEN p.saved_by = @worker@ THEN 'worker' ELSE 'client' END
              FROM @audit@ p
             WHERE p.seq < a.seq
               AND p.run_id IN (a.run_id, @least_run@)
             ORDER BY p.seq DESC LIMIT 1) AS before
      FROM @audit@ a JOIN @jobs@ j ON @j.id@ = a.job_id
     WHERE a.saved_by = @worker@ AND a.op <> 'DELETE'
), late AS (
    SELECT extract(epoch FROM w.at - w.due_at)::float8 AS s
      FROM worker w
     WHERE NOT EXISTS (SELECT 1 FROM run_audit_excused e
                        WHERE w.due_at < e.until_at AND w.at > e.from_at)
)
SELECT
    (SELECT count(*) FROM @jobs@) AS jobs,
    (SELECT count(*) FROM @runs@ r WHERE @r.saved_by@ IS DISTINCT FROM @worker@)
        AS saved_by_client,
    (SELECT count(*) FROM @runs@ r WHERE @r.saved_by@ = @worker@) AS saved_by_worker,
    (SELECT count(*) FROM @jobs@ j
      WHERE {{needs_run}} AND @j.updated_at@ < now() - make_interval(secs => %(grace)s)) AS lost,
    -- A second worker write of the same (run, job, finish) while its row stood: no deletion
    -- between.
    (SELECT count(*) FROM worker w
      WHERE EXISTS (SELECT 1 FROM worker e
                     WHERE e.run_id = w.run_id AND e.job_id = w.job_id AND e.seq < w.seq
                       AND e.job_updated_at IS NOT DISTINCT FROM w.job_updated_at
                       AND NOT EXISTS (SELECT 1 FROM @audit@ g
                                        WHERE g.seq > e.seq AND g.seq < w.seq
                                          AND g.op IN ('DELETE', 'TRUNCATE')
                                          AND g.run_id IN (w.run_id, @least_run@))))
        AS dup,
    (SELECT count(*) FROM worker w
      WHERE w.before IN ('INSERT:client', 'UPDATE:client')) AS clobbered,
    (SELECT count(*) FROM worker WHERE at < due_at) AS early,
    -- A worker write for a job that does not need a run: not terminal, deleted, or without
    -- its documents.
    (SELECT count(*) FROM worker w JOIN @jobs@ j ON @j.id@ = w.job_id
      WHERE NOT {{eligible}}) AS wrong,
    (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s) FROM late)::float8 AS lateness_p50,
    (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY s) FROM late)::float8 AS lateness_p99,
    (SELECT max(s) FROM late) AS lateness_max,
    (SELECT max(extract(epoch FROM w.at - w.due_at))::float8 FROM worker w)
        AS lateness_max_overall,
    -- The jobs that need no run, and got none unless a client saved one: not finished, deleted,
    -- or finished with nothing to show. With the other two counts they account for every job.
    (SELECT count(*) FROM @jobs@ j WHERE {{eligible}} IS NOT TRUE) AS needed_no_run,
    -- A worker row that does not hold its run's last word once that word's grace has passed:
    -- written for an earlier job of the run than its newest eligible one (a re-analysis), or
    -- from an earlier finish of that job (a retry: its last write was made from another
    -- updated_at than the job has now).
    (SELECT count(*)
       FROM (SELECT DISTINCT ON (@j.run@) @j.run@ AS run, @j.id@ AS id,
                    @j.updated_at@ AS updated_at
               FROM @jobs@ j
              WHERE {{eligible}}
              ORDER BY @j.run@, @created(j)@ DESC, @j.id@ DESC) AS n
       JOIN @runs@ r ON @r.key@ = n.run
      WHERE @r.saved_by@ = @worker@
        AND n.updated_at < now() - make_interval(secs => %(grace)s)
        AND (@r.job@ <> n.id
             OR (SELECT a.job_updated_at FROM @audit@ a
                  WHERE a.run_id = n.run AND a.op IN ('INSERT', 'UPDATE')
                  ORDER BY a.seq DESC LIMIT 1) <> n.updated_at)) AS stale
