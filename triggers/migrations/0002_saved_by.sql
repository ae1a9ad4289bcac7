-- Which writer saved a run decides who may overwrite it. Apps that predate the reactor lack the
-- column; their existing rows stay NULL, which counts as a client save.
ALTER TABLE analysis_runs
    ADD COLUMN IF NOT EXISTS saved_by text CHECK (saved_by IN ('client', 'worker'));
