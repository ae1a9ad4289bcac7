-- Every statement the reactor sends, by name. A block starts at `-- name: NAME`; a `{{name}}`
-- inside a block is replaced by the fragment of that name (`-- fragment: NAME`), so the due
-- predicate is written once. Parameters use psycopg's %(name)s style.
--
-- All times come from the database clock: `now()` is this statement's transaction start and
-- `updated_at` is the app's. The reactor never compares them with its own wall clock.

-- fragment: outranked
-- True when the run row r may be replaced by job j: only a worker row written for an earlier
-- job of the same run (older created_at, ties broken by id), or for an earlier finish of j
-- itself (@reactor@.recorded holds another updated_at of j's). NULL saved_by is a client row.
-- @reactor@.outranks_v2 (notify_triggers.sql) reads the newest committed rows, not this
-- statement's snapshot, which is what the write's conflict check needs. The saved_by test in
-- front spares the function call for client rows, most of them.
(@r.saved_by@ = @worker@ AND @reactor@.outranks_v2(@j.id@, @r.job@, @r.saved_by@))

-- fragment: walked
-- The part of "needs a run" that the reconcile's walk index holds: the soft delete and the
-- documents, which the app sets when it creates a job. The status and the not_empty columns
-- (results) are left out of the index, so that the app's updates of a job, its progress and
-- its finish, stay HOT; the statements that need them read them from the job row.
@walked(j)@

-- fragment: eligible
-- The row-local half of "needs a run", what the job row alone decides; the triggers use exactly
-- this predicate. It implies the walk index's, so a statement that filters on it can use that
-- index and check the status and results in the row.
@eligible(j)@

-- fragment: set_aside
-- True while job j is set aside (@reactor@.set_aside): its write failed on its own data, its next
-- try is not due, and the app has not touched the job since (a new updated_at is new data).
EXISTS (SELECT 1 FROM @reactor@.set_aside s
         WHERE s.job_id = @j.id@ AND s.retry_at > now()
           AND s.job_updated_at IS NOT DISTINCT FROM @j.updated_at@)

-- fragment: needs_run
-- DESIGN.md's "needs a run" for job j, as the claims and the writes judge it.
({{eligible}}
 AND NOT EXISTS (SELECT 1 FROM @runs@ r
                  WHERE @r.key@ = @j.run@ AND NOT {{outranked}}))

-- fragment: replica_live
-- True while replica r counts as live: its heartbeat is within %(liveness)s seconds and, when it
-- named its LISTEN session, that session is still there (pid and application_name are columns
-- of pg_stat_activity every role can read). A killed replica leaves the live set at the next
-- check, a frozen one once its heartbeat ages out.
(r.heartbeat_at > now() - make_interval(secs => %(liveness)s)
 AND (r.session_pid IS NULL
      OR EXISTS (SELECT 1 FROM pg_stat_activity a
                  WHERE a.pid = r.session_pid
                    AND a.application_name = 'reactor-listener')))

-- fragment: job_trigger
-- The job trigger as installed: the channel it notifies (its argument; '' when it was installed
-- not to notify), whether it spreads the jobs over a channel per share (its second argument)
-- and whether it fires for the app's sessions. No row when it is missing.
SELECT split_part(encode(t.tgargs, 'escape'), '\000', 1) AS channel,
       split_part(encode(t.tgargs, 'escape'), '\000', 2) = 'spread' AS spread,
       t.tgenabled IN ('O', 'A') AS enabled
  FROM pg_trigger t
 WHERE t.tgrelid = to_regclass(@jobs_name@) AND t.tgname = '@reactor@_job_update'

-- fragment: write_runs
-- Writes one run per claimed run id, from the newest claimed job of that run, in run id order
-- (so concurrent writers take the run rows' locks in one order). The conflict clause re-checks
-- precedence against the committed row: it is what makes the write single when the claim's
-- snapshot is older than another writer's commit. The same statement queues the configured
-- hooks (%(hooks)s) of every run it wrote, so no run is recorded without them.
newest AS (
    SELECT DISTINCT ON (c.run_id) c.id, c.run_id
      FROM claimed c
     ORDER BY c.run_id, c.created_at DESC, c.id DESC
), written AS (
    -- The run's other columns are the mapping's expressions over the job row j, read again
    -- here (it is locked by the claim) rather than carried through the claim's rows.
    INSERT INTO @runs@ AS r (@run_columns@)
    SELECT @keys(n)@, @worker@@run_values@
      FROM newest n JOIN @jobs@ j ON @j.id@ = n.id
     ORDER BY n.run_id
    ON CONFLICT (@key@) DO UPDATE
       SET @run_updates@,
           @saved_by@ = @worker@
     WHERE @reactor@.outranks_v2(EXCLUDED.@job@, @r.job@, @r.saved_by@)
    RETURNING @r.key@ AS run_id, @r.job@ AS job_id
), finishes AS (
    -- Each written run with the job's updated_at it was written from: the job is locked by the
    -- claim, so this is the finish the row holds.
    SELECT w.run_id, w.job_id, c.updated_at
      FROM written w JOIN claimed c ON c.id = w.job_id
), noted AS (
    -- What the row was written from, one row per run key, for rule (c) of "needs a run".
    INSERT INTO @reactor@.recorded AS k (run_id, job_id, job_updated_at)
    SELECT f.run_id, f.job_id, f.updated_at FROM finishes f
    ON CONFLICT (run_id) DO UPDATE
       SET job_id = EXCLUDED.job_id, job_updated_at = EXCLUDED.job_updated_at
), hooked AS (
    -- One hook row per (run, job, hook), queued again for each later finish of the job: a
    -- row still waiting for an earlier finish runs once, for the run as it is now. The row
    -- of the same finish written again (its run was deleted) is left as it is.
    INSERT INTO @reactor@.hook_outbox AS o (run_id, job_id, hook, job_updated_at)
    SELECT f.run_id, f.job_id, h.hook, f.updated_at
      FROM finishes f CROSS JOIN unnest(%(hooks)s::text[]) AS h(hook)
    ON CONFLICT (run_id, job_id, hook) DO UPDATE
       SET finish = o.finish + 1,
           job_updated_at = EXCLUDED.job_updated_at,
           status = 'pending',
           retry_base = o.attempts,
           last_error = NULL,
           available_at = now(),
           leased_until = NULL,
           leased_by = NULL,
           updated_at = now()
     WHERE o.job_updated_at IS DISTINCT FROM EXCLUDED.job_updated_at
)

-- fragment: release_set_aside
-- A job that left the queue (the statement's `settled`) is no longer set aside.
released AS (
    DELETE FROM @reactor@.set_aside s WHERE s.job_id IN (SELECT job_id FROM settled)
)

-- name: job_trigger
{{job_trigger}}

-- name: record_jobs
-- The timer path: claim the given jobs if they are due, write their runs, and say what became
-- of every given job that still needs a run. One statement is one transaction that commits on
-- the server, so a reactor cut off mid-call never leaves job rows locked.
-- outcome: recorded | superseded (claimed, but a newer job or another writer owns the run)
--          | set_aside (its write failed before; the scan tries it again when it is due)
--          | waiting (inside its grace window) | busy (another transaction holds the row)
-- Every given job leaves the pending queue that was claimed or needs no run (a tab saved it, it
-- was deleted): a timer fires once per job, so the queue holds only what timers have yet to
-- settle, never the tabs' saves. As in record_oldest, a queue row is dropped for needing no run
-- only if it is the version this statement's snapshot judged; a queue row another transaction
-- holds is left for the scan rather than waited for.
WITH wanted AS (
    SELECT @j.id@ AS id, @j.run@ AS run_id, @j.updated_at@ AS updated_at, {{set_aside}} AS held
      FROM @jobs@ j
     WHERE @j.id@ = ANY(%(ids)s::@job_type@[]) AND {{needs_run}}
), seen AS (
    SELECT p.job_id, p.xmin AS version FROM @reactor@.pending p
     WHERE p.job_id = ANY(%(ids)s::@job_type@[])
), claimed AS (
    -- By the given ids, not a semi-join with wanted: with statistics that still see few
    -- finished jobs (a fresh database, a bulk finish) the planner turned that join into a walk
    -- of the whole walk index for every claim.
    SELECT @j.id@ AS id, @j.run@ AS run_id, @created(j)@ AS created_at,
           @j.updated_at@ AS updated_at
      FROM @jobs@ j
     WHERE @j.id@ = ANY(%(ids)s::@job_type@[])
       AND {{needs_run}}
       AND @j.updated_at@ < now() - make_interval(secs => %(grace)s)
       AND NOT {{set_aside}}
       FOR NO KEY UPDATE OF j SKIP LOCKED
), {{write_runs}}, settled AS (
    DELETE FROM @reactor@.pending p
     USING seen s
     WHERE p.job_id = s.job_id
       AND p.job_id IN (SELECT q.job_id FROM @reactor@.pending q
                         WHERE q.job_id IN (SELECT job_id FROM seen)
                           FOR UPDATE SKIP LOCKED)
       AND (p.job_id IN (SELECT id FROM claimed)
            OR (p.xmin = s.version AND p.job_id NOT IN (SELECT id FROM wanted)))
    RETURNING p.job_id
), {{release_set_aside}}
SELECT w.id::text AS job_id,
       w.run_id::text AS run_id,
       CASE WHEN w.id IN (SELECT job_id FROM written) THEN 'recorded'
            WHEN w.id IN (SELECT id FROM claimed) THEN 'superseded'
            WHEN w.held THEN 'set_aside'
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
      FROM @reactor@.pending p LEFT JOIN @jobs@ j ON @j.id@ = p.job_id
     WHERE (@j.id@ IS NULL OR @j.updated_at@ < now() - make_interval(secs => %(grace)s))
       AND (%(only)s::@job_type@[] IS NULL OR p.job_id = ANY(%(only)s::@job_type@[]))
       AND p.job_id <> ALL(%(skip)s::@job_type@[])
       AND NOT {{set_aside}}
     ORDER BY p.since
     LIMIT %(limit)s
       FOR UPDATE OF p SKIP LOCKED
), claimable AS (
    SELECT @j.id@ AS id, @j.run@ AS run_id, @created(j)@ AS created_at,
           @j.updated_at@ AS updated_at, q.since, @bytes(j)@ AS bytes
      FROM @jobs@ j JOIN queued q ON q.job_id = @j.id@
     WHERE {{needs_run}}
       AND @j.updated_at@ < now() - make_interval(secs => %(grace)s)
       FOR NO KEY UPDATE OF j SKIP LOCKED
), claimed AS (
    -- pg_column_size reads a TOASTed document's size from its header, not the document.
    SELECT k.id, k.run_id, k.created_at, k.updated_at
      FROM (SELECT c.*, sum(c.bytes) OVER (ORDER BY c.since, c.id) - c.bytes AS before
              FROM claimable c) AS k
     WHERE k.before < %(max_bytes)s
), seen AS (
    -- By the queue's primary key, one probe per taken row: a semi-join with queued was
    -- planned as a hash of the whole queue, a read of every queued row per statement.
    SELECT p.job_id, p.xmin AS version FROM @reactor@.pending p
     WHERE p.job_id = ANY(ARRAY(SELECT job_id FROM queued))
), {{write_runs}}, settled AS (
    DELETE FROM @reactor@.pending p
     USING seen s
     WHERE p.job_id = s.job_id
       AND (p.job_id IN (SELECT id FROM claimed)
            OR (p.xmin = s.version
                AND NOT EXISTS (SELECT 1 FROM @jobs@ j
                                 WHERE @j.id@ = p.job_id AND {{needs_run}})))
    RETURNING p.job_id
), {{release_set_aside}}
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
SELECT p.job_id::text AS job_id
  FROM @reactor@.pending p LEFT JOIN @jobs@ j ON @j.id@ = p.job_id
 WHERE (@j.id@ IS NULL OR @j.updated_at@ < now() - make_interval(secs => %(grace)s))
   AND p.job_id <> ALL(%(skip)s::@job_type@[])
   AND NOT {{set_aside}}
 ORDER BY p.since
 LIMIT %(limit)s

-- name: set_aside
-- Sets a job aside whose write failed on its own data, alone in its statement: the record
-- statements leave it out until retry_at, or until the app touches it (a new updated_at). Each
-- failure for the same data doubles the wait, from %(first_retry)s up to %(max_retry)s seconds.
INSERT INTO @reactor@.set_aside AS s (job_id, job_updated_at, error, sqlstate, retry_at)
SELECT %(job)s::@job_type@, @j.updated_at@, %(error)s, %(sqlstate)s,
       now() + make_interval(secs => %(first_retry)s)
  FROM (SELECT 1) AS one LEFT JOIN @jobs@ j ON @j.id@ = %(job)s::@job_type@
    ON CONFLICT (job_id) DO UPDATE
   SET failures = CASE WHEN s.job_updated_at IS NOT DISTINCT FROM EXCLUDED.job_updated_at
                       THEN s.failures + 1 ELSE 1 END,
       job_updated_at = EXCLUDED.job_updated_at,
       error = EXCLUDED.error,
       sqlstate = EXCLUDED.sqlstate,
       last_failed_at = now(),
       retry_at = now() + make_interval(secs => least(
           %(max_retry)s,
           %(first_retry)s * 2 ^ CASE WHEN s.job_updated_at IS NOT DISTINCT FROM
                                           EXCLUDED.job_updated_at
                                      THEN least(s.failures, 30) ELSE 0 END))
RETURNING s.failures, extract(epoch FROM s.retry_at - now())::float8 AS retry_in

-- name: release_set_aside
-- Tries every job set aside again at once (`reactor sweep --once`); how many there were.
WITH released AS (DELETE FROM @reactor@.set_aside RETURNING 1)
SELECT count(*)::int AS released FROM released

-- name: upcoming
-- Queued jobs that need a run and are still inside their grace window, with the seconds left:
-- the reactor arms a timer for each after every (re)connect, so missed notifications cost
-- nothing.
SELECT @j.id@::text AS job_id,
       extract(epoch FROM @j.updated_at@ + make_interval(secs => %(grace)s) - clock_timestamp())
           ::float8 AS due_in
  FROM @reactor@.pending p JOIN @jobs@ j ON @j.id@ = p.job_id
 WHERE {{needs_run}}
   AND @j.updated_at@ >= now() - make_interval(secs => %(grace)s)
 ORDER BY @j.updated_at@
 LIMIT %(limit)s

-- name: verify_hints
-- What the channel said, checked against the tables before anything is armed by it (any role
-- that can connect can NOTIFY): of the notified job ids %(jobs)s, those queued, with the seconds
-- until each is due by the job's own updated_at (a hint's time is never trusted); of the
-- replicas %(replicas)s said to have joined or left, those live by their heartbeats. By the
-- queue's primary key, one probe per id.
SELECT 'job' AS kind, p.job_id::text AS id,
       extract(epoch FROM @j.updated_at@ + make_interval(secs => %(grace)s) - clock_timestamp())
           ::float8 AS due_in
  FROM @reactor@.pending p JOIN @jobs@ j ON @j.id@ = p.job_id
 WHERE p.job_id = ANY(%(jobs)s::@job_type@[])
UNION ALL
SELECT 'replica', r.id, NULL
  FROM @reactor@.replicas r
 WHERE r.id = ANY(%(replicas)s::text[]) AND {{replica_live}}

-- name: poll_queue
-- The timers' road when no notification can be relied on (REACTOR_MODE=poll, a trigger that does
-- not notify, a LISTEN that is down): the queued jobs whose deadline, since + grace by the
-- database clock, comes within %(ahead)s seconds, from the queue's since index alone. It looks
-- at deadlines, not arrivals: a job is returned as its deadline nears, whenever it was queued.
-- %(low)s is where the last call's window ended, less an overlap the caller chooses; NULL starts
-- %(ahead)s seconds back. One row always comes back, carrying `high`, the window's end (job_id
-- is NULL when the window is empty). Only the jobs of the shares %(shares)s (NULL: all) come
-- back, those this replica owns, so that each replica of a fleet reads its own jobs and not
-- every replica's. A job touched after it was queued (updated_at later than since) is refused
-- as waiting by its claim and re-armed at its new deadline; one queued by a transaction that
-- committed after its deadline had passed is left to the scan.
-- The same statement keeps the doorbell (migration 0020): when %(ring)s, the row of %(channel)s
-- is awake %(lease)s seconds from now (written only once half of it has passed, so a fleet of
-- pollers writes it a few times a second at most); every row carries bell_in, the seconds the
-- bell is still awake (NULL: silent), and arrivals, the jobs queued within the last %(recent)s
-- seconds, by which the replica judges whether to ring it again. A ring that wakes a silent
-- bell tells every replica at once (%(rang)s, `rang:<channel>`, on %(replicas_channel)s): one
-- that hears no job any more starts polling now, not at its next health check, so that no job
-- queued without a notification comes due before it polls.
WITH was AS (
    SELECT awake_until FROM @reactor@.doorbell WHERE channel = %(channel)s
), bell AS (
    INSERT INTO @reactor@.doorbell AS b (channel, awake_until)
    SELECT %(channel)s, clock_timestamp() + make_interval(secs => %(lease)s)
     WHERE %(ring)s
    ON CONFLICT (channel) DO UPDATE SET awake_until = EXCLUDED.awake_until
     WHERE b.awake_until < clock_timestamp() + make_interval(secs => %(lease)s / 2)
    RETURNING b.awake_until
), told AS (
    SELECT pg_notify(%(replicas_channel)s, %(rang)s)
     WHERE EXISTS (SELECT 1 FROM bell)
       AND NOT EXISTS (SELECT 1 FROM was WHERE awake_until > clock_timestamp())
       AND pg_notification_queue_usage() < 0.5
)
SELECT p.job_id::text AS job_id,
       extract(epoch FROM p.since + make_interval(secs => %(grace)s) - clock_timestamp())
           ::float8 AS due_in,
       p.since,
       w.high,
       w.bell_in,
       w.arrivals,
       -- Selected, so that the planner keeps it: a column of w nobody reads is dropped, and
       -- with it the only read of told, whose pg_notify then never runs.
       w.told
  FROM (SELECT now() - make_interval(secs => %(grace)s - %(ahead)s) AS high,
               -- The statement's snapshot does not see its own upsert: the later of the two.
               extract(epoch FROM greatest((SELECT awake_until FROM bell),
                                           (SELECT awake_until FROM @reactor@.doorbell
                                             WHERE channel = %(channel)s))
                                  - clock_timestamp())::float8 AS bell_in,
               (SELECT count(*) FROM @reactor@.pending
                 WHERE since > now() - make_interval(secs => %(recent)s))::int AS arrivals,
               (SELECT count(*) FROM told)::int AS told) w
  LEFT JOIN @reactor@.pending p
    ON p.since >= coalesce(%(low)s::timestamptz, w.high - make_interval(secs => 2 * %(ahead)s))
   AND p.since <= w.high
   AND (%(shares)s::int[] IS NULL OR @queued_share(p)@ = ANY(%(shares)s::int[]))
 ORDER BY p.since
 LIMIT %(limit)s

