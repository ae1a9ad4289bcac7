-- Wakes the reactors and queues eligible jobs, on the NOTIFY channel (@channel@, from
-- REACTOR_CHANNEL). Repeatable: `reactor migrate` applies it after the numbered migrations every
-- time, so changing the channel needs no new migration.
--
-- Two triggers because an INSERT has no OLD row. The column list keeps the update trigger from
-- even being considered for updates that touch none of the columns that matter, and WHEN keeps
-- it to terminal rows; reactor.job_changed_v1 decides the rest.
CREATE OR REPLACE TRIGGER reactor_job_insert
    AFTER INSERT ON analysis_jobs
    FOR EACH ROW
    WHEN (NEW.status IN ('complete', 'failed'))
    EXECUTE FUNCTION reactor.job_changed_v1(@channel@);

CREATE OR REPLACE TRIGGER reactor_job_update
    AFTER UPDATE OF status, results, doc_html, deleted_at ON analysis_jobs
    FOR EACH ROW
    WHEN (NEW.status IN ('complete', 'failed'))
    EXECUTE FUNCTION reactor.job_changed_v1(@channel@);
