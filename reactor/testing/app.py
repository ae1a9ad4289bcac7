"""The app's side, written once: how the app itself writes its two tables, for any mapping.

The reactor never writes a job, nor a client's run. But ``reactor demo`` plays an app, and so do
the tests and the benchmarks; each plays it with :class:`App`, whose statements are the named
blocks of ``triggers/app.sql`` rendered in the app's own names, types and values (the mapping's).
A worker creates jobs, adds verdicts as they run, finishes, reopens, touches and deletes them; a
browser tab saves a run with the upsert that always wins.

An :class:`App` is pure: each method returns a :class:`Statement`, which any psycopg connection,
sync or async, executes as ``conn.execute(*statement)``. :meth:`App.fit` makes one of what the
catalog says beside the mapping (the job table's own NOT NULL columns, a status that is not
terminal: :mod:`.catalog` reads them), for an app whose tables the demo has never seen.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import psycopg

from reactor.install import sql
from reactor.install.mapping import Mapping, Terminal
from reactor.install.quote import identifier, literal
from reactor.testing.catalog import JSON_TYPES, read_fit

# What a job's documents hold by default: a document it starts with, and the verdicts it gets.
DOCUMENT = "<p>doc</p>"
VERDICTS = '{"verdicts": [1]}'

# The app's own slots (see triggers/app.sql); the mapping fills every other.
_APP_SLOT = re.compile(r"@(now|new_columns|new_values|verdicts|documents|running|doc|results)@")


class Statement(NamedTuple):
    """One statement of the app's and its parameters: ``conn.execute(*statement)``."""

    query: str
    params: dict[str, Any]


JobId = uuid.UUID | int | str
RunKey = uuid.UUID | int | str


