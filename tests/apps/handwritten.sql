-- Written by hand, like the reference: several tasks share a report (a re-analysis adds a task
-- for the same report), tasks.report_id names it without a foreign key (the report is written
-- after the task), and the report refers to the task it was written from. Its own schema; a
-- text state with a CHECK; a soft delete; the report's saved_by already there.
CREATE SCHEMA work;

CREATE TABLE work.tasks (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    report_id  uuid NOT NULL,
    state      text NOT NULL DEFAULT 'queued'
               CHECK (state IN ('queued', 'running', 'complete', 'failed')),
    body       text,
    findings   jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    deleted_at timestamptz
);
CREATE INDEX tasks_report_id_idx ON work.tasks (report_id);

CREATE TABLE work.reports (
    id         uuid PRIMARY KEY,
    task_id    uuid NOT NULL REFERENCES work.tasks (id),
    body       text,
    findings   jsonb NOT NULL,
    saved_by   text CHECK (saved_by IN ('client', 'worker')),
    updated_at timestamptz NOT NULL DEFAULT now()
);