-- name: reconcile_step
-- One step of the reconcile, the level-triggered half: walk the next %(limit)s jobs that can
-- still need a run, in (run_id, id) order on analysis_jobs_reactor_run_idx, and queue each
-- that needs a run and is not queued. The state row is shared by every replica and locked for the
-- step (SKIP LOCKED: a replica that finds it locked just waits its turn), so one pass runs at a
-- time. The replica that steps holds a lease on the pass until %(lease)s seconds from now; a
-- pass whose holder died is taken over when that runs out. A pass starts when none is running
-- and one is due (the last began about %(interval)s seconds before the next should end), was
-- asked for, or is forced (%(force)s, `reactor sweep --once`: a fresh pass, now).
-- outcome: stepped | completed (this step ended the pass) | idle (no pass due; next_in says
-- when one is) | busy (another replica holds the pass; next_in: when its lease runs out).
-- found: the jobs this step queued, with the seconds until each is due (negative: overdue).
-- pass_*: when this step completed the pass, the pass's totals, whoever walked its chunks.
-- The walk's lower bound starts at the nil uuid pair: a job whose id and run_id are both nil
-- would be skipped, which no generated id is.
WITH state AS (
    SELECT s.* FROM @reactor@.reconcile s FOR UPDATE SKIP LOCKED
), step AS (
    SELECT s.pass_started_at IS NULL OR %(force)s AS starting,
           CASE WHEN s.pass_started_at IS NULL OR %(force)s
                THEN @least_run@ ELSE s.cursor_run END AS from_run,
           CASE WHEN s.pass_started_at IS NULL OR %(force)s
                THEN @least_job@ ELSE s.cursor_job END AS from_job
      FROM state s
     WHERE %(force)s
        OR (s.pass_started_at IS NOT NULL
            AND (s.owner = %(owner)s OR s.owner_until IS NULL OR s.owner_until < now()))
        OR (s.pass_started_at IS NULL
            AND (s.requested_at IS NOT NULL OR s.last_finished_at IS NULL
                 OR s.last_finished_at + make_interval(secs => %(interval)s)
                    - (s.last_finished_at - s.last_started_at) <= now()))
), chunk AS (
    -- Index-only where the visibility map allows: the walk reads no job row it can skip. It
    -- walks the index's predicate alone; the status and results are checked below, in the few
    -- job rows that no run row stands for (running jobs among them).
    SELECT @j.id@ AS id, @j.run@ AS run_id
      FROM @jobs@ j
     WHERE {{walked}}
       AND (@j.run@, @j.id@) > ((SELECT from_run FROM step), (SELECT from_job FROM step))
     ORDER BY @j.run@, @j.id@
     LIMIT %(limit)s
), covering AS MATERIALIZED (
    -- The chunk's run rows in one scan of the run table's key, its run ids sorted as the walk
    -- gives them: a leaf page is read once for all the keys it holds, where a probe per job
    -- descended from the root each time.
    SELECT @r.key@ AS run_id, @r.job@ AS job_id,
           @r.saved_by@ IS DISTINCT FROM @worker@ AS client
      FROM @runs@ r
     WHERE @r.key@ = ANY(ARRAY(SELECT c.run_id FROM chunk c))
     ORDER BY @r.key@
), uncovered AS (
    -- Nearly every walked job has a client row that stands for it. Only the rest need the
    -- whole predicate and a job row: a worker row written for the job itself stands for it
    -- only while the job has the updated_at it was written from (rule c), which the job row
    -- holds, not the walk index.
    SELECT c.id FROM chunk c
     WHERE NOT EXISTS (SELECT 1 FROM covering r WHERE r.run_id = c.run_id AND r.client)
), found AS (
    -- needs_run with the precedence rule read in this statement's snapshot (the record
    -- statement re-checks it under lock), and the run rows read from covering, the chunk's
    -- own: a probe of the run table per job was planned as a hash of the whole table once
    -- more than a few jobs were uncovered. An uncovered job's run row, if any, is a worker's.
    -- Index probes, not a function call, per worker row: the reconcile walks millions.
    INSERT INTO @reactor@.pending (job_id, since)
    SELECT @j.id@, least(@j.updated_at@, now())
      FROM @jobs@ j
     WHERE @j.id@ IN (SELECT id FROM uncovered)
       AND {{eligible}}
       AND NOT EXISTS (SELECT 1 FROM covering r
                        WHERE r.run_id = @j.run@
                          AND NOT CASE WHEN r.job_id = @j.id@
                                       THEN EXISTS (SELECT 1 FROM @reactor@.recorded w
                                                     WHERE w.run_id = r.run_id
                                                       AND w.job_id = r.job_id
                                                       AND w.job_updated_at <> @j.updated_at@)
                                       ELSE NOT EXISTS (SELECT 1 FROM @jobs@ rj
                                                         WHERE @rj.id@ = r.job_id
                                                           AND @rank(rj)@ >= @rank(j)@)
                                  END)
       AND NOT EXISTS (SELECT 1 FROM @reactor@.pending p WHERE p.job_id = @j.id@)
    ON CONFLICT (job_id) DO NOTHING
    RETURNING job_id, since
), walked AS (
    SELECT count(*) AS examined,
           count(*) < %(limit)s AS done,
           (SELECT count(*) FROM found) AS found,
           (SELECT min(f.job_id::text)::@job_type@ FROM found f) AS example,
           -- The chunk's last job, where the next step starts: a top-1 read of the chunk,
           -- not a sort of it.
           (SELECT l.run_id FROM chunk l ORDER BY l.run_id DESC, l.id DESC LIMIT 1) AS last_run,
           (SELECT l.id FROM chunk l ORDER BY l.run_id DESC, l.id DESC LIMIT 1) AS last_job
      FROM chunk c
), advanced AS (
    UPDATE @reactor@.reconcile s
       SET pass = s.pass + step.starting::int,
           pass_started_at = CASE WHEN w.done THEN NULL
                                  WHEN step.starting THEN now() ELSE s.pass_started_at END,
           cursor_run = CASE WHEN w.done THEN NULL ELSE w.last_run END,
           cursor_job = CASE WHEN w.done THEN NULL ELSE w.last_job END,
           pass_examined = CASE WHEN step.starting THEN 0 ELSE s.pass_examined END + w.examined,
           pass_found = CASE WHEN step.starting THEN 0 ELSE s.pass_found END + w.found,
           pass_example = coalesce(CASE WHEN step.starting THEN NULL ELSE s.pass_example END,
                                   w.example),
           owner = CASE WHEN w.done THEN NULL ELSE %(owner)s END,
           owner_until = CASE WHEN w.done THEN NULL
                              ELSE now() + make_interval(secs => %(lease)s) END,
           requested_at = CASE WHEN step.starting THEN NULL ELSE s.requested_at END,
           last_started_at = CASE WHEN NOT w.done THEN s.last_started_at
                                  WHEN step.starting THEN now() ELSE s.pass_started_at END,
           last_finished_at = CASE WHEN w.done THEN clock_timestamp() ELSE s.last_finished_at END,
           last_examined = CASE WHEN NOT w.done THEN s.last_examined
                                WHEN step.starting THEN w.examined
                                ELSE s.pass_examined + w.examined END,
           last_found = CASE WHEN NOT w.done THEN s.last_found
                             WHEN step.starting THEN w.found
                             ELSE s.pass_found + w.found END,
           last_owner = CASE WHEN w.done THEN %(owner)s ELSE s.last_owner END,
           last_example = CASE WHEN NOT w.done THEN s.last_example
                               ELSE coalesce(CASE WHEN step.starting THEN NULL
                                                  ELSE s.pass_example END, w.example) END
      FROM step, walked w
    RETURNING s.pass, w.done, s.last_examined, s.last_found, s.last_example,
              extract(epoch FROM s.last_finished_at - s.last_started_at)::float8 AS seconds
)
SELECT CASE WHEN a.pass IS NOT NULL THEN CASE WHEN a.done THEN 'completed' ELSE 'stepped' END
            WHEN s.singleton IS NULL OR s.pass_started_at IS NOT NULL THEN 'busy'
            ELSE 'idle'
       END AS outcome,
       coalesce(a.pass, s.pass) AS pass_number,
       (SELECT examined FROM walked) AS examined,
       coalesce((SELECT array_agg(f.job_id::text ORDER BY f.job_id) FROM found f), '{}')
           AS found_ids,
       coalesce((SELECT array_agg(extract(epoch FROM f.since + make_interval(secs => %(grace)s)
                                          - clock_timestamp())::float8 ORDER BY f.job_id)
                   FROM found f), '{}') AS found_due_in,
       CASE WHEN a.pass IS NOT NULL THEN NULL
            WHEN s.pass_started_at IS NOT NULL
                THEN extract(epoch FROM s.owner_until - now())::float8
            WHEN s.singleton IS NOT NULL
                THEN extract(epoch FROM s.last_finished_at + make_interval(secs => %(interval)s)
                                        - (s.last_finished_at - s.last_started_at) - now())::float8
       END AS next_in,
       -- The totals of the pass this step completed; NULL otherwise.
       CASE WHEN a.done THEN a.last_examined END AS pass_examined,
       CASE WHEN a.done THEN a.last_found END AS pass_found,
       CASE WHEN a.done THEN a.last_example::text END AS pass_example,
       CASE WHEN a.done THEN a.seconds END AS pass_seconds
  FROM (SELECT 1) AS one
  LEFT JOIN advanced a ON true
  LEFT JOIN state s ON true

