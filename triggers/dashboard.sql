-- The statements the reactor's HTTP page adds to `reactor status`, by name (loaded with
-- sql.query(name, "dashboard.sql")). Kept apart from status.sql and hooks.sql so that neither
-- changes for them; each is one short autocommit statement.

-- name: status_replicas
-- Every replica's heartbeat row: when it started, how long ago it last checked in, and whether
-- it counts as live, by the rule of the health check's live set. Rows of replicas gone for an
-- hour are deleted by the health check, so this stays a handful of rows. The grace a replica
-- runs with and the error its record statements fail with came with migration 18: read through
-- the row's JSON, they are NULL on a schema from before it.
SELECT r.id,
       r.started_at,
       extract(epoch FROM now() - r.heartbeat_at)::float8 AS heartbeat_age,
       r.session_pid IS NOT NULL AS listens,
       {{replica_live}} AS live,
       (to_jsonb(r) ->> 'grace_seconds')::float8 AS grace,
       to_jsonb(r) ->> 'write_error' AS write_error
  FROM @reactor@.replicas r
 ORDER BY r.started_at, r.id

-- name: release_set_aside_job
-- Tries one job set aside again at once: its row goes, so the next record statement or scan
-- takes the job as any other (and sets it aside again if its data still fails). The job id
-- comes back when there was such a row.
DELETE FROM @reactor@.set_aside
 WHERE job_id = %(job)s::@job_type@
RETURNING job_id::text AS job_id
