-- The install lock's statements (loaded with sql.query(name, "install_lock.sql")): the lease on
-- the one row of <reactor_schema>.install_lock that `reactor migrate` holds from its first
-- statement to its last (migration 0021 says why it is a row and not an advisory lock), and the
-- advisory lock a first install still takes turns by, before the table exists.

-- fragment: held_by_another
-- The lease of row l is held by a live session other than this one: one with its pid and login
-- role and, where this role may see it, its start (pg_stat_activity shows another role's
-- backend_start only to its members). A pid the holder's death freed, and the next session
-- got, is another session's start.
(l.pid IS NOT NULL AND l.pid <> pg_backend_pid() AND EXISTS (
    SELECT 1 FROM pg_stat_activity a
     WHERE a.pid = l.pid AND a.usesysid = l.usesysid
       AND (a.backend_start IS NULL OR a.backend_start = l.backend_start)))

-- fragment: this_session
pid = pg_backend_pid(),
usesysid = (SELECT a.usesysid FROM pg_stat_activity a WHERE a.pid = pg_backend_pid()),
backend_start = (SELECT a.backend_start FROM pg_stat_activity a WHERE a.pid = pg_backend_pid()),
taken_at = now()

-- name: take_install_lock
-- Takes the lease unless a live session holds it; never waits (a row a printed script's
-- transaction has locked is skipped, and tried again). taken, or the holder's pid, user and
-- application_name.
WITH free AS (
    SELECT l.singleton FROM @reactor@.install_lock l
     WHERE l.singleton AND NOT {{held_by_another}}
       FOR UPDATE SKIP LOCKED
), taken AS (
    UPDATE @reactor@.install_lock l
       SET {{this_session}}
      FROM free
     WHERE l.singleton
    RETURNING l.pid
)
SELECT EXISTS (SELECT 1 FROM taken) AS taken, l.pid, a.usename::text AS usename,
       a.application_name::text AS application_name
  FROM @reactor@.install_lock l
  LEFT JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE l.singleton

-- name: restore_install_lock
-- The row, free, should someone have deleted it: without it there is nothing to take turns by.
INSERT INTO @reactor@.install_lock DEFAULT VALUES ON CONFLICT DO NOTHING

-- name: install_lock_ours
-- Whether this session holds the lease (the install that made the table does from the start).
SELECT EXISTS (SELECT 1 FROM @reactor@.install_lock WHERE singleton AND pid = pg_backend_pid())

-- name: release_install_lock
-- Gives the lease up, if this session holds it.
UPDATE @reactor@.install_lock SET pid = NULL, usesysid = NULL, backend_start = NULL
 WHERE singleton AND pid = pg_backend_pid()

-- name: script_install_lock
-- The printed script's turn, in each of its transactions once the table exists: the lease,
-- taken as `reactor migrate` takes it, or the transaction fails before it changes anything when
-- a live session holds it. The script gives it up at its end (release_install_lock).
DO $reactor_lock$
DECLARE
    holder text;
BEGIN
    UPDATE @reactor@.install_lock l SET {{this_session}}
     WHERE l.singleton AND NOT {{held_by_another}};
    IF NOT FOUND THEN
        SELECT 'pid ' || l.pid || ', user ' || coalesce(a.usename::text, '?')
               || ', application ' || coalesce(quote_literal(a.application_name), '?')
          INTO holder
          FROM @reactor@.install_lock l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.singleton;
        RAISE EXCEPTION USING MESSAGE = 'reactor: another session runs `reactor migrate` ('
            || coalesce(holder, 'no install_lock row') || '); apply this script once it is done';
    END IF;
END
$reactor_lock$

-- name: advisory_holder
-- Who holds the advisory lock %(key)s (a bigint key below 2^32: classid 0, objid the key) in
-- this database: pid, user and application_name, from the catalog every role may read.
SELECT l.pid, a.usename::text AS usename, a.application_name::text AS application_name
  FROM pg_locks l
  LEFT JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE l.locktype = 'advisory' AND l.granted AND l.classid = 0 AND l.objsubid = 1
   AND l.objid = %(key)s::bigint::oid
   AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
 ORDER BY l.pid
 LIMIT 1
