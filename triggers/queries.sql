-- Every statement the reactor sends, by name. A block starts at `-- name: NAME`; a `{{name}}`
-- inside a block is replaced by the fragment of that name (`-- fragment: NAME`), so the due
-- predicate is written once. Parameters use psycopg's %(name)s style.
--
-- All times come from the database clock: `now()` is this statement's transaction start and
-- `updated_at` is the app's. The reactor never compares them with its own wall clock.

-- fragment: outranked
-- True when the run row r may be replaced by job j: only a worker row written for an earlier
-- job of the same run (older created_at, ties broken by id). NULL saved_by is a client row.
-- reactor.outranks_v1 (migration 0007) reads the newest committed jobs, not this statement's
-- snapshot, which is what the write's conflict check needs.
reactor.outranks_v1(j.id, r.job_id, r.saved_by)

-- fragment: needs_run
-- DESIGN.md's "needs a run" for job j. The row-local half matches analysis_jobs_reactor_due_idx.
(j.status IN ('complete', 'failed')
 AND j.deleted_at IS NULL
 AND j.doc_html IS NOT NULL
 AND j.results IS NOT NULL
 AND j.results <> '{}'::jsonb
 AND NOT EXISTS (SELECT 1 FROM analysis_runs r
                  WHERE r.id = j.run_id AND NOT {{outranked}}))

