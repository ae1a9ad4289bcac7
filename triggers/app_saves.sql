-- The app's own save, as the app already writes it. `reactor migrate` applies one part of this
-- file after notify_triggers.sql, every time: the part named by the mapping's runs.app_saves.
-- "plain" installs the triggers below on the artifact table; "upsert", the default, drops them
-- where an earlier migrate installed them, and the app saves with the upsert that marks itself
-- (INSERT ... ON CONFLICT (key) DO UPDATE SET ..., saved_by = 'client').
--
-- With "plain", the app saves as it would without the reactor: a plain INSERT, an ORM's create,
-- over a row the reactor wrote after the grace, or an upsert that leaves saved_by alone. The
-- reactor's row gives way to the app's, and the app's INSERT goes on as it was sent, so the
-- ORM gets the row count and the RETURNING it expects (Ecto's insert fails as stale on a count
-- of 0; Django, Rails, GORM and Prisma read the id back from RETURNING). `reactor migrate`
-- refuses "plain" for an artifact table another table's foreign key references: replacing a
-- row deletes it, which would cascade to those rows or fail (reactor/db/saves.py).
--
-- The reactor's own writes are told apart by the value they propose: every row it writes says
-- saved_by = the worker value, and the app's save says anything else (NULL when the app's model
-- does not know the column). An app that writes the worker value itself makes its row the
-- worker's, as it always could: nothing here lets a role do what its grants do not.

-- name: plain
-- A save of the app's (any row that does not call itself the worker's) over the reactor's row
-- of the same key: the reactor's row is deleted first, in the app's transaction, so the INSERT
-- finds no conflict and inserts the app's row, which wins whatever the reactor does next. A
-- reactor write of this run in flight holds its jobs' rows (FOR NO KEY UPDATE, from its claim
-- to its commit): the save waits for it on those rows, then deletes the row it wrote. And a
-- save holding them keeps the reactor's claim off the run (SKIP LOCKED) until it commits.
CREATE OR REPLACE FUNCTION @reactor@.app_save_v1() RETURNS trigger
    LANGUAGE plpgsql
    -- Not a definer, and without a search_path of its own: the delete is the app's, made with
    -- its role's rights (DELETE on the artifact table, UPDATE on the job table for the lock)
    -- in its session, so the app's own triggers on the artifact table fire as when the app
    -- deletes a row itself, finding what they name through its search_path. A definer's pinned
    -- path would reach them too, and fail those that name their objects unqualified. Nothing
    -- here runs with rights the caller lacks, so nothing a session plants gains any: every
    -- name is schema-qualified all the same. It acts for the mapped table alone (it cannot
    -- call app_table_v1, which the app's role may not execute).
    AS
$$
BEGIN
    IF TG_TABLE_NAME <> @runs_table_name@ OR TG_TABLE_SCHEMA <> @runs_schema_name@ THEN
        RETURN NEW;
    END IF;
    -- Only the jobs the reactor could be writing the run from: those its claim can take.
    PERFORM 1 FROM @jobs@ j WHERE @j.run@ = @NEW.key@ AND @walked(j)@ FOR SHARE OF j;
    DELETE FROM @runs@ r WHERE @r.key@ = @NEW.key@ AND @r.saved_by@ = @worker@;
    RETURN NEW;
END
$$;

-- The reactor's own writes, and the app's updates of a row the reactor wrote. A row the reactor
-- proposes that meets its earlier row of the key becomes, through its ON CONFLICT, an update of
-- that row, in the same statement and right after this trigger: the key is noted for the
-- update trigger in a setting of the reactor's transaction (its one statement). Any other
-- update of a worker row that leaves saved_by the worker's is the app's (an ORM's save of a
-- loaded row, an upsert whose conflict found it in a race) and becomes the client's, so the
-- reactor never replaces it. The app could set the note itself only to make its own update the
-- worker's, which it can do by writing saved_by anyway; it cannot make the reactor's write the
-- client's, since the reactor's row notes its key before its update.
CREATE OR REPLACE FUNCTION @reactor@.worker_save_v1() RETURNS trigger
    LANGUAGE plpgsql
    -- Not a definer: it reads and sets only the row and a setting of the transaction, and it
    -- fires nothing, so its search_path is one nobody else can plant objects in. It acts for
    -- the mapped table alone.
    SET search_path = pg_catalog, pg_temp AS
$$
BEGIN
    IF TG_TABLE_NAME <> @runs_table_name@ OR TG_TABLE_SCHEMA <> @runs_schema_name@ THEN
        RETURN NEW;
    ELSIF TG_OP = 'INSERT' THEN
        PERFORM set_config('reactor.worker_key', TG_RELID::text || ':' || @NEW.key@::text, true);
    ELSIF current_setting('reactor.worker_key', true)
          IS DISTINCT FROM TG_RELID::text || ':' || @OLD.key@::text THEN
        @NEW.saved_by@ := @client@;
    END IF;
    RETURN NEW;
END
$$;

REVOKE ALL ON FUNCTION @reactor@.app_save_v1() FROM PUBLIC;
REVOKE ALL ON FUNCTION @reactor@.worker_save_v1() FROM PUBLIC;

-- BEFORE triggers of one event fire in the order of their names; the two insert triggers
-- never both fire for one row. The WHEN keeps the reactor's rows out of the app's trigger, and
-- the app's updates of its own rows out of the function.
CREATE OR REPLACE TRIGGER @reactor@_app_save
    BEFORE INSERT ON @runs@
    FOR EACH ROW
    WHEN (@NEW.saved_by@ IS DISTINCT FROM @worker@)
    EXECUTE FUNCTION @reactor@.app_save_v1();

CREATE OR REPLACE TRIGGER @reactor@_worker_save
    BEFORE INSERT ON @runs@
    FOR EACH ROW
    WHEN (@NEW.saved_by@ = @worker@)
    EXECUTE FUNCTION @reactor@.worker_save_v1();

CREATE OR REPLACE TRIGGER @reactor@_app_update
    BEFORE UPDATE ON @runs@
    FOR EACH ROW
    WHEN (@OLD.saved_by@ = @worker@ AND @NEW.saved_by@ = @worker@)
    EXECUTE FUNCTION @reactor@.worker_save_v1();

-- name: upsert
-- The app saves with the upsert that marks itself: nothing of "plain" stays. A function that
-- is not there costs nothing to drop; one that is takes its triggers with it (CASCADE), from
-- whichever table they are on.
DROP FUNCTION IF EXISTS @reactor@.app_save_v1() CASCADE;
DROP FUNCTION IF EXISTS @reactor@.worker_save_v1() CASCADE;
