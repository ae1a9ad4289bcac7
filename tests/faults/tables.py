"""The app's two tables on one mapping, written as the app itself writes them.

The fault suite runs on the reference tables and on tests/mappings/second (every difference the
mapping covers at once: its own schema, quoted camelCase names, a bigint job id the database
assigns and a text run key, an enum status with other terminal values, timestamp(3) without
time zone holding UTC in a database whose TimeZone is not UTC, no soft delete, other saved_by
values, and NOT NULL columns of the app's own). The reactor reads either through the mapping;
the app does not know the mapping exists, and writes its tables in its own names and types with
:class:`reactor.testing.app.App`, so a scenario says once "a job finishes" or "a tab saves".

A test's own queries are written once too, with the mapping's slots (``@jobs@``, ``@r.key@``,
``@worker@``, ...) and the app's (``@doc@`` and ``@results@``, its two documents, ``@client@``,
the value a tab's save writes, and ``@now@``, the app's clock in its time columns), and
rendered by :meth:`Tables.render`.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import anyio
import psycopg
import psycopg.sql

from reactor import db
from reactor.install import mapping, mapping_file, sql
from reactor.install.mapping import Mapping, Terminal
from reactor.testing import audit
from reactor.testing.app import DOCUMENT, VERDICTS, App, JobId, RunKey

MAPPINGS = Path(__file__).resolve().parent.parent / "mappings"
# The reactor schema of a companion pair.
COMPANION_SCHEMA = "reactor_companion"


@cache
def _pair_files() -> Path:
    # Where the files naming each pair's schema go: made once per process, when first asked.
    return Path(tempfile.mkdtemp(prefix="reactor-pairs-"))


Conn = psycopg.Connection[Any]

DOC = DOCUMENT
RESULTS = VERDICTS
# The second's jobs belong to someone: "ownerId" is NOT NULL, and copied to its reports.
OWNER = "7f1c0b4e-2d7a-4d8e-9a51-0c6f3f1a2b3c"

__all__ = ["DOC", "OWNER", "RESULTS", "JobId", "RunKey", "Tables"]


def _literal(value: str) -> str:
    return psycopg.sql.Literal(value).as_string(None)


@dataclass(frozen=True)
class Tables:
    """One app's job and run tables: how to create them, and the app that writes them."""

    name: str
    ddl: str
    # REACTOR_CONFIG, for a mapping other than the reference.
    config: Path | None = None
    # The database's TimeZone, set on each database of these tables (None: the server's).
    time_zone: str | None = None
    # Job columns the app fills beside the mapped ones: (column, value).
    job_columns: tuple[tuple[str, str], ...] = ()
    # The database assigns a new job's id (an identity column).
    assigns_ids: bool = False
    # Typed by the catalog once installed (:meth:`install`); the file's until then.
    mapping: Mapping = mapping.REFERENCE
    # The schema of the reactor's objects for these tables; None: the file's (reactor).
    reactor_schema: str | None = None
    # The other pair the same replicas serve beside these tables (REACTOR_FAULT_PAIRS=2).
    companion: Tables | None = None

    @property
    def env(self) -> dict[str, str]:
        """What a reactor process needs in its environment for these tables (and their
        companion's)."""
        if self.companion is not None:
            return {"REACTOR_CONFIG": f"{self.pair_file()}:{self.companion.pair_file()}"}
        return {"REACTOR_CONFIG": str(self.config)} if self.config else {}

    def each(self) -> tuple[Tables, ...]:
        """These tables, and their companion's when they have one: the pairs a replica serves."""
        return (self,) if self.companion is None else (self, self.companion)

    def with_companion(self) -> Tables:
        """These tables, with the other mapping's served beside them by the same replicas: a
        second pair, in a reactor schema of its own."""
        other = SECOND if self.name == "reference" else REFERENCE
        return replace(self, companion=replace(other, reactor_schema=COMPANION_SCHEMA))

    def pair_file(self) -> Path:
        """A mapping file for these tables that names its reactor schema, as each of several
        files in REACTOR_CONFIG must."""
        path = _pair_files() / f"{self.name}-{self.loaded().reactor_schema}.toml"
        if not path.exists():
            text = self.config.read_text() if self.config else ""
            path.write_text(f'reactor_schema = "{self.loaded().reactor_schema}"\n{text}')
        return path

    def loaded(self) -> Mapping:
        """The mapping as its file says, in its reactor schema (untyped)."""
        loaded = mapping_file.load(str(self.config)) if self.config else mapping.REFERENCE
        if self.reactor_schema is not None:
            loaded = replace(loaded, reactor_schema=self.reactor_schema)
        return loaded

    @cached_property
    def app(self) -> App:
        """The app writing these tables."""
        own = tuple((column, _literal(value)) for column, value in self.job_columns)
        return App(self.mapping, own, assigns_ids=self.assigns_ids)

    # -- installing --------------------------------------------------------------------------

    def install(self, dsn: str) -> Tables:
        """Create the tables in the empty database ``dsn``, install the reactor as `reactor
        migrate` does, then the audit; returns these tables with the mapping typed."""
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(self.ddl)
        typed = self._migrate(dsn, spread=None)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(audit.ddl(typed))
        companion = None if self.companion is None else self.companion.install(dsn)
        return replace(self, mapping=typed, companion=companion)

    def migrate(self, dsn: str, *, spread: bool | None = None) -> Mapping:
        """`reactor migrate` (``--spread`` or ``--no-spread`` as ``spread`` says) at ``dsn``,
        for the companion too; returns the mapping typed."""
        if self.companion is not None:
            self.companion.migrate(dsn, spread=spread)
        return self._migrate(dsn, spread=spread)

    def _migrate(self, dsn: str, *, spread: bool | None) -> Mapping:
        loaded = self.loaded()

        async def migrate() -> Mapping:
            async with await db.connect(dsn, "test") as conn:
                return (await db.migrate(conn, loaded, spread=spread)).install.mapping

        return anyio.run(migrate, backend="asyncio")

    def adopt(self, conn: Conn) -> None:
        """Give the database ``conn`` is in the settings these tables (and their companion's)
        come with."""
        if self.companion is not None:
            self.companion.adopt(conn)
        if self.time_zone:
            conn.execute(
                "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET timezone = %L', "
                f"current_database(), {_literal(self.time_zone)}); END $$"
            )

    # -- names and values --------------------------------------------------------------------

    @property
    def results(self) -> str:
        """The verdicts' column: the document a job adds to as it runs."""
        return self.app.verdicts[0]

    @property
    def doc(self) -> str:
        """The report's column: the document a job has from its start."""
        return self.app.documents[0]

    @property
    def worker(self) -> str:
        return self.mapping.runs.worker

    @property
    def client(self) -> str:
        return self.app.client

    @property
    def soft_deletes(self) -> bool:
        """Whether the app soft-deletes jobs (the second mapping's app does not)."""
        return self.mapping.jobs.deleted_at is not None

    def render(self, text: str) -> str:
        """``text`` with the app's slots and the mapping's filled."""
        return self.app.render(text)

    def new_run(self) -> RunKey:
        """A run key as the app makes one."""
        return self.app.new_run()

    def nth_job(self, n: int) -> JobId:
        """The ``n``-th of a few job ids chosen in a known order."""
        return self.app.nth_job(n)

    def nth_run(self, n: int) -> RunKey:
        """The ``n``-th of a few run keys chosen in a known order."""
        return self.app.nth_run(n)

    def status(self, *, failed: bool = False) -> str | int:
        """A terminal status: the first the mapping names, or the other for a failed job."""
        return self.app.status(failed=failed)

    # -- the worker and the tabs, on a connection of the test's -----------------------------

    def add_job(
        self,
        conn: Conn,
        *,
        job: JobId | None = None,
        run: RunKey | None = None,
        finished: bool = False,
        failed: bool = False,
        running: Terminal | None = None,
        doc: str | None = DOC,
        results: str | None = None,
        created_age: float = 0.0,
        updated_age: float = 0.0,
    ) -> tuple[JobId, RunKey]:
        """Insert a job, running unless ``finished`` or ``failed`` (with ``results``), created
        and updated the given seconds ago; returns (job id, run key). ``running``: the status it
        runs in, where not the app's usual one (a queued job, say)."""
        app = self.app if running is None else replace(self.app, running=running)
        row = conn.execute(
            *app.create(
                [run if run is not None else app.new_run()],
                jobs=None if job is None else [job],
                document=doc,
                finished=finished,
                failed=failed,
                verdicts=results,
                created_age=created_age,
                updated_age=updated_age,
            )
        ).fetchone()
        assert row is not None
        return row[0], row[1]

    def finish(
        self, conn: Conn, *jobs: JobId, failed: bool = False, results: str = RESULTS, age: float = 0
    ) -> None:
        """The worker marks ``jobs`` terminal with their verdicts, ``age`` seconds ago."""
        conn.execute(*self.app.finish(*jobs, failed=failed, verdicts=results, age=age))

    def reopen(self, conn: Conn, *jobs: JobId, age: float = 0.0) -> None:
        """``jobs`` go back to running (a retry), ``age`` seconds ago."""
        conn.execute(*self.app.reopen(*jobs, age=age))

    def soft_delete(self, conn: Conn, *jobs: JobId) -> None:
        """The app hides ``jobs`` (only where it soft-deletes: :attr:`soft_deletes`)."""
        conn.execute(*self.app.soft_delete(*jobs))

    def delete(self, conn: Conn, *jobs: JobId) -> None:
        """The app deletes ``jobs`` for good."""
        conn.execute(*self.app.delete(*jobs))

    def client_save(self, conn: Conn, *jobs: JobId, legacy: bool = False) -> None:
        """The browser tab saves the runs of ``jobs``: the upsert that always wins."""
        conn.execute(*self.app.tab_save(*jobs, legacy=legacy))

    # -- reading -----------------------------------------------------------------------------

    def run_of(self, conn: Conn, job: JobId) -> RunKey:
        """The run key of ``job``."""
        row = conn.execute(*self.app.run_of(job)).fetchone()
        assert row is not None
        run: RunKey = row[0]
        return run

    def run_row(self, conn: Conn, run: RunKey) -> tuple[JobId, str | None] | None:
        """(job id, saved_by) of the run row of ``run``, or None."""
        row = conn.execute(*self.app.run_row(run)).fetchone()
        return None if row is None else (row[0], row[1])


REFERENCE = Tables("reference", sql.read("reference.sql"))
SECOND = Tables(
    "second",
    (MAPPINGS / "second.sql").read_text(),
    config=MAPPINGS / "second.toml",
    time_zone="Asia/Tokyo",
    job_columns=(("ownerId", OWNER),),
    assigns_ids=True,
)
# Django's one-to-one artifact: each export is its own run (tests/mappings/onetoone).
ONETOONE = Tables(
    "onetoone",
    (MAPPINGS / "onetoone.sql").read_text(),
    config=MAPPINGS / "onetoone.toml",
    job_columns=(("owner_id", "7"),),
    assigns_ids=True,
)
BY_NAME = {tables.name: tables for tables in (REFERENCE, SECOND, ONETOONE)}
