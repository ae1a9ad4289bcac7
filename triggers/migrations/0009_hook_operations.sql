-- Hooks an operator can run: a short id to name a row by, two more outcomes, re-driving parked
-- rows, and indexes that keep every periodic query flat while settled rows await retention.
--
-- id: what `reactor hooks list/retry/cancel` show and take. The primary key stays (run_id,
-- job_id, hook): the record statement's ON CONFLICT relies on it. Adding an identity column
-- rewrites the table once, under an exclusive lock; on an outbox that has grown large, delete
-- old done rows before migrating.
--
-- retry_base: attempts made before the last `reactor hooks retry`; the retry schedule and the
-- attempt budget count from there. attempts itself only grows, because it is the fencing
-- token of a lease: an attempt that outlived its lease can never settle a newer one.
--
-- Every statement is idempotent, as `reactor migrate --print` output must be.
ALTER TABLE reactor.hook_outbox
    ADD COLUMN IF NOT EXISTS id bigint GENERATED ALWAYS AS IDENTITY,
    ADD COLUMN IF NOT EXISTS retry_base integer NOT NULL DEFAULT 0;

CREATE UNIQUE INDEX IF NOT EXISTS hook_outbox_id_idx ON reactor.hook_outbox (id);

-- superseded: by the time the row was claimed, its run held a later job (a re-analysis); the
-- hook is not called. cancelled: an operator said so.
ALTER TABLE reactor.hook_outbox
    DROP CONSTRAINT IF EXISTS hook_outbox_status_check,
    ADD CONSTRAINT hook_outbox_status_check
        CHECK (status IN ('pending', 'running', 'done', 'failed', 'superseded', 'cancelled'));

-- One partial index per kind of row, so no periodic query reads the settled rows: the claim,
-- the health and status counts and the next-due lookup read only open rows (index-only with
-- the included columns), the failure counts only parked ones, and the retention job only
-- settled ones, oldest first.
DROP INDEX IF EXISTS reactor.hook_outbox_claim_idx;

CREATE INDEX IF NOT EXISTS hook_outbox_open_idx
    ON reactor.hook_outbox (available_at) INCLUDE (status, hook, created_at)
    WHERE status IN ('pending', 'running');

CREATE INDEX IF NOT EXISTS hook_outbox_failed_idx
    ON reactor.hook_outbox (updated_at)
    WHERE status = 'failed';

CREATE INDEX IF NOT EXISTS hook_outbox_settled_idx
    ON reactor.hook_outbox (updated_at)
    WHERE status IN ('done', 'superseded', 'cancelled');

-- Errors stored by earlier versions name the webhook URL whole, with any credentials and query
-- string it carries: keep scheme, host and path only.
UPDATE reactor.hook_outbox
   SET last_error = regexp_replace(
           regexp_replace(last_error, '([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s]*@', '\1', 'g'),
           '([A-Za-z][A-Za-z0-9+.-]*://[^?#\s]*)[?#]\S*', '\1', 'g')
 WHERE last_error LIKE '%://%';
