-- Rails: `Export has_one :export_report`, the report's export_id unique (add_index ...,
-- unique: true) with a foreign key; `enum status: { queued: 0, running: 1, done: 2, failed: 3 }`
-- stores an integer; t.timestamps makes created_at/updated_at timestamp(6) without time zone,
-- NOT NULL, set by Active Record in UTC.
CREATE TABLE exports (
    id         bigserial PRIMARY KEY,
    status     integer NOT NULL DEFAULT 0,
    payload    jsonb,
    created_at timestamp(6) without time zone NOT NULL,
    updated_at timestamp(6) without time zone NOT NULL
);

CREATE TABLE export_reports (
    id         bigserial PRIMARY KEY,
    export_id  bigint NOT NULL,
    payload    jsonb NOT NULL,
    created_at timestamp(6) without time zone NOT NULL,
    updated_at timestamp(6) without time zone NOT NULL,
    CONSTRAINT fk_rails_5c0e4a6f1b FOREIGN KEY (export_id) REFERENCES exports (id)
);
CREATE UNIQUE INDEX index_export_reports_on_export_id ON export_reports (export_id);
