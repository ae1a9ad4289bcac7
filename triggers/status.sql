-- The statements of `reactor status` and of the startup privilege check, by name (loaded with
-- sql.query(name, "status.sql"); {{needs_run}} comes from queries.sql). They only read.
-- Times come from the database clock, as everywhere in the reactor.

-- name: status_server
-- The server's side: the database clock, NOTIFY queue pressure, the job trigger (the channel it
-- notifies, '' for none; NULL when it is missing; whether it spreads) and which optional objects exist. The hook
-- outbox, its row ids, the pending queue and the reconcile arrived with later migrations, so an
-- older schema may lack them.
SELECT now() AS checked_at,
       pg_is_in_recovery() AS in_recovery,  -- a hot standby: nothing can be recorded here
       t.channel AS trigger_channel,
       coalesce(t.spread, false) AS trigger_spread,
       coalesce(t.enabled, false) AS trigger_enabled,
       pg_notification_queue_usage()::float8 AS queue_usage,
       to_regclass(@jobs_name@) IS NOT NULL AND to_regclass(@runs_name@) IS NOT NULL
           AS app_tables,
       to_regclass('@reactor@.hook_outbox') IS NOT NULL AS hook_outbox,
       EXISTS (SELECT 1 FROM pg_attribute a
                WHERE a.attrelid = to_regclass('@reactor@.hook_outbox')
                  AND a.attname = 'id' AND NOT a.attisdropped) AS hook_ids,
       to_regclass('@reactor@.pending') IS NOT NULL AS pending_queue,
       to_regclass('@reactor@.reconcile') IS NOT NULL AS reconcile,
       to_regclass('@reactor@.set_aside') IS NOT NULL AS set_aside,
       to_regclass('@reactor@.doorbell') IS NOT NULL AS doorbell,
       -- CVE-2018-1058: PUBLIC (grantee 0) may create in public, as up to PostgreSQL 14.
       EXISTS (SELECT 1 FROM pg_catalog.pg_namespace n,
                     pg_catalog.aclexplode(coalesce(n.nspacl,
                                                    pg_catalog.acldefault('n', n.nspowner))) a
                WHERE n.nspname = 'public' AND a.grantee = 0
                  AND a.privilege_type = 'CREATE') AS public_creatable
  FROM (SELECT 1) AS one
  LEFT JOIN ({{job_trigger}}) AS t ON true

-- name: status_jobs
-- Jobs that need a run, split at the grace window, and the oldest of the due ones with its age
-- since its last update: the app trims doc_html a trim horizon after that, and a job trimmed
-- before it is recorded loses its report. Read through the pending queue, as the scan does:
-- its cost is the unrecorded backlog, not the millions of finished jobs in analysis_jobs.
WITH pending AS MATERIALIZED (
    SELECT @j.id@ AS id, @j.updated_at@ AS updated_at,
           @j.updated_at@ < now() - make_interval(secs => %(grace)s) AS due
      FROM @reactor@.pending p JOIN @jobs@ j ON @j.id@ = p.job_id
     WHERE {{needs_run}}
)
{{status_jobs_summary}}

-- name: status_jobs_unqueued
-- status_jobs for a schema from before the pending queue (it reports itself behind): the
-- predicate over analysis_jobs itself, which that schema's partial due index serves.
WITH pending AS MATERIALIZED (
    SELECT @j.id@ AS id, @j.updated_at@ AS updated_at,
           @j.updated_at@ < now() - make_interval(secs => %(grace)s) AS due
      FROM @jobs@ j
     WHERE {{needs_run}}
)
{{status_jobs_summary}}

-- fragment: status_jobs_summary
SELECT (SELECT count(*) FROM pending WHERE due)::bigint AS due,
       (SELECT count(*) FROM pending WHERE NOT due)::bigint AS in_grace,
       oldest.id::text AS oldest_job_id,
       extract(epoch FROM now() - oldest.updated_at)::float8 AS oldest_age
  FROM (SELECT 1) AS one
  LEFT JOIN LATERAL (
       SELECT p.id, p.updated_at FROM pending p WHERE p.due ORDER BY p.updated_at, p.id LIMIT 1
  ) AS oldest ON true

-- name: status_doorbell
-- The seconds the channel %(channel)s's doorbell is still awake: no row while it is silent.
SELECT extract(epoch FROM awake_until - clock_timestamp())::float8 AS awake_for
  FROM @reactor@.doorbell
 WHERE channel = %(channel)s AND awake_until > clock_timestamp()

-- name: status_set_aside
-- Queued jobs set aside because their write failed on their own data: how many, and the
-- %(limit)s that failed first, with the error and when they are tried again.
WITH held AS (
    SELECT s.* FROM @reactor@.set_aside s
     WHERE EXISTS (SELECT 1 FROM @reactor@.pending p WHERE p.job_id = s.job_id)
)
SELECT (SELECT count(*) FROM held)::bigint AS count,
       coalesce((SELECT json_agg(json_build_object(
                                 'job_id', f.job_id, 'error', f.error, 'sqlstate', f.sqlstate,
                                 'failures', f.failures, 'first_failed_at', f.first_failed_at,
                                 'retry_at', f.retry_at) ORDER BY f.first_failed_at, f.job_id)
                   FROM (SELECT * FROM held ORDER BY first_failed_at, job_id LIMIT %(limit)s) f),
                '[]'::json) AS first

