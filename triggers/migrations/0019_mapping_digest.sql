-- What `reactor migrate` installed for the mapping: a digest of the functions, triggers and
-- indexes it rendered from the mapping file (reactor/db/drift.py). `reactor run` and `sweep`
-- refuse to start on a file that renders otherwise, and `status` reports it, until `reactor
-- migrate` re-installs them. NULL for an install from before this column: nothing to compare.
ALTER TABLE @reactor@.app_tables ADD COLUMN IF NOT EXISTS mapping_digest text;
