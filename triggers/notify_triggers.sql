-- Points analysis_jobs' terminal transitions at the NOTIFY channel (@channel@, from
-- REACTOR_CHANNEL). Repeatable: `reactor migrate` applies it after the numbered migrations every
-- time, so changing the channel needs no new migration.
--
-- Two triggers because an INSERT has no OLD row. `UPDATE OF status` keeps the trigger from even
-- being considered for updates that leave the status alone.
CREATE OR REPLACE TRIGGER reactor_terminal_insert
    AFTER INSERT ON analysis_jobs
    FOR EACH ROW
    WHEN (NEW.status IN ('complete', 'failed'))
    EXECUTE FUNCTION reactor.notify_terminal_v1(@channel@);

CREATE OR REPLACE TRIGGER reactor_terminal_update
    AFTER UPDATE OF status ON analysis_jobs
    FOR EACH ROW
    WHEN (NEW.status IN ('complete', 'failed') AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION reactor.notify_terminal_v1(@channel@);
