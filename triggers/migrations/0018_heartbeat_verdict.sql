-- A replica's heartbeat carries what `reactor status` cannot see from another process: the
-- grace window the replica runs with (status judges lateness by it, not by its own setting),
-- and the error its record statements fail with while they fail on the pair's own objects
-- (NULL while it writes), so that status names what keeps the pair from writing.
ALTER TABLE @reactor@.replicas ADD COLUMN IF NOT EXISTS grace_seconds float8;
ALTER TABLE @reactor@.replicas ADD COLUMN IF NOT EXISTS write_error text;
