-- A running hook row's lease named no replica, so when its replica died the row waited for the
-- lease to run out: the hook's timeout plus 30 s, 150 s at the defaults, although the others
-- know a killed replica is dead within a probe interval (its LISTEN session is gone). The
-- lease now names its holder, and the health check of any live replica hands back the running
-- rows of a replica it no longer counts as live (see the health query); the lease stays the
-- backstop for a replica that froze.
ALTER TABLE @reactor@.hook_outbox ADD COLUMN IF NOT EXISTS leased_by text;