-- name: reconcile_release
-- Hands the pass this replica holds to the next replica at once (on shutdown).
UPDATE @reactor@.reconcile SET owner_until = now() WHERE owner = %(owner)s

-- name: reconcile_last_pass
-- The last completed pass and whether one is in progress, for `reactor sweep --once` and status.
SELECT pass AS number,
       pass_started_at IS NOT NULL AS in_progress,
       last_started_at AS started_at,
       last_finished_at AS finished_at,
       last_examined AS examined,
       last_found AS found,
       last_example::text AS example,
       extract(epoch FROM last_finished_at - last_started_at)::float8 AS seconds,
       requested_at IS NOT NULL AS requested,
       last_owner AS owner
  FROM @reactor@.reconcile

-- name: health
-- The replica's one periodic statement, every probe interval; on the LISTEN connection while it
-- is up, so that the same round trip proves that connection alive. It is this replica's
-- heartbeat, and reads back the live set: the others' heartbeats within %(liveness)s seconds,
-- and this one. The heartbeat carries the grace the replica runs with and, while its record
-- statements cannot write, their error (%(write_error)s): `reactor status` reads both. It sends the probe notification %(probe)s on %(channel)s when one is given (the
-- listener heard nothing since its last check), unless the NOTIFY queue is half full. And it
-- reads what the loops would otherwise each ask on a timer of their own:
-- - queue_usage: NOTIFY queue pressure;
-- - oldest_overdue: how long past its grace the oldest queued job that needs a run has waited
--   (0 when none is overdue); since is at most the updated_at that queued a job, so the range
--   on since skips the jobs still inside their grace;
-- - the hook outbox: rows open and parked, whether settled rows have outlived
--   %(retention)s seconds (the retention job has work), and by how many seconds the oldest
--   has (hooks_overdue, 0 when none has: long past, the retention is not running), read from
--   the settled rows' index, its first entry;
-- - the reconcile: when its last pass ended (unix time, 0 before the first) and whether a pass
--   was asked for (a TRUNCATE of analysis_runs asks);
-- - trigger_channel: the channel the job trigger notifies, '' when it was installed not to
--   notify, NULL when it is missing or disabled; trigger_spread: whether it notifies each
--   share of the jobs on a channel of its own (`reactor migrate --spread`);
-- - the database clock, for the timers' aim;
-- - set_aside: the queued jobs whose write failed on their own data (oldest_overdue leaves out
--   those whose next try is not due: they are reported as set aside, not as late);
-- - hooks_orphaned: the running hook rows of replicas no longer live that this check made due
--   at once (their leases would have held them until they ran out);
-- - bell_in: the seconds the channel's doorbell is still awake (NULL: silent), so that every
--   replica polls while another keeps it awake (reactor/insurance/doorbell.py);
-- - queued: whether the pending queue holds any job, whoever owns it. An empty queue, with
--   nothing else to act on, lets the replica check less often (reactor.runtime.vitals): every job
--   queued after this check is due a grace later, past the next one.
-- When %(own_session)s (the check rides the replica's LISTEN connection, a session of its own)
-- the heartbeat names this session, and a replica whose named session is gone is not live
-- however fresh its heartbeat: a killed process's sessions end with it, so the others take its
-- jobs over at their next check. A frozen or cut-off one keeps its session until the server's
-- keepalives end it; its heartbeat ages out meanwhile. A replica's first heartbeat tells the
-- others at once (`joined:<replica>` on %(replicas_channel)s), as replica_leave does its last;
-- %(session_pid)s names the replica's proven LISTEN session when the check runs elsewhere. A replica writes none
-- until %(holding)s: it holds its share (its first re-arm read the queue), so that no job is
-- dropped by the others before it is held here.
WITH beat AS (
    INSERT INTO @reactor@.replicas (id, session_pid, grace_seconds, write_error)
    SELECT %(replica)s,
           coalesce(%(session_pid)s::int, CASE WHEN %(own_session)s THEN pg_backend_pid() END),
           %(grace)s, %(write_error)s::text
     WHERE %(holding)s
    ON CONFLICT (id) DO UPDATE
       SET heartbeat_at = now(), session_pid = excluded.session_pid,
           grace_seconds = excluded.grace_seconds, write_error = excluded.write_error
    RETURNING xmax = 0 AS joined
), announce AS (
    SELECT pg_notify(%(replicas_channel)s, 'joined:' || %(replica)s)
      FROM beat
     WHERE beat.joined AND pg_notification_queue_usage() < 0.5
), gone AS (
    -- SKIP LOCKED: another replica's check deleting the same rows never holds this one up.
    DELETE FROM @reactor@.replicas
     WHERE id IN (SELECT id FROM @reactor@.replicas
                   WHERE heartbeat_at < now() - interval '1 hour'
                     FOR UPDATE SKIP LOCKED)
), probe AS (
    SELECT pg_notify(%(channel)s, %(probe)s)
     WHERE %(probe)s::text IS NOT NULL AND pg_notification_queue_usage() < 0.5
), orphaned AS (
    -- The running hook rows of a replica that is no longer live (its heartbeat row is there,
    -- it is not live by it): due at once, so the next claim takes them as a lease that ran
    -- out, counting the attempt. A replica that has not written its first heartbeat yet is
    -- left alone, and the lease stays the backstop for one that froze.
    UPDATE @reactor@.hook_outbox o
       SET available_at = now()
      FROM @reactor@.replicas r
     WHERE o.status = 'running'
       AND o.available_at > now()
       AND r.id = o.leased_by
       AND r.id <> %(replica)s
       AND NOT {{replica_live}}
    RETURNING o.id
), installed AS (
    -- Read once, for both columns below (a CTE named twice is computed once).
    SELECT t.channel, t.spread FROM ({{job_trigger}}) AS t WHERE t.enabled
)
SELECT pg_notification_queue_usage()::float8 AS queue_usage,
       coalesce((SELECT extract(epoch FROM now() - make_interval(secs => %(grace)s)
                                       - @j.updated_at@)
                   FROM @reactor@.pending p JOIN @jobs@ j ON @j.id@ = p.job_id
                  WHERE p.since < now() - make_interval(secs => %(grace)s)
                    AND {{needs_run}}
                    AND @j.updated_at@ < now() - make_interval(secs => %(grace)s)
                    AND NOT {{set_aside}}
                  ORDER BY p.since
                  LIMIT 1), 0)::float8 AS oldest_overdue,
       (SELECT count(*) FROM @reactor@.hook_outbox
         WHERE status IN ('pending', 'running'))::int AS hook_backlog,
       (SELECT count(*) FROM @reactor@.hook_outbox WHERE status = 'failed')::int AS hook_failed,
       EXISTS (SELECT 1 FROM @reactor@.hook_outbox
                WHERE status IN ('done', 'superseded', 'cancelled')
                  AND updated_at < now() - make_interval(secs => %(retention)s)) AS hooks_expired,
       greatest(coalesce(extract(epoch FROM now() - make_interval(secs => %(retention)s)
                    - (SELECT min(updated_at) FROM @reactor@.hook_outbox
                        WHERE status IN ('done', 'superseded', 'cancelled'))), 0), 0)::float8
           AS hooks_overdue,
       coalesce((SELECT extract(epoch FROM last_finished_at) FROM @reactor@.reconcile), 0)::float8
           AS reconcile_last_pass,
       coalesce((SELECT requested_at IS NOT NULL FROM @reactor@.reconcile), false)
           AS reconcile_requested,
       array(SELECT r.id FROM @reactor@.replicas r
              WHERE r.id <> %(replica)s AND {{replica_live}}
             UNION ALL SELECT %(replica)s
             ORDER BY 1) AS live_replicas,
       (SELECT channel FROM installed) AS trigger_channel,
       coalesce((SELECT spread FROM installed), false) AS trigger_spread,
       (SELECT count(*) FROM probe)::int AS probes_sent,
       extract(epoch FROM clock_timestamp())::float8 AS database_time,
       (SELECT count(*) FROM @reactor@.set_aside s
         WHERE EXISTS (SELECT 1 FROM @reactor@.pending p WHERE p.job_id = s.job_id))::int
           AS set_aside,
       (SELECT count(*) FROM announce)::int AS joined_told,
       (SELECT count(*) FROM orphaned)::int AS hooks_orphaned,
       EXISTS (SELECT 1 FROM @reactor@.pending) AS queued,
       (SELECT extract(epoch FROM awake_until - clock_timestamp())::float8
          FROM @reactor@.doorbell WHERE channel = %(channel)s) AS bell_in

-- name: replica_leave
-- A replica that stops cleanly hands its jobs to the others: it drops its heartbeat and, in the
-- same statement, tells every replica listening on the membership channel %(channel)s
-- (`left:<replica>`), so they take its share over in milliseconds rather than at their next
-- health check. The notification is
-- skipped when the NOTIFY queue is half full, as the probe is; the health check then tells.
WITH gone AS (
    DELETE FROM @reactor@.replicas WHERE id = %(replica)s RETURNING id
)
SELECT count(pg_notify(%(channel)s, 'left:' || g.id))::int AS told
  FROM gone g
 WHERE pg_notification_queue_usage() < 0.5

-- name: claim_hooks
-- Leases up to %(limit)s runnable hook rows, oldest first: pending ones past their backoff, and
-- running ones whose lease expired (their replica died). Only hooks this replica knows.
-- attempts counts claims; it doubles as the fencing token for finish_hook and release_hook.
-- A row whose run no longer holds its job (a later job of the run replaced it) is settled as
-- superseded instead, without an attempt: its hook must not judge verdicts the run lost.
-- A lease that ran out was an attempt that failed: its replica died or froze running it, maybe
-- because the hook killed its process. Its last_error says so. When it was the last attempt
-- of the row's schedule (attempts - retry_base, as the runner counts them, reached
-- %(max_attempts)s, REACTOR_HOOK_MAX_ATTEMPTS), the row is parked as failed instead of being
-- leased again, so such a hook cannot take down replica after replica; it comes back with
-- superseded NULL. With %(max_attempts)s NULL no row is parked here.
WITH due AS (
    SELECT o.id, o.run_id, o.job_id, o.status = 'running' AS expired,
           o.status = 'running'
           AND coalesce(o.attempts - o.retry_base >= %(max_attempts)s::int, false) AS spent
      FROM @reactor@.hook_outbox o
     WHERE o.status IN ('pending', 'running')
       AND o.available_at <= now()
       AND o.hook = ANY(%(hooks)s::text[])
     ORDER BY o.available_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), judged AS (
    SELECT d.id, d.expired, d.spent,
           EXISTS (SELECT 1 FROM @runs@ r
                    WHERE @r.key@ = d.run_id AND @r.job@ = d.job_id) AS current
      FROM due d
)
UPDATE @reactor@.hook_outbox o
   SET status = CASE WHEN NOT j.current THEN 'superseded'
                     WHEN j.spent THEN 'failed'
                     ELSE 'running' END,
       attempts = o.attempts + CASE WHEN j.current AND NOT j.spent THEN 1 ELSE 0 END,
       available_at = CASE WHEN NOT j.current THEN o.available_at
                           WHEN j.spent THEN now()
                           ELSE now() + make_interval(secs => %(lease)s) END,
       leased_until = CASE WHEN j.current AND NOT j.spent
                           THEN now() + make_interval(secs => %(lease)s) END,
       leased_by = CASE WHEN j.current AND NOT j.spent THEN %(replica)s END,
       last_error = CASE WHEN j.current AND j.expired
                         THEN 'the lease of attempt ' || o.attempts || ' ran out before it '
                              || 'settled: its replica died or stalled while running it'
                              || CASE WHEN j.spent THEN ' (the last attempt: parked)' ELSE '' END
                         ELSE o.last_error END,
       updated_at = now()
  FROM judged j
 WHERE o.id = j.id
