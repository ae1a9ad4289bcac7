-- SQLAlchemy (as `metadata.create_all` emits it): BigInteger ids, a String status without a
-- CHECK (the values live in Python), DateTime(timezone=True) with server_default=func.now(),
-- a soft delete, and `JobResult.job_id` unique=True with a ForeignKey: a one-to-one
-- relationship(uselist=False). The result row has a saved_by column of its own.
CREATE TABLE jobs (
    id         BIGSERIAL NOT NULL,
    status     VARCHAR(32) NOT NULL,
    result     TEXT,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    deleted_at TIMESTAMP WITH TIME ZONE,
    PRIMARY KEY (id)
);

CREATE TABLE job_results (
    id       BIGSERIAL NOT NULL,
    job_id   BIGINT NOT NULL,
    result   TEXT NOT NULL,
    saved_by VARCHAR(16),
    PRIMARY KEY (id),
    UNIQUE (job_id),
    FOREIGN KEY (job_id) REFERENCES jobs (id)
);
