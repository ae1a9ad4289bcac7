-- The reactor's triggers on the app's tables, on the NOTIFY channel (@channel@, from
-- REACTOR_CHANNEL). Repeatable: `reactor migrate` applies it after the numbered migrations every
-- time, so changing the channel needs no new migration.
--
-- Two job triggers because an INSERT has no OLD row. WHEN keeps the update trigger to terminal
-- rows that changed status or were not yet eligible, so an ordinary update never calls the
-- function; reactor.job_changed_v1 decides the rest. There is no column list: an app's BEFORE
-- trigger may set status on an update that names other columns.
--
-- The trigger functions act only for the tables their triggers are on (see migration 0013).
UPDATE reactor.app_tables SET jobs = 'analysis_jobs', runs = 'analysis_runs';

CREATE OR REPLACE TRIGGER reactor_job_insert
    AFTER INSERT ON analysis_jobs
    FOR EACH ROW
    WHEN (NEW.status IN ('complete', 'failed'))
    EXECUTE FUNCTION reactor.job_changed_v1(@channel@);

CREATE OR REPLACE TRIGGER reactor_job_update
    AFTER UPDATE ON analysis_jobs
    FOR EACH ROW
    WHEN (NEW.status IN ('complete', 'failed')
          AND (OLD.status IS DISTINCT FROM NEW.status
               OR OLD.deleted_at IS NOT NULL OR OLD.doc_html IS NULL
               OR OLD.results IS NULL OR OLD.results = '{}'::jsonb))
    EXECUTE FUNCTION reactor.job_changed_v1(@channel@);

CREATE OR REPLACE TRIGGER reactor_jobs_delete
    AFTER DELETE ON analysis_jobs
    REFERENCING OLD TABLE AS reactor_deleted_jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION reactor.jobs_deleted_v1(@channel@);

-- A run row deleted, or changed so that it may stop standing for a job: from client to worker,
-- to another job, or to another run id. The reactor's own replacement of an earlier job's row
-- passes here too; the scan finds that the run's jobs need nothing and drops them.
CREATE OR REPLACE TRIGGER reactor_run_delete
    AFTER DELETE ON analysis_runs
    FOR EACH ROW
    EXECUTE FUNCTION reactor.run_changed_v1(@channel@);

CREATE OR REPLACE TRIGGER reactor_run_update
    AFTER UPDATE ON analysis_runs
    FOR EACH ROW
    WHEN (OLD.id IS DISTINCT FROM NEW.id
          OR (NEW.saved_by = 'worker'
              AND (OLD.saved_by IS DISTINCT FROM 'worker' OR OLD.job_id IS DISTINCT FROM NEW.job_id)))
    EXECUTE FUNCTION reactor.run_changed_v1(@channel@);

CREATE OR REPLACE TRIGGER reactor_runs_truncate
    AFTER TRUNCATE ON analysis_runs
    FOR EACH STATEMENT
    EXECUTE FUNCTION reactor.run_changed_v1(@channel@);

-- Nobody but the owner calls a reactor function unless granted (`reactor migrate
-- --print-grants` grants the runtime role the one it calls). Triggers fire without EXECUTE;
-- creating one on a reactor function needs it. Functions a later migration adds are covered.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA reactor FROM PUBLIC;

-- A migrate is the operator's word that the app's tables or the mapping may have changed: every
-- job set aside because its write failed is tried again at once.
DELETE FROM reactor.set_aside;
