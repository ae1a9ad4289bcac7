-- Follow-up hooks (the judge, ops diagnosis) as a durable outbox: one row per recorded run and
-- configured hook, inserted by the same statement that writes the run, so a recorded run
-- without its hook rows cannot exist. Runners claim rows with a lease and SKIP LOCKED.
--
-- available_at is when a row may next be claimed: for a pending row, after its backoff; for a
-- running row, when its lease expires, so a replica killed mid-hook loses nothing.
CREATE TABLE IF NOT EXISTS reactor.hook_outbox (
    run_id        uuid NOT NULL,
    job_id        uuid NOT NULL,
    hook          text NOT NULL,
    status        text NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'running', 'done', 'failed')),
    attempts      integer NOT NULL DEFAULT 0,
    last_error    text,
    available_at  timestamptz NOT NULL DEFAULT now(),
    leased_until  timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, job_id, hook)
);

CREATE INDEX IF NOT EXISTS hook_outbox_claim_idx
    ON reactor.hook_outbox (available_at)
    WHERE status IN ('pending', 'running');
