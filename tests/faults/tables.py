"""The app's two tables on one mapping, written as the app itself writes them.

The fault suite runs on the reference tables and on tests/mappings/second (every difference the
mapping covers at once: its own schema, quoted camelCase names, a bigint job id the database
assigns and a text run key, an enum status with other terminal values, timestamp(3) without
time zone holding UTC in a database whose TimeZone is not UTC, no soft delete, other saved_by
values, and NOT NULL columns of the app's own). The reactor reads either through the mapping;
the app does not know the mapping exists, and writes its tables in its own names and types,
which :class:`Tables` knows, so a scenario says once "a job finishes" or "a tab saves".

A test's own queries are written once too, with the mapping's slots (``@jobs@``, ``@r.key@``,
``@worker@``, ...) and four of the app's (``@doc@`` and ``@results@``, its two documents,
``@client@``, the value a tab's save writes, and ``@now@``, the app's clock in its time
columns), and rendered by :meth:`Tables.render`.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import psycopg
import psycopg.sql

from reactor import audit, db, mapping, sql
from reactor.mapping import Mapping

MAPPINGS = Path(__file__).resolve().parent.parent / "mappings"
Conn = psycopg.Connection[Any]
# A job id (uuid on the reference, bigint on the second) and a run key (uuid, or text).
JobId = uuid.UUID | int
RunKey = uuid.UUID | str

DOC = "<p>doc</p>"
RESULTS = '{"verdicts": [1]}'
# The second's jobs belong to someone: "ownerId" is NOT NULL, and copied to its reports.
OWNER = "7f1c0b4e-2d7a-4d8e-9a51-0c6f3f1a2b3c"

_APP_SLOT = re.compile(r"@(doc|results|client|now)@")


def _identifier(name: str) -> str:
    return psycopg.sql.Identifier(name).as_string(None)


def _literal(value: str) -> str:
    return psycopg.sql.Literal(value).as_string(None)


@dataclass(frozen=True)
class Tables:
    """One app's job and run tables: how to create them, and how the app writes them."""

    name: str
    ddl: str
    # REACTOR_CONFIG, for a mapping other than the reference.
    config: Path | None = None
    # The database's TimeZone, set on each database of these tables (None: the server's).
    time_zone: str | None = None
    # Job columns the app fills beside the mapped ones: (column, value).
    job_columns: tuple[tuple[str, str], ...] = ()
    # Typed by the catalog once installed (:meth:`install`); the file's until then.
    mapping: Mapping = mapping.REFERENCE

    @property
    def env(self) -> dict[str, str]:
        """What a reactor process needs in its environment for these tables."""
        return {"REACTOR_CONFIG": str(self.config)} if self.config else {}

    # -- installing --------------------------------------------------------------------------

    def install(self, dsn: str) -> Tables:
        """Create the tables in the empty database ``dsn``, install the reactor as `reactor
        migrate` does, then the audit; returns these tables with the mapping typed."""
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(self.ddl)
        loaded = mapping.load(str(self.config)) if self.config else mapping.REFERENCE

        async def migrate() -> Mapping:
            async with await db.connect(dsn, "test") as conn:
                await db.migrate(conn, loaded.default_channel, reference_schema=False)
            return mapping.in_force()

        with mapping.using(loaded):
            typed = anyio.run(migrate, backend="asyncio")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(audit.ddl(typed))
        return replace(self, mapping=typed)

    def adopt(self, conn: Conn) -> None:
        """Give the database ``conn`` is in the settings these tables come with."""
        if self.time_zone:
            conn.execute(
                "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET timezone = %L', "
                f"current_database(), {_literal(self.time_zone)}); END $$"
            )

    # -- names and values --------------------------------------------------------------------

    @property
    def results(self) -> str:
        """The verdicts' column: the document a job adds to as it runs."""
        return self.mapping.jobs.not_empty[0]

    @property
    def doc(self) -> str:
        """The report's column: the document a job has from its start."""
        jobs = self.mapping.jobs
        return next(c for c in jobs.not_null if c not in jobs.not_empty)

    @property
    def worker(self) -> str:
        return self.mapping.runs.worker

    @property
    def client(self) -> str:
        return self.mapping.runs.client[0]

    @property
    def soft_deletes(self) -> bool:
        """Whether the app soft-deletes jobs (the second mapping's app does not)."""
        return self.mapping.jobs.deleted_at is not None

    @property
    def _results_type(self) -> str:
        return self.mapping.jobs.type_of(self.results)

    def render(self, text: str) -> str:
        """``text`` with the app's slots and the mapping's filled."""
        jobs = self.mapping.jobs

        def fill(match: re.Match[str]) -> str:
            match match.group(1):
                case "doc":
                    return _identifier(self.doc)
                case "results":
                    return _identifier(self.results)
                case "client":
                    return _literal(self.client)
            if jobs.naive(jobs.updated_at):
                return f"(now() AT TIME ZONE {_literal(jobs.time_zone or 'UTC')})"
            return "now()"

        return sql.render(_APP_SLOT.sub(fill, text), self.mapping)

    def new_run(self) -> RunKey:
        """A run key as the app makes one."""
        if self.mapping.jobs.run_type == "uuid":
            return uuid.uuid4()
        return f"report-{uuid.uuid4().hex[:16]}"

    def nth_job(self, n: int) -> JobId:
        """The ``n``-th of a few job ids chosen in a known order (PostgreSQL compares uuids as
        bytes and Python as integers: they agree)."""
        return uuid.UUID(int=n) if self.mapping.jobs.id_type == "uuid" else n

    def nth_run(self, n: int) -> RunKey:
        """The ``n``-th of a few run keys chosen in a known order."""
        return uuid.UUID(int=n) if self.mapping.jobs.run_type == "uuid" else f"run-{n:06d}"

    def status(self, *, failed: bool = False) -> str:
        """A terminal status: the first the mapping names, or the second for a failed job."""
        return self.mapping.jobs.terminal[1 if failed else 0]

    # -- the worker --------------------------------------------------------------------------

    def add_job(
        self,
        conn: Conn,
        *,
        job: JobId | None = None,
        run: RunKey | None = None,
        finished: bool = False,
        doc: str = DOC,
        results: str | None = None,
        created_age: float = 0.0,
        updated_age: float = 0.0,
    ) -> tuple[JobId, RunKey]:
        """Insert a job, running unless ``finished`` (``results`` as JSON text), created and
        updated the given seconds ago; returns (job id, run key). The job id is the app's own
        uuid, or what the database assigns (an identity column), unless ``job`` is given."""
        if job is None and self.mapping.jobs.id_type == "uuid":
            job = uuid.uuid4()
        run = self.new_run() if run is None else run
        jobs = self.mapping.jobs
        columns = [jobs.run, jobs.status, self.doc, self.results, jobs.created_at, jobs.updated_at]
        values = [
            "%(run)s",
            "%(status)s",
            "%(doc)s",
            f"%(results)s::{self._results_type}",
            "@now@ - make_interval(secs => %(created)s)",
            "@now@ - make_interval(secs => %(updated)s)",
        ]
        if job is not None:
            columns.insert(0, jobs.id)
            values.insert(0, "%(job)s")
        params: dict[str, Any] = {
            "job": job,
            "run": run,
            "status": self.status() if finished else "running",
            "doc": doc,
            "results": results,
            "created": created_age,
            "updated": updated_age,
        }
        for column, value in self.job_columns:
            columns.append(column)
            values.append(f"%({column})s")
            params[column] = value
        names = ", ".join(_identifier(c) for c in columns)
        text = f"INSERT INTO @jobs@ ({names}) VALUES ({', '.join(values)}) RETURNING @id@"
        row = conn.execute(self.render(text), params).fetchone()
        assert row is not None
        return row[0], run

    def finish(
        self, conn: Conn, *jobs: JobId, failed: bool = False, results: str = RESULTS, age: float = 0
    ) -> None:
        """The worker marks ``jobs`` terminal with their verdicts, ``age`` seconds ago."""
        conn.execute(
            self.render(
                f"UPDATE @jobs@ SET @status@ = %s, @results@ = %s::{self._results_type},"
                " @updated_at@ = @now@ - make_interval(secs => %s) WHERE @id@ = ANY(%s)"
            ),
            (self.status(failed=failed), results, age, list(jobs)),
        )

    def reopen(self, conn: Conn, *jobs: JobId, age: float = 0.0) -> None:
        """``jobs`` go back to running (a retry), ``age`` seconds ago."""
        conn.execute(
            self.render(
                "UPDATE @jobs@ SET @status@ = 'running',"
                " @updated_at@ = @now@ - make_interval(secs => %s) WHERE @id@ = ANY(%s)"
            ),
            (age, list(jobs)),
        )

    def soft_delete(self, conn: Conn, *jobs: JobId) -> None:
        """The app hides ``jobs`` (only where it soft-deletes: :attr:`soft_deletes`)."""
        assert self.soft_deletes, f"the {self.name} app does not soft-delete"
        conn.execute(
            self.render("UPDATE @jobs@ SET @deleted_at@ = @now@ WHERE @id@ = ANY(%s)"),
            (list(jobs),),
        )

    def delete(self, conn: Conn, *jobs: JobId) -> None:
        """The app deletes ``jobs`` for good."""
        conn.execute(self.render("DELETE FROM @jobs@ WHERE @id@ = ANY(%s)"), (list(jobs),))

    # -- the tabs ----------------------------------------------------------------------------

    def client_save(self, conn: Conn, *jobs: JobId, legacy: bool = False) -> None:
        """The browser tab saves the runs of ``jobs``: the upsert that always wins, writing
        what the reactor would write for them, as a client (NULL, a legacy row's saved_by,
        when ``legacy``)."""
        runs = self.mapping.runs
        updated = [runs.job, *(c for c, _ in runs.columns), runs.saved_by]
        sets = ", ".join(f"{_identifier(c)} = EXCLUDED.{_identifier(c)}" for c in updated)
        conn.execute(
            self.render(
                "INSERT INTO @runs@ (@run_columns@)"
                " SELECT @j.run@, @j.id@, %(by)s, @run_values@ FROM @jobs@ j"
                " WHERE @j.id@ = ANY(%(jobs)s)"
                f" ON CONFLICT (@key@) DO UPDATE SET {sets}"
            ),
            {"by": None if legacy else self.client, "jobs": list(jobs)},
        )

    # -- reading -----------------------------------------------------------------------------

    def run_of(self, conn: Conn, job: JobId) -> RunKey:
        """The run key of ``job``."""
        row = conn.execute(
            self.render("SELECT @run@ FROM @jobs@ WHERE @id@ = %s"), (job,)
        ).fetchone()
        assert row is not None
        run: RunKey = row[0]
        return run

    def run_row(self, conn: Conn, run: RunKey) -> tuple[JobId, str | None] | None:
        """(job id, saved_by) of the run row of ``run``, or None."""
        row = conn.execute(
            self.render("SELECT @job@, @saved_by@ FROM @runs@ WHERE @key@ = %s"), (run,)
        ).fetchone()
        return None if row is None else (row[0], row[1])


REFERENCE = Tables("reference", sql.read("reference.sql"))
SECOND = Tables(
    "second",
    (MAPPINGS / "second.sql").read_text(),
    config=MAPPINGS / "second.toml",
    time_zone="Asia/Tokyo",
    job_columns=(("ownerId", OWNER),),
)
BY_NAME = {tables.name: tables for tables in (REFERENCE, SECOND)}
