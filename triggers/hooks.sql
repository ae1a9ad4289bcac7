-- The hook outbox's housekeeping and the statements of `reactor hooks list/retry/cancel`, by
-- name (loaded with sql.query(name, "hooks.sql")). The runner's own statements (claim, settle,
-- release) are in queries.sql. Each statement is one transaction.
--
-- Row states: pending -> running -> done | pending (retry) | failed (parked); superseded (the
-- run held a later job when the row was claimed); cancelled (by an operator). Every query
-- names the status it reads, so each reads one partial index and never the settled rows.

-- name: purge_hooks
-- Retention: deletes up to %(batch)s settled rows (done, superseded, cancelled) that settled
-- more than %(retention)s seconds ago, oldest first. Replicas purging at once share the rows:
-- each locks its batch and skips the rows another holds. No lock decides whose turn it is: any
-- role that can connect may hold an advisory key, and one that held the key the purge once took
-- turns by kept every replica's purge from running, without a word. Only a role with UPDATE on
-- the outbox (the reactor's) can lock its rows. Small batches keep each transaction short and
-- its WAL small.
WITH doomed AS (
    SELECT o.id
      FROM @reactor@.hook_outbox o
     WHERE o.status IN ('done', 'superseded', 'cancelled')
       AND o.updated_at < now() - make_interval(secs => %(retention)s)
     ORDER BY o.updated_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM @reactor@.hook_outbox o
     USING doomed d
     WHERE o.id = d.id
    RETURNING o.id
)
SELECT count(*)::int AS deleted FROM deleted

-- fragment: hook_row
o.id, o.hook, o.status, o.attempts, o.run_id::text AS run_id, o.job_id::text AS job_id,
o.last_error, o.available_at, o.leased_until, o.created_at, o.updated_at

-- name: list_hooks
-- `reactor hooks list`: the rows that are not settled (pending, running and parked), or the
-- parked ones only with %(failed_only)s, oldest first, at most %(limit)s, and how many there
-- are in all and of them failed. Each half reads its own partial index.
WITH queued AS (
    SELECT {{hook_row}} FROM @reactor@.hook_outbox o
     WHERE o.status IN ('pending', 'running') AND NOT %(failed_only)s
), parked AS (
    SELECT {{hook_row}} FROM @reactor@.hook_outbox o
     WHERE o.status = 'failed'
), listed AS (
    SELECT * FROM queued UNION ALL SELECT * FROM parked
)
SELECT l.*, count(*) OVER () AS total,
       count(*) FILTER (WHERE l.status = 'failed') OVER () AS failed_total
  FROM listed l
 ORDER BY l.id
 LIMIT %(limit)s

-- name: retry_hooks
-- `reactor hooks retry ID...`: re-queues the given parked rows (failed or cancelled) for a new
-- retry schedule, due now. All or nothing: unless every id names a parked row, nothing
-- changes, and the result says what each id is (status NULL: no such row). The row locks make
-- the check and the change one step, even against a runner claiming at the same moment.
WITH target AS MATERIALIZED (
    SELECT o.id, o.status
      FROM @reactor@.hook_outbox o
     WHERE o.id = ANY(%(ids)s::bigint[])
     ORDER BY o.id
       FOR UPDATE
), allowed AS (
    SELECT count(*) = cardinality(%(ids)s::bigint[])
           AND coalesce(bool_and(t.status IN ('failed', 'cancelled')), false) AS ok
      FROM target t
), changed AS (
    UPDATE @reactor@.hook_outbox o
       SET status = 'pending',
           retry_base = o.attempts,
           available_at = now(),
           leased_until = NULL,
           updated_at = now()
      FROM target t
     WHERE o.id = t.id AND (SELECT ok FROM allowed)
    RETURNING o.id
)
SELECT w.id, t.status, w.id IN (SELECT id FROM changed) AS changed
  FROM unnest(%(ids)s::bigint[]) AS w(id)
  LEFT JOIN target t ON t.id = w.id
 ORDER BY w.id

-- name: retry_failed
-- `reactor hooks retry --failed`: re-queues every failed row, due now, for a new schedule.
UPDATE @reactor@.hook_outbox
   SET status = 'pending',
       retry_base = attempts,
       available_at = now(),
       leased_until = NULL,
       updated_at = now()
 WHERE status = 'failed'
RETURNING id

-- name: cancel_hooks
-- `reactor hooks cancel ID...`: cancels the given pending or failed rows; the retention job
-- deletes them later. A running row is refused: its attempt is under way on some replica, and
-- cancelling under it would leave its outcome unrecorded. All or nothing, as retry_hooks;
-- a row already cancelled is left as it is.
WITH target AS MATERIALIZED (
    SELECT o.id, o.status
      FROM @reactor@.hook_outbox o
     WHERE o.id = ANY(%(ids)s::bigint[])
     ORDER BY o.id
       FOR UPDATE
), allowed AS (
    SELECT count(*) = cardinality(%(ids)s::bigint[])
           AND coalesce(bool_and(t.status IN ('pending', 'failed', 'cancelled')), false) AS ok
      FROM target t
), changed AS (
    UPDATE @reactor@.hook_outbox o
       SET status = 'cancelled',
           leased_until = NULL,
           updated_at = now()
      FROM target t
     WHERE o.id = t.id AND t.status <> 'cancelled' AND (SELECT ok FROM allowed)
    RETURNING o.id
)
SELECT w.id, t.status, w.id IN (SELECT id FROM changed) AS changed
  FROM unnest(%(ids)s::bigint[]) AS w(id)
  LEFT JOIN target t ON t.id = w.id
 ORDER BY w.id
