-- A replica's heartbeat names the session that wrote it when that session is the replica's own
-- LISTEN connection (a session no pooler shares). A killed replica's sessions end with its
-- process, within milliseconds, while its heartbeat stays fresh for seconds: the others read
-- pg_stat_activity and take its jobs over at their next check instead of when the heartbeat
-- ages out. A frozen or cut-off replica keeps its sessions; for it the heartbeat's age decides.
ALTER TABLE reactor.replicas ADD COLUMN IF NOT EXISTS session_pid integer;
