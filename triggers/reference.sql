-- The application's two tables, as DESIGN.md describes them. Real apps have more columns; the
-- reactor only reads and writes the ones below. `reactor migrate --reference-schema` creates them
-- when they are missing, for demos, tests and new projects.

CREATE TABLE IF NOT EXISTS analysis_jobs (
    id          uuid PRIMARY KEY,
    run_id      uuid NOT NULL,
    status      text NOT NULL,            -- 'queued' | 'running' | 'complete' | 'failed'
    doc_html    text,
    results     jsonb,
    deleted_at  timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS analysis_runs (
    id          uuid PRIMARY KEY,         -- = analysis_jobs.run_id
    job_id      uuid NOT NULL,
    doc_html    text,
    results     jsonb NOT NULL,
    saved_by    text CHECK (saved_by IN ('client', 'worker')),  -- NULL: a legacy row, counts as client
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