RETURNING o.id, o.run_id::text AS run_id, o.job_id::text AS job_id, o.hook,
          o.attempts AS attempt, o.retry_base,
          CASE o.status WHEN 'superseded' THEN true WHEN 'running' THEN false END AS superseded,
          o.finish

-- name: next_hook_in
-- Seconds until the next hook row of ours becomes claimable (NULL when there is none).
SELECT extract(epoch FROM min(available_at) - now())::float8 AS next_in
  FROM @reactor@.hook_outbox
 WHERE status IN ('pending', 'running') AND hook = ANY(%(hooks)s::text[])

-- name: finish_hook
-- Settles one attempt: done, retry after %(delay)s seconds, or parked as failed. Only the
-- holder of the current attempt may settle it, except that success is always recorded for the
-- finish it ran for (%(finish)s): a row queued again for a later finish of its job is not.
UPDATE @reactor@.hook_outbox
   SET status = %(status)s,
       last_error = %(error)s,
       available_at = now() + make_interval(secs => %(delay)s),
       leased_until = NULL,
       leased_by = NULL,
       updated_at = now()
 WHERE id = %(id)s
   AND status = 'running'
   AND (attempts = %(attempt)s OR (%(status)s = 'done' AND finish = %(finish)s))

-- name: release_hook
-- Hands an interrupted attempt back at once (a drain ran out), without counting it.
UPDATE @reactor@.hook_outbox
   SET status = 'pending',
       attempts = attempts - 1,
       available_at = now(),
       leased_until = NULL,
       leased_by = NULL,
       updated_at = now()
 WHERE id = %(id)s
   AND status = 'running'
   AND attempts = %(attempt)s
