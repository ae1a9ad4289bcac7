-- The statements of `reactor demo`'s app (reactor/demo_app.py), by name: what the app itself
-- would send, in the names of the mapping in force. The worker's own insert and update depend
-- on the job table's other columns, so demo_app composes them from the catalog instead.

-- name: tab_save
-- A browser tab saves the run of a job it saw finish: the same row the reactor would write,
-- with the client's saved_by, over whatever is there (the client's save always wins).
INSERT INTO @runs@ AS r (@run_columns@)
SELECT @j.run@, @j.id@, @client@, @run_values@
  FROM @jobs@ j
 WHERE @j.id@ = %(job)s::@job_type@
ON CONFLICT (@key@) DO UPDATE
   SET @run_updates@,
       @saved_by@ = @client@

-- name: unsettled
-- Jobs that still need a run, due or still inside their grace window.
SELECT count(*)
  FROM @jobs@ j
 WHERE @eligible(j)@
   AND NOT EXISTS (SELECT 1 FROM @runs@ r WHERE @r.key@ = @j.run@)
