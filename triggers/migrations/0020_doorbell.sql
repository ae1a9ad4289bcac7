-- The doorbell. A NOTIFY takes a lock for the whole cluster at commit and holds it through the
-- commit's WAL flush, so the app's notifying commits queue on it instead of sharing a flush.
-- While a replica polls the queue itself (under a stream of jobs it reads them by their
-- deadlines every poll interval), it keeps its channel's row here awake, and the job trigger
-- queues without notifying until awake_until. The row is a lease: a replica that stops or dies
-- renews it no more, and the app's commits notify again within a second.
--
-- Unlogged: renewing it writes no WAL and waits for no flush, and a crash, or a standby
-- promoted, leaves it empty, which is the safe state: no row, every job notifies.
CREATE UNLOGGED TABLE IF NOT EXISTS @reactor@.doorbell (
    channel      text PRIMARY KEY,
    awake_until  timestamptz NOT NULL
);