@dataclass(frozen=True)
class App:
    """The app's writes to the tables ``mapping`` names (typed by the catalog).

    ``own_columns`` are the job table's own NOT NULL columns the app fills beside the mapped
    ones, as (column, SQL expression): an owner, say. ``assigns_ids``: the database gives a new
    job its id (an identity or a default); otherwise the app makes one. ``running`` is a status
    the app gives a job that is not terminal.
    """

    mapping: Mapping
    own_columns: tuple[tuple[str, str], ...] = ()
    assigns_ids: bool = False
    running: Terminal = "running"

    # -- what the mapping does not say ---------------------------------------------------------

    @classmethod
    async def fit(cls, conn: psycopg.AsyncConnection[Any], mapping: Mapping) -> App:
        """The app of the tables ``mapping`` names, with what the catalog says of them
        (:func:`.catalog.read_fit`)."""
        fit = await read_fit(conn, mapping)
        return cls(mapping, fit.own_columns, assigns_ids=fit.assigns_ids, running=fit.running)

    # -- values as the app makes them ----------------------------------------------------------

    @property
    def documents(self) -> tuple[str, ...]:
        """The document columns a job starts with: the not_null columns it is not judged by."""
        jobs = self.mapping.jobs
        return tuple(c for c in jobs.not_null if c not in jobs.not_empty)

    @property
    def verdicts(self) -> tuple[str, ...]:
        """The columns a job gathers its verdicts in as it runs (jobs.not_empty)."""
        return self.mapping.jobs.not_empty

    @property
    def client(self) -> str:
        """What a tab's save writes to saved_by."""
        return self.mapping.runs.client[0]

    def status(self, *, failed: bool = False) -> Terminal:
        """A terminal status: the first the mapping names, or the last for a failed job."""
        terminal = self.mapping.jobs.terminal
        return terminal[-1] if failed else terminal[0]

    def new_job(self) -> JobId | None:
        """A job id as the app makes one; None where the database assigns it."""
        if self.assigns_ids:
            return None
        return _fresh(self.mapping.jobs.id_type, "job")

    def new_run(self) -> RunKey:
        """A run key as the app makes one."""
        return _fresh(self.mapping.jobs.run_type, "report")

    def nth_job(self, n: int) -> JobId:
        """The ``n``-th of a few job ids chosen in a known order (PostgreSQL compares uuids as
        bytes and Python as integers: they agree)."""
        kind = self.mapping.jobs.id_type
        return uuid.UUID(int=n) if kind == "uuid" else f"job-{n:06d}" if kind == "text" else n

    def nth_run(self, n: int) -> RunKey:
        """The ``n``-th of a few run keys chosen in a known order."""
        kind = self.mapping.jobs.run_type
        return uuid.UUID(int=n) if kind == "uuid" else f"run-{n:06d}" if kind == "text" else n

    def empty(self, column: str) -> str:
        """What an empty verdict of ``column`` holds: nothing to show, so no run is needed."""
        return "{}" if self.mapping.jobs.type_of(column) in JSON_TYPES else ""

    # -- the worker ----------------------------------------------------------------------------

    def create(
        self,
        runs: Sequence[RunKey] = (),
        *,
        jobs: Sequence[JobId | None] | None = None,
        count: int = 1,
        document: str | None = DOCUMENT,
        finished: bool = False,
        failed: bool = False,
        verdicts: str | None = None,
        created_age: float = 0.0,
        updated_age: float = 0.0,
    ) -> Statement:
        """New jobs, running unless ``finished`` (``failed``: finished as failed jobs): one per
        run key of ``runs`` (``count`` fresh ones if none), created and updated the given
        seconds ago, each with ``document`` and ``verdicts``. Returns rows of (job id, run
        key). ``jobs`` gives their ids; by default the app makes them (or the database does,
        :attr:`assigns_ids`)."""
        runs = list(runs) or [self.new_run() for _ in range(count)]
        ids = list(jobs) if jobs is not None else [self.new_job() for _ in runs]
        if len(ids) != len(runs):
            raise ValueError("create: as many job ids as run keys")
        # Ids the database assigns are left out of the insert; ids given are written.
        named = any(job is not None for job in ids)
        params = {
            "jobs": ids,
            "runs": runs,
            "status": self.status(failed=failed) if finished or failed else self.running,
            "document": document,
            "verdicts": verdicts,
            "created": created_age,
            "updated": updated_age,
        }
        return Statement(self._statements["create" if named else "create_assigned"], params)

    def progress(self, *jobs: JobId, verdicts: str = VERDICTS) -> Statement:
        """Running ``jobs`` gather verdicts; their status stays."""
        return Statement(self._statements["progress"], {"jobs": list(jobs), "verdicts": verdicts})

    def finish(
        self, *jobs: JobId, failed: bool = False, verdicts: str | None = VERDICTS, age: float = 0.0
    ) -> Statement:
        """The worker marks ``jobs`` terminal with their ``verdicts`` (None: none at all),
        ``age`` seconds ago."""
        params = {
            "jobs": list(jobs),
            "status": self.status(failed=failed),
            "verdicts": verdicts,
            "age": age,
        }
        return Statement(self._statements["finish"], params)

    def reopen(self, *jobs: JobId, age: float = 0.0) -> Statement:
        """``jobs`` go back to running (a retry), ``age`` seconds ago."""
        return Statement(self._statements["reopen"], {"jobs": list(jobs), "age": age})

    def touch(self, *jobs: JobId, age: float = 0.0) -> Statement:
        """The app touches ``jobs``: their updated_at moves to ``age`` seconds ago."""
        return Statement(self._statements["touch"], {"jobs": list(jobs), "age": age})

    def redocument(self, *jobs: JobId, document: str | None) -> Statement:
        """``jobs``' documents become ``document`` (None: the app trimmed them)."""
        return Statement(self._statements["redocument"], {"jobs": list(jobs), "document": document})

    def soft_delete(self, *jobs: JobId) -> Statement:
        """The app hides ``jobs``: only where the mapping has a deleted_at column."""
        if self.mapping.jobs.deleted_at is None:
            raise ValueError(f"{self.mapping.jobs_shown} has no deleted_at: the app hard-deletes")
        return Statement(self._statements["soft_delete"], {"jobs": list(jobs)})

    def delete(self, *jobs: JobId) -> Statement:
        """The app deletes ``jobs`` for good."""
        return Statement(self._statements["delete"], {"jobs": list(jobs)})

    # -- the tab -------------------------------------------------------------------------------

    def tab_save(self, *jobs: JobId, legacy: bool = False) -> Statement:
        """A browser tab saves the runs of ``jobs``: what the reactor would write, as a client
        (NULL, a legacy row's saved_by, when ``legacy``)."""
        params = {"jobs": list(jobs), "by": None if legacy else self.client}
        return Statement(self._statements["tab_save"], params)

    # -- reading -------------------------------------------------------------------------------

    def run_of(self, job: JobId) -> Statement:
        """The run key of ``job``, one row."""
        return Statement(self._statements["run_of"], {"job": job})

    def run_row(self, run: RunKey) -> Statement:
        """(job id, saved_by) of ``run``'s run row; no row when there is none."""
        return Statement(self._statements["run_row"], {"run": run})

    def unsettled(self) -> Statement:
        """How many jobs need a run and have none, due or inside their grace."""
        return Statement(self._statements["unsettled"], {})

    # -- rendering -----------------------------------------------------------------------------

    def render(self, text: str, *, parameters: bool = False) -> str:
        """``text`` with the app's slots (see ``triggers/app.sql``) and the mapping's filled:
        for a test's own queries, in the app's names. ``parameters``: the text runs with
        psycopg parameters, so every ``%`` filled in is doubled (see :func:`sql.render`)."""

        def fill(match: re.Match[str]) -> str:
            return self._slot(match.group(1), parameters=parameters)

        return sql.render(_APP_SLOT.sub(fill, text), self.mapping, parameters=parameters)

    @cached_property
    def _statements(self) -> _Rendered:
        return _Rendered(self)

    def _slot(self, name: str, *, parameters: bool) -> str:
        # Names and values from the mapping have each % doubled for a statement that runs with
        # parameters; the placeholders this class writes itself stay as they are.
        def text(sql_text: str) -> str:
            return sql_text.replace("%", "%%") if parameters else sql_text

        jobs = self.mapping.jobs
        match name:
            case "now":
                return text(self._now(jobs.updated_at))
            case "running":
                running = self.running
                return str(running) if isinstance(running, int) else text(literal(running))
            case "doc":
                return text(identifier(self.documents[0]))
            case "results":
                return text(identifier(self.verdicts[0]))
            case "verdicts":
                # Each with its own comma: a mapping that judges by no verdicts has none.
                return "".join(
                    f", {text(identifier(c))} = %(verdicts)s::{text(jobs.type_of(c))}"
                    for c in self.verdicts
                )
            case "documents":
                return ", ".join(
                    f"{text(identifier(c))} = %(document)s::{text(jobs.type_of(c))}"
                    for c in self.documents
                )
            case "new_columns" | "new_values":
                raise KeyError(f"@{name}@ belongs to the create statement alone")
        raise KeyError(f"unknown slot @{name}@")

    def _create(self, *, with_id: bool) -> str:
        # The one statement whose column list depends on the call: with the job's id, or
        # without it where the database assigns it.
        new = list(self._new_job(with_id=with_id))
        text = sql.templates("app.sql")["create"]
        columns = ", ".join(identifier(c) for c, _ in new).replace("%", "%%")
        text = text.replace("@new_columns@", columns)
        # The values are this class's own SQL and placeholders: their % are meant.
        return self.render(
            text.replace("@new_values@", ", ".join(v for _, v in new)), parameters=True
        )

    def _new_job(self, *, with_id: bool) -> Iterator[tuple[str, str]]:
        jobs = self.mapping.jobs
        if with_id:
            yield jobs.id, "n.job"
        if not self.mapping.one_to_one:
            # Else the run key is the job's id, written above or assigned by the database.
            yield jobs.run, "n.run"
        yield jobs.status, "%(status)s"
        for column in self.documents:
            yield column, f"%(document)s::{jobs.type_of(column)}"
        for column in self.verdicts:
            yield column, f"%(verdicts)s::{jobs.type_of(column)}"
        times = ((jobs.created_at, "created"), (jobs.updated_at, "updated"))
        for time, age in times:
            if time is not None:
                yield time, f"{self._now(time)} - make_interval(secs => %({age})s)"
        # The app's own columns' SQL, written for a statement that runs with parameters.
        yield from ((column, value.replace("%", "%%")) for column, value in self.own_columns)

    def _now(self, column: str) -> str:
        jobs = self.mapping.jobs
        if jobs.naive(column):
            return f"(now() AT TIME ZONE {literal(jobs.time_zone or 'UTC')})"
        return "now()"


def _fresh(kind: str, prefix: str) -> uuid.UUID | int | str:
    # A new id of the type: 62 random bits for a bigint, as unlikely to collide as a uuid's 122
    # for the numbers of jobs an app plays.
    fresh = uuid.uuid4()
    if kind == "uuid":
        return fresh
    return fresh.int >> 66 if kind == "bigint" else f"{prefix}-{fresh.hex[:16]}"


class _Rendered(dict[str, str]):
    """The app's statements, each rendered on first use: a mapping without a soft delete has no
    soft_delete statement, and needs none."""

    def __init__(self, app: App) -> None:
        super().__init__()
        self._app = app

    def __missing__(self, name: str) -> str:
        if name in ("create", "create_assigned"):
            self[name] = self._app._create(with_id=name == "create")
        else:
            self[name] = self._app.render(sql.templates("app.sql")[name], parameters=True)
        return self[name]
