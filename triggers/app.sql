-- The app's own writes to its two tables, as the app itself sends them, for any mapping: what
-- `reactor demo`, the tests and the benchmarks play (reactor/testing/app.py). The reactor never sends
-- these. Besides the mapping's slots (@jobs@, @j.id@, ...) they have the app's own, which
-- reactor.testing.app.App fills:
--   @now@              the app's clock as its time columns hold it (naive columns: in time_zone)
--   @new_columns@      what a new job is given: its id (unless the database assigns it), run key,
--   @new_values@       status, documents, verdicts, times and the job table's own NOT NULL
--                      columns; and their values, from the unnest of %(jobs)s and %(runs)s
--   @verdicts@         each not_empty column (the verdicts a job gathers) = %(verdicts)s, each
--                      after a comma of its own: a mapping without not_empty has none
--   @documents@        each document column a job starts with = %(document)s
--   @running@          a status that is not terminal
--   @doc@, @results@   the first document and the first verdicts column (for tests' queries)
-- Parameters use psycopg's %(name)s style.

-- name: create
-- New jobs in %(status)s, one per run key, created and last updated the given seconds ago.
INSERT INTO @jobs@ (@new_columns@)
SELECT @new_values@
  FROM unnest(%(jobs)s::@job_type@[], %(runs)s::@run_type@[]) WITH ORDINALITY AS n(job, run, i)
 ORDER BY n.i
RETURNING @id@, @run@

-- name: progress
-- A running job's verdicts so far: the app's progress updates, which leave its status alone.
UPDATE @jobs@ SET @updated_at@ = @now@@verdicts@ WHERE @id@ = ANY(%(jobs)s::@job_type@[])

-- name: finish
-- The worker marks jobs terminal with their verdicts, the given seconds ago.
UPDATE @jobs@
   SET @status@ = %(status)s@verdicts@,
       @updated_at@ = @now@ - make_interval(secs => %(age)s)
 WHERE @id@ = ANY(%(jobs)s::@job_type@[])

-- name: reopen
-- Jobs go back to running (a retry), the given seconds ago.
UPDATE @jobs@ SET @status@ = @running@, @updated_at@ = @now@ - make_interval(secs => %(age)s)
 WHERE @id@ = ANY(%(jobs)s::@job_type@[])

-- name: touch
-- The app touches jobs without changing them otherwise: their updated_at moves.
UPDATE @jobs@ SET @updated_at@ = @now@ - make_interval(secs => %(age)s)
 WHERE @id@ = ANY(%(jobs)s::@job_type@[])

-- name: redocument
-- The app rewrites the documents jobs started with (to NULL: a trim).
UPDATE @jobs@ SET @documents@ WHERE @id@ = ANY(%(jobs)s::@job_type@[])

-- name: soft_delete
UPDATE @jobs@ SET @deleted_at@ = @now@ WHERE @id@ = ANY(%(jobs)s::@job_type@[])

-- name: delete
DELETE FROM @jobs@ WHERE @id@ = ANY(%(jobs)s::@job_type@[])

-- name: tab_save
-- A browser tab saves the runs of jobs it saw finish: the same row the reactor would write,
-- with the client's saved_by (%(by)s; NULL is a legacy row, which counts as the client's),
-- over whatever is there: the client's save always wins.
INSERT INTO @runs@ AS r (@run_columns@)
SELECT @keys(k)@, %(by)s@run_values@
  FROM @jobs@ j CROSS JOIN LATERAL (SELECT @j.run@ AS run_id, @j.id@ AS id) k
 WHERE @j.id@ = ANY(%(jobs)s::@job_type@[])
ON CONFLICT (@key@) DO UPDATE
   SET @run_updates@,
       @saved_by@ = EXCLUDED.@saved_by@

-- name: run_of
SELECT @run@ FROM @jobs@ WHERE @id@ = %(job)s::@job_type@

-- name: run_row
-- The job a run row was written from, and by whom.
SELECT @job@, @saved_by@ FROM @runs@ WHERE @key@ = %(run)s::@run_type@

-- name: unsettled
-- Jobs that still need a run, due or still inside their grace window: their run has no row, or
-- only a worker's row written for an earlier job of the run (a re-analysis), which theirs
-- replaces, or for an earlier finish of the job itself (a retry: the reactor recorded another
-- updated_at of the job's), which its last finish replaces (the precedence rule of queries.sql,
-- read in this statement's snapshot).
SELECT count(*)
  FROM @jobs@ j
 WHERE @eligible(j)@
   AND NOT EXISTS (SELECT 1 FROM @runs@ r
                    WHERE @r.key@ = @j.run@
                      AND NOT (@r.saved_by@ IS NOT DISTINCT FROM @worker@
                               AND CASE WHEN @r.job@ = @j.id@
                                        THEN EXISTS (SELECT 1 FROM @reactor@.recorded w
                                                      WHERE w.run_id = @r.key@
                                                        AND w.job_id = @j.id@
                                                        AND w.job_updated_at
                                                            <> @j.updated_at@)
                                        ELSE NOT EXISTS (SELECT 1 FROM @jobs@ rj
                                                          WHERE @rj.id@ = @r.job@
                                                            AND @rank(rj)@ >= @rank(j)@)
                                   END))
