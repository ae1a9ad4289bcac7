-- The reactor keeps its own objects in one schema, and records each applied migration here.
CREATE SCHEMA IF NOT EXISTS reactor;

CREATE TABLE IF NOT EXISTS reactor.schema_version (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);
