-- Wakes the reactor when a job becomes terminal. The payload is the job id and nothing else: the
-- reactor re-reads the row, so the hint can be tiny, and NOTIFY fails at 8000 bytes.
--
-- The triggers fire only on the transition into a terminal status. A transaction that notifies
-- takes a cluster-wide lock at commit, so notifying on every update would throttle the app.
-- The triggers themselves live in notify_triggers.sql, which every `reactor migrate` re-applies
-- so that they follow REACTOR_CHANNEL.
CREATE OR REPLACE FUNCTION reactor.notify_terminal_v1() RETURNS trigger
    LANGUAGE plpgsql AS
$$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], NEW.id::text);
    RETURN NULL;
END
$$;