-- fragment: write_runs
-- Writes one run per claimed run id, from the newest claimed job of that run, in run id order
-- (so concurrent writers take the run rows' locks in one order). The conflict clause re-checks
-- precedence against the committed row: it is what makes the write single when the claim's
-- snapshot is older than another writer's commit. The same statement queues the configured
-- hooks (%(hooks)s) of every run it wrote, so no run is recorded without them.
newest AS (
    SELECT DISTINCT ON (c.run_id) c.id, c.run_id, c.doc_html, c.results
      FROM claimed c
     ORDER BY c.run_id, c.created_at DESC, c.id DESC
), written AS (
    INSERT INTO analysis_runs AS r (id, job_id, doc_html, results, saved_by)
    SELECT n.run_id, n.id, n.doc_html, n.results, 'worker'
      FROM newest n
     ORDER BY n.run_id
    ON CONFLICT (id) DO UPDATE
       SET job_id = EXCLUDED.job_id,
           doc_html = EXCLUDED.doc_html,
           results = EXCLUDED.results,
           saved_by = 'worker',
           updated_at = now()
     WHERE reactor.outranks_v1(EXCLUDED.job_id, r.job_id, r.saved_by)
    RETURNING r.id AS run_id, r.job_id
), hooked AS (
    INSERT INTO reactor.hook_outbox (run_id, job_id, hook)
    SELECT w.run_id, w.job_id, h.hook
      FROM written w CROSS JOIN unnest(%(hooks)s::text[]) AS h(hook)
    ON CONFLICT DO NOTHING
)

-- name: record_jobs
-- The timer path: claim the given jobs if they are due, write their runs, and say what became
-- of every given job that still needs a run. One statement is one transaction that commits on
-- the server, so a reactor cut off mid-call never leaves job rows locked.
-- outcome: recorded | superseded (claimed, but a newer job or another writer owns the run)
--          | waiting (inside its grace window) | busy (another transaction holds the row)
-- The claimed jobs leave the pending queue; a queue row another transaction holds is left for
-- the scan to settle rather than waited for.
WITH wanted AS (
    SELECT j.id, j.run_id, j.updated_at
      FROM analysis_jobs j
     WHERE j.id = ANY(%(ids)s::uuid[]) AND {{needs_run}}
), claimed AS (
    SELECT j.id, j.run_id, j.created_at, j.updated_at, j.doc_html, j.results
      FROM analysis_jobs j
     WHERE j.id IN (SELECT id FROM wanted)
       AND {{needs_run}}
       AND j.updated_at < now() - make_interval(secs => %(grace)s)
       FOR NO KEY UPDATE OF j SKIP LOCKED
), {{write_runs}}, dequeued AS (
    DELETE FROM reactor.pending p
     WHERE p.job_id IN (SELECT q.job_id FROM reactor.pending q
                         WHERE q.job_id IN (SELECT id FROM claimed)
                           FOR UPDATE SKIP LOCKED)
)
SELECT w.id::text AS job_id,
       w.run_id::text AS run_id,
       CASE WHEN w.id IN (SELECT job_id FROM written) THEN 'recorded'
            WHEN w.id IN (SELECT id FROM claimed) THEN 'superseded'
            WHEN w.updated_at >= now() - make_interval(secs => %(grace)s) THEN 'waiting'
            ELSE 'busy'
       END AS outcome,
       extract(epoch FROM w.updated_at + make_interval(secs => %(grace)s) - clock_timestamp())
           ::float8 AS due_in
  FROM wanted w

-- name: record_oldest
-- The fallback scan: take up to %(limit)s queued jobs whose grace has passed (by the job's
-- updated_at, which the app may have moved since the job was queued), oldest first,
-- claim those that still need a run, write their runs, and settle the queue: a job leaves it
-- when it was claimed or when it needs no run (a tab saved it, it was deleted). Queue rows are
-- locked with SKIP LOCKED, so replicas scan disjoint rows. A queue row is dropped only if it is
-- the version this statement's snapshot judged (same xmin): a job that became eligible again
-- after the snapshot was re-queued by a newer transaction, and stays. Jobs touched since they
-- became eligible wait for their new deadline without holding up the batch.
-- %(only)s (NULL: any) and %(skip)s narrow the queue rows taken: the recorder uses them to split
-- a batch that waited too long on a lock, and to leave out a job it isolated behind one.
-- Documents are written oldest first up to %(max_bytes)s (the first always): the claimed jobs
-- past the cap stay queued for the next statement, so a batch of large documents cannot pass
-- the statement timeout together.
-- outcome: recorded | superseded | dropped (needed no run) | kept (another transaction holds
-- the job row) | deferred (past the byte cap). due_in is negative: how late each job was.
WITH queued AS (
    SELECT p.job_id, p.since
      FROM reactor.pending p LEFT JOIN analysis_jobs j ON j.id = p.job_id
     WHERE (j.id IS NULL OR j.updated_at < now() - make_interval(secs => %(grace)s))
       AND (%(only)s::uuid[] IS NULL OR p.job_id = ANY(%(only)s::uuid[]))
       AND p.job_id <> ALL(%(skip)s::uuid[])
     ORDER BY p.since
     LIMIT %(limit)s
       FOR UPDATE OF p SKIP LOCKED
), claimable AS (
    SELECT j.id, j.run_id, j.created_at, j.updated_at, j.doc_html, j.results, q.since,
           octet_length(j.doc_html) + pg_column_size(j.results) AS bytes
      FROM analysis_jobs j JOIN queued q ON q.job_id = j.id
     WHERE {{needs_run}}
       AND j.updated_at < now() - make_interval(secs => %(grace)s)
       FOR NO KEY UPDATE OF j SKIP LOCKED
), claimed AS (
    -- octet_length reads a TOASTed document's length from its header, not the document.
    SELECT k.id, k.run_id, k.created_at, k.updated_at, k.doc_html, k.results
      FROM (SELECT c.*, sum(c.bytes) OVER (ORDER BY c.since, c.id) - c.bytes AS before
              FROM claimable c) AS k
     WHERE k.before < %(max_bytes)s
), seen AS (
    SELECT p.job_id, p.xmin AS version FROM reactor.pending p
     WHERE p.job_id IN (SELECT job_id FROM queued)
), {{write_runs}}, settled AS (
    DELETE FROM reactor.pending p
     USING seen s
     WHERE p.job_id = s.job_id
       AND (p.job_id IN (SELECT id FROM claimed)
            OR (p.xmin = s.version
                AND NOT EXISTS (SELECT 1 FROM analysis_jobs j
                                 WHERE j.id = p.job_id AND {{needs_run}})))
    RETURNING p.job_id
)
SELECT q.job_id::text AS job_id,
       c.run_id::text AS run_id,
       CASE WHEN q.job_id IN (SELECT job_id FROM written) THEN 'recorded'
            WHEN q.job_id IN (SELECT id FROM claimed) THEN 'superseded'
            WHEN c.id IS NOT NULL THEN 'deferred'
            WHEN q.job_id IN (SELECT job_id FROM settled) THEN 'dropped'
            ELSE 'kept'
       END AS outcome,
       extract(epoch FROM c.updated_at + make_interval(secs => %(grace)s) - clock_timestamp())
           ::float8 AS due_in
  FROM queued q LEFT JOIN claimable c ON c.id = q.job_id

-- name: oldest_queued
-- The queue rows record_oldest would take next, oldest first, read without locking: when a
-- batch waited too long on a row lock, the recorder splits these ids and settles them in parts.
SELECT p.job_id::text
  FROM reactor.pending p LEFT JOIN analysis_jobs j ON j.id = p.job_id
 WHERE (j.id IS NULL OR j.updated_at < now() - make_interval(secs => %(grace)s))
   AND p.job_id <> ALL(%(skip)s::uuid[])
 ORDER BY p.since
 LIMIT %(limit)s

-- name: upcoming
-- Queued jobs that need a run and are still inside their grace window, with the seconds left:
-- the reactor arms a timer for each after every (re)connect, so missed notifications cost
-- nothing.
SELECT j.id::text AS job_id,
       extract(epoch FROM j.updated_at + make_interval(secs => %(grace)s) - clock_timestamp())
           ::float8 AS due_in
  FROM reactor.pending p JOIN analysis_jobs j ON j.id = p.job_id
 WHERE {{needs_run}}
   AND j.updated_at >= now() - make_interval(secs => %(grace)s)
 ORDER BY j.updated_at
 LIMIT %(limit)s

-- name: health
-- The watch loop's view, every probe interval: NOTIFY queue pressure, how long past its grace
-- the oldest queued job that needs a run has waited (0 when none is overdue), and the hook
-- outbox.
SELECT pg_notification_queue_usage()::float8 AS queue_usage,
       coalesce((SELECT extract(epoch FROM now() - make_interval(secs => %(grace)s)
                                       - j.updated_at)
                   FROM reactor.pending p JOIN analysis_jobs j ON j.id = p.job_id
                  WHERE {{needs_run}}
                    AND j.updated_at < now() - make_interval(secs => %(grace)s)
                  ORDER BY p.since
                  LIMIT 1), 0)::float8 AS oldest_overdue,
       (SELECT count(*) FROM reactor.hook_outbox
         WHERE status IN ('pending', 'running'))::int AS hook_backlog,
       (SELECT count(*) FROM reactor.hook_outbox WHERE status = 'failed')::int AS hook_failed

-- name: claim_hooks
-- Leases up to %(limit)s runnable hook rows, oldest first: pending ones past their backoff, and
-- running ones whose lease expired (their replica died). Only hooks this replica knows.
-- attempts counts claims; it doubles as the fencing token for finish_hook and release_hook.
WITH due AS (
    SELECT o.run_id, o.job_id, o.hook
      FROM reactor.hook_outbox o
     WHERE o.status IN ('pending', 'running')
       AND o.available_at <= now()
       AND o.hook = ANY(%(hooks)s::text[])
     ORDER BY o.available_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE reactor.hook_outbox o
   SET status = 'running',
       attempts = o.attempts + 1,
       available_at = now() + make_interval(secs => %(lease)s),
       leased_until = now() + make_interval(secs => %(lease)s),
       updated_at = now()
  FROM due
 WHERE (o.run_id, o.job_id, o.hook) = (due.run_id, due.job_id, due.hook)
RETURNING o.run_id::text, o.job_id::text, o.hook, o.attempts

-- name: next_hook_in
-- Seconds until the next hook row of ours becomes claimable (NULL when there is none).
SELECT extract(epoch FROM min(available_at) - now())::float8
  FROM reactor.hook_outbox
 WHERE status IN ('pending', 'running') AND hook = ANY(%(hooks)s::text[])

-- name: finish_hook
-- Settles one attempt: done, retry after %(delay)s seconds, or parked as failed. Only the
-- holder of the current attempt may settle it, except that success is always recorded.
UPDATE reactor.hook_outbox
   SET status = %(status)s,
       last_error = %(error)s,
       available_at = now() + make_interval(secs => %(delay)s),
       leased_until = NULL,
       updated_at = now()
 WHERE (run_id, job_id, hook) = (%(run_id)s::uuid, %(job_id)s::uuid, %(hook)s)
   AND status = 'running'
   AND (attempts = %(attempt)s OR %(status)s = 'done')

-- name: release_hook
-- Hands an interrupted attempt back at once (a drain ran out), without counting it.
UPDATE reactor.hook_outbox
   SET status = 'pending',
       attempts = attempts - 1,
       available_at = now(),
       leased_until = NULL,
       updated_at = now()
 WHERE (run_id, job_id, hook) = (%(run_id)s::uuid, %(job_id)s::uuid, %(hook)s)
   AND status = 'running'
   AND attempts = %(attempt)s