-- name: status_hooks
-- The hook outbox: what is queued or leased, how long the oldest has waited, and what is
-- parked as failed after its last attempt (it needs a person); and by how many seconds the
-- oldest settled row has outlived the retention %(retention)s (0 when none has). Only the open
-- and the parked rows are counted (each through its partial index, index-only), never the
-- settled ones, which can be millions: of those, only the first entry of their index is read.
SELECT count(*) FILTER (WHERE o.status = 'pending')::bigint AS pending,
       count(*) FILTER (WHERE o.status = 'running')::bigint AS running,
       (SELECT count(*) FROM @reactor@.hook_outbox f WHERE f.status = 'failed')::bigint AS failed,
       extract(epoch FROM now() - min(o.created_at))::float8 AS oldest_backlog_age,
       greatest(coalesce(extract(epoch FROM now() - make_interval(secs => %(retention)s)
                    - (SELECT min(s.updated_at) FROM @reactor@.hook_outbox s
                        WHERE s.status IN ('done', 'superseded', 'cancelled'))), 0), 0)::float8
           AS retention_overdue
  FROM @reactor@.hook_outbox o
 WHERE o.status IN ('pending', 'running')

-- name: status_hook_failures
-- The most recent parked failures, with the id `reactor hooks retry` takes.
SELECT o.id, o.hook, o.run_id::text AS run_id, o.job_id::text AS job_id, o.attempts,
       o.last_error, o.updated_at
  FROM @reactor@.hook_outbox o
 WHERE o.status = 'failed'
 ORDER BY o.updated_at DESC
 LIMIT %(limit)s

-- name: status_hook_failures_unnumbered
-- status_hook_failures for a schema from before hook row ids (it reports itself behind).
SELECT NULL::bigint AS id, o.hook, o.run_id::text AS run_id, o.job_id::text AS job_id,
       o.attempts, o.last_error, o.updated_at
  FROM @reactor@.hook_outbox o
 WHERE o.status = 'failed'
 ORDER BY o.updated_at DESC
 LIMIT %(limit)s

-- name: status_listeners
-- The reactor replicas LISTENing on this database: each holds one session whose
-- application_name the reactor sets (db.conninfo). Without pg_read_all_stats, another role's
-- client_addr and backend_start read as NULL; the count is right either way.
SELECT a.pid, host(a.client_addr) AS client_addr, a.backend_start
  FROM pg_stat_activity a
 WHERE a.application_name = %(application_name)s
   AND a.datname = current_database()
 ORDER BY a.backend_start, a.pid

-- name: missing_privileges
-- Each privilege of grants.REQUIRED (passed as parallel arrays, in order) that the current role
-- lacks, as the GRANT that would give it, with the role's name; no row when all are held. Objects that do not exist
-- are skipped (NULL oid): the schema check reports those. Relations of a named schema are
-- found through pg_class rather than to_regclass(), which fails outright on a schema the role
-- may not use; that lack is reported once, by the schema's own row. For a row lock, PostgreSQL
-- accepts UPDATE on any column of the table, so any_column checks exactly that. A function is
-- found by name and argument types (%(args)s) through pg_proc, for the same reason. Schemas
-- are found by their names as the catalog has them, not through to_regnamespace(), which would
-- read each as SQL (folding MyApp to myapp; on PostgreSQL 15, failing on a name with a space).
SELECT need.grant_sql, current_user::text AS role
  FROM unnest(%(kinds)s::text[], %(privileges)s::text[], %(schemas)s::text[],
              %(names)s::text[], %(args)s::text[], %(grants)s::text[])
       WITH ORDINALITY
       AS need(kind, privilege, schema_name, object_name, args, grant_sql, position)
 CROSS JOIN LATERAL (
       SELECT CASE
                WHEN need.kind = 'schema' THEN
                     (SELECT n.oid FROM pg_namespace n WHERE n.nspname = need.object_name)
                WHEN need.kind = 'function' THEN
                     (SELECT p.oid FROM pg_proc p
                       JOIN pg_namespace n ON n.oid = p.pronamespace
                       WHERE n.nspname = need.schema_name
                         AND p.proname = need.object_name
                         AND oidvectortypes(p.proargtypes) = need.args)
                ELSE (SELECT c.oid FROM pg_class c
                       JOIN pg_namespace n ON n.oid = c.relnamespace
                       WHERE n.nspname = need.schema_name
                         AND c.relname = need.object_name)
              END AS oid
 ) AS found
 WHERE CASE need.kind
         WHEN 'schema' THEN NOT has_schema_privilege(found.oid, need.privilege)
         WHEN 'any_column' THEN NOT has_any_column_privilege(found.oid, need.privilege)
         WHEN 'function' THEN NOT has_function_privilege(found.oid, need.privilege)
         WHEN 'sequence' THEN NOT has_sequence_privilege(found.oid, need.privilege)
         ELSE NOT has_table_privilege(found.oid, need.privilege)
       END
 ORDER BY need.position
