-- The install lock: who runs `reactor migrate`, or applies its printed script, now. Until this
-- table existed, two migrates took turns by an advisory lock, and any role that can connect may
-- take an advisory lock: one that held its key kept every `reactor migrate` waiting for ever. A
-- row of the reactor's own table can be changed only by a role granted UPDATE on it, which
-- nobody but its owner is (reactor/db/migrations.py).
--
-- The row is a lease, held across the migrate's transactions and index builds: the holder's
-- pid, login role and session start. It is free when no live session matches them, so a
-- migrate that was killed leaves nothing to clear. The session that creates the table holds it
-- from the start: a second migrate that finds the table takes turns by it, not by the advisory
-- lock the first still holds.
CREATE TABLE IF NOT EXISTS @reactor@.install_lock (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    pid            integer,
    usesysid       oid,
    backend_start  timestamptz,
    taken_at       timestamptz
);

INSERT INTO @reactor@.install_lock (pid, usesysid, backend_start, taken_at)
VALUES (pg_backend_pid(),
        (SELECT a.usesysid FROM pg_stat_activity a WHERE a.pid = pg_backend_pid()),
        (SELECT a.backend_start FROM pg_stat_activity a WHERE a.pid = pg_backend_pid()),
        now())
ON CONFLICT DO NOTHING;
