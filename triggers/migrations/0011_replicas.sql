-- Who is live, so that the replicas split the work instead of all claiming every job. Each
-- replica upserts its row from its health check, every probe interval, and reads the live set
-- back in the same statement. A replica whose heartbeat is older than the liveness window has
-- died, frozen or lost the database: the others take its jobs over. A replica that stops cleanly
-- deletes its row; rows of replicas gone for an hour are deleted by the others' health checks.
CREATE TABLE IF NOT EXISTS reactor.replicas (
    id            text PRIMARY KEY,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now()
);
