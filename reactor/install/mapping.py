"""The mapping: which of the app's tables, columns and values the reactor reads and writes.

``REACTOR_CONFIG`` names a TOML file (DESIGN.md §2), or several (:mod:`reactor.settings.pairs`);
without one the reactor runs on the reference mapping, ``analysis_jobs``/``analysis_runs``. Parsing
(:mod:`reactor.install.mapping_file`) is pure and validates every key, so the rest of the code can
trust a :class:`Mapping`. The catalog adds what the file does not say (the columns' types, the
artifact's sequences) before any SQL.

Every statement the reactor sends or installs is written once, in ``triggers/``, with named
slots (``@jobs@``, ``@j.updated_at@``, ``@eligible(j)@``); :meth:`Mapping.slot` fills one. Names
and values are quoted by ``psycopg.sql``; the ``[runs.columns]`` expressions are the only SQL
taken from the file, written by whoever runs ``reactor migrate``, which checks they compile.

A mapping is a value: a command resolves it once, with the catalog, into an install
(:mod:`reactor.install`) that every room is given; nothing here is process state.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field, replace

from reactor.core.ownership import share_sql
from reactor.install.quote import identifier, literal

CONFIG_VARIABLE = "REACTOR_CONFIG"

# A status value as the file gives it: a string (text, varchar, an enum's label) or an integer.
Terminal = str | int

# The id types whose values keep one text form from the database to a notification and back.
ID_TYPES = ("uuid", "bigint", "text")
# The least value of each, where the reconcile's walk starts: its key compares as (run, id) >.
_LEAST = {
    "uuid": "00000000-0000-0000-0000-000000000000",
    "bigint": "-9223372036854775808",
    "text": "",
}


@dataclass(frozen=True)
class Jobs:
    """``[jobs]``: the app's job table, the truth the reactor reads."""

    # Always schema-qualified: a name the file gives bare is in public (parse).
    table: tuple[str, ...] = ("public", "analysis_jobs")
    id: str = "id"
    run: str = "run_id"
    status: str = "status"
    # Strings for a text or enum status, integers for an integer one (db.fit checks which).
    terminal: tuple[Terminal, ...] = ("complete", "failed")
    updated_at: str = "updated_at"
    # None only where each job is its own run (Mapping.one_to_one): nothing to order.
    created_at: str | None = "created_at"
    deleted_at: str | None = "deleted_at"
    not_null: tuple[str, ...] = ("doc_html", "results")
    not_empty: tuple[str, ...] = ("results",)
    time_zone: str | None = None
    # From the catalog (Mapping.typed), not the file: each mapped column's type, as
    # format_type() names it. The reference schema's until then.
    types: tuple[tuple[str, str], ...] = (
        ("id", "uuid"),
        ("run_id", "uuid"),
        ("status", "text"),
        ("updated_at", "timestamp with time zone"),
        ("created_at", "timestamp with time zone"),
        ("deleted_at", "timestamp with time zone"),
        ("doc_html", "text"),
        ("results", "jsonb"),
    )

    def type_of(self, column: str) -> str:
        return dict(self.types).get(column, "text")

    @property
    def id_type(self) -> str:
        return self.type_of(self.id)

    @property
    def run_type(self) -> str:
        return self.type_of(self.run)

    def naive(self, column: str) -> bool:
        """Whether ``column`` is a timestamp without time zone (read AT TIME ZONE time_zone)."""
        return self.type_of(column) == "timestamp without time zone"


@dataclass(frozen=True)
class Runs:
    """``[runs]``: the artifact table, which the app's fast path and the reactor both write."""

    table: tuple[str, ...] = ("public", "analysis_runs")
    key: str = "id"
    job: str = "job_id"
    saved_by: str = "saved_by"
    client: tuple[str, ...] = ("client",)
    worker: str = "worker"
    # Run column = SQL expression over the job row j, in the order written (the reference's
    # updated_at is set on a replacement too, as an upsert's own update would).
    columns: tuple[tuple[str, str], ...] = (
        ("doc_html", "j.doc_html"),
        ("results", "j.results"),
        ("updated_at", "now()"),
    )
    # How the app saves its own rows (docs/mapping.md, The app's own save): "upsert", with the
    # upsert that marks itself as the client, or "plain", as it would without the reactor: a
    # plain INSERT, an ORM's create, over a row the reactor wrote (triggers/app_saves.sql).
    app_saves: str = "upsert"
    # From the catalog (db.fit), not the file: the sequences (schema, name) that the defaults of
    # the columns left unwritten draw from (a serial key's); the runtime role needs USAGE on each.
    sequences: tuple[tuple[str, str], ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Mapping:
    """The whole mapping; :data:`REFERENCE` is the default."""

    jobs: Jobs = field(default_factory=Jobs)
    runs: Runs = field(default_factory=Runs)
    reactor_schema: str = "reactor"
    # Where it came from, for messages: the file's path, or None for the reference.
    source: str | None = field(default=None, compare=False)

    @property
    def is_reference(self) -> bool:
        """Whether it names the reference tables and columns (whatever types it was given)."""
        jobs = replace(self.jobs, types=Jobs().types)
        # How the app saves names nothing: the reference tables keep their channel either way.
        runs = replace(self.runs, app_saves=Runs().app_saves)
        return jobs == Jobs() and runs == Runs() and self.reactor_schema == "reactor"

    def typed(self, types: dict[str, str]) -> Mapping:
        """This mapping with the job columns' types as the catalog reported them."""
        return replace(self, jobs=replace(self.jobs, types=tuple(sorted(types.items()))))

    @property
    def one_to_one(self) -> bool:
        """Whether each job is its own run (``jobs.run`` names the job's id): the artifact is
        keyed by the job's id, and no two jobs share a run, so none is ever re-analysed."""
        return self.jobs.run == self.jobs.id

    @property
    def default_channel(self) -> str:
        """The NOTIFY channel when REACTOR_CHANNEL is unset: each reactor schema its own, so
        that two sidecars in one database do not hear each other's jobs. The reference pair
        keeps the name it always had; any other mapping's is named after its reactor schema."""
        if self.is_reference:
            return "analysis_jobs_terminal"
        return f"{self.reactor_schema}_jobs_terminal"[:63]

    @property
    def jobs_shown(self) -> str:
        """The job table as messages name it."""
        return _shown(self.jobs.table)

    @property
    def runs_shown(self) -> str:
        """The artifact table as messages name it."""
        return _shown(self.runs.table)

    def in_public(self) -> Mapping:
        """This mapping with unqualified table names taken to be in the schema public."""
        jobs = replace(self.jobs, table=qualified(self.jobs.table))
        return replace(self, jobs=jobs, runs=replace(self.runs, table=qualified(self.runs.table)))

    def named(self) -> tuple[tuple[str, str], ...]:
        """Every name and value of the mapping that the rendered SQL quotes, as (the key that
        gives it, its text): tables, columns, and the status and saved_by values. Not the
        [runs.columns] expressions, which are SQL."""
        jobs, runs = self.jobs, self.runs
        found = [("reactor_schema", self.reactor_schema), ("jobs.table", ".".join(jobs.table))]
        for key in ("id", "run", "status", "updated_at", "created_at", "deleted_at", "time_zone"):
            value = getattr(jobs, key)
            if value is not None:
                found.append((f"jobs.{key}", value))
        found += [("jobs.not_null", name) for name in jobs.not_null]
        found += [("jobs.not_empty", name) for name in jobs.not_empty]
        found += [("jobs.terminal", value) for value in jobs.terminal if isinstance(value, str)]
        found.append(("runs.table", ".".join(runs.table)))
        found += [(f"runs.{key}", getattr(runs, key)) for key in ("key", "job", "saved_by")]
        found += [("runs.client", value) for value in runs.client]
        found.append(("runs.worker", runs.worker))
        found += [("[runs.columns]", column) for column, _ in runs.columns]
        return tuple(found)

    def slot(self, name: str, alias: str | None, argument: str | None) -> str:
        """The SQL for one slot of a template: ``@name@``, ``@alias.name@`` or ``@name(arg)@``."""
        if argument is not None:
            return self._function(name, argument)
        if alias is not None:
            return self._column(name, alias)
        return self._value(name)

    def _value(self, name: str) -> str:
        jobs, runs = self.jobs, self.runs
        match name:
            case "reactor":
                # Validated as a plain lower-case identifier: safe bare, readable in --print.
                return self.reactor_schema
            case "reactor_name":
                return literal(self.reactor_schema)
            case "audit" | "audit_write" | "audit_index":
                # reactor.testing.audit's objects: the pair's own, so that two pairs of one database
                # are counted apart.
                own = "" if self.reactor_schema == "reactor" else f"{self.reactor_schema}_"
                suffix = {"audit": "", "audit_write": "_write", "audit_index": "_run_idx"}[name]
                return identifier(f"{own}run_audit{suffix}")
            case "jobs":
                return identifier(*jobs.table)
            case "runs":
                return identifier(*runs.table)
            case "jobs_name":
                return literal(identifier(*jobs.table))
            case "runs_name":
                return literal(identifier(*runs.table))
            case "job_type":
                return jobs.id_type
            case "run_type":
                return jobs.run_type
            case "least_job":
                return f"{literal(_LEAST[jobs.id_type])}::{jobs.id_type}"
            case "least_run":
                return f"{literal(_LEAST[jobs.run_type])}::{jobs.run_type}"
            case "jobs_table_name":
                return literal(jobs.table[-1])
            case "jobs_schema_name":
                return literal(jobs.table[0])
            case "runs_table_name":
                return literal(runs.table[-1])
            case "runs_schema_name":
                return literal(runs.table[0])
            case "terminal":
                return "(" + ", ".join(_status_literal(value) for value in jobs.terminal) + ")"
            case "worker":
                return literal(runs.worker)
            case "saved_by_values":
                values = (*runs.client, runs.worker)
                return "(" + ", ".join(literal(value) for value in values) + ")"
            case "run_columns":
                written = (*self._run_keys, runs.saved_by, *(c for c, _ in runs.columns))
                return ", ".join(identifier(c) for c in written)
            case "run_values":
                # Each with its leading comma, after the reactor's own columns: a mapping whose
                # [runs.columns] is empty writes those alone.
                return "".join(f", {value_of(expression)}" for _, expression in runs.columns)
            case "client":
                return literal(runs.client[0])
            case "run_updates":
                # Every written column but saved_by, which each writer sets to its own value,
                # and the key, which the conflict found equal. A one-to-one artifact whose
                # columns are all the reactor's own sets its key to itself: SET needs one.
                updated = (*self._run_keys[1:], *(c for c, _ in runs.columns)) or (runs.key,)
                return ",\n           ".join(
                    f"{identifier(c)} = EXCLUDED.{identifier(c)}" for c in updated
                )
        column = self._logical_column(name)
        if column is None:
            raise KeyError(f"unknown slot @{name}@")
        return identifier(column)

    @property
    def _run_keys(self) -> tuple[str, ...]:
        # The run key, then the job: one column when the artifact is keyed by the job's id.
        return tuple(dict.fromkeys((self.runs.key, self.runs.job)))

    def _logical_column(self, name: str) -> str | None:
        jobs, runs = self.jobs, self.runs
        columns = {
            "id": jobs.id,
            "run": jobs.run,
            "status": jobs.status,
            "updated_at": jobs.updated_at,
            "created_at": jobs.created_at,
            "deleted_at": jobs.deleted_at,
            "key": runs.key,
            "job": runs.job,
            "saved_by": runs.saved_by,
        }
        if name not in columns:
            return None
        column = columns[name]
        if column is None:
            raise KeyError(f"slot @{name}@ names a column the mapping leaves out")
        return column

    def _column(self, name: str, alias: str) -> str:
        column = self._logical_column(name)
        if column is None:
            raise KeyError(f"unknown slot @{alias}.{name}@")
        qualified = f"{alias}.{identifier(column)}"
        if name in ("updated_at", "created_at", "deleted_at") and self.jobs.naive(column):
            # The app writes these as wall-clock time in time_zone; read as instants.
            return f"({qualified} AT TIME ZONE {literal(self.jobs.time_zone or 'UTC')})"
        return qualified

    def _function(self, name: str, alias: str) -> str:
        if name == "eligible":
            return self.eligible(alias or None)
        if name == "walked":
            return self.walked(alias or None)
        if name == "keys":
            # Row alias's run_id and id as the artifact's key columns take them (_run_keys).
            return f"{alias}.run_id" + ("" if len(self._run_keys) == 1 else f", {alias}.id")
        # Which of two jobs of one run is the later (rank), by created_at, ties broken by id;
        # where each job is its own run created_at may be left out: none to rank against.
        created = None if self.jobs.created_at is None else self._column("created_at", alias)
        if name == "rank":
            return f"({', '.join(filter(None, (created, self._column('id', alias))))})"
        if name == "created":
            return created or "NULL::timestamptz"
        if name == "share":
            return share_sql(f"{alias}.{identifier(self.jobs.id)}")
        if name == "queued_share":
            # The same share, of a row of the reactor's own queue (its job_id column).
            return share_sql(f"{alias}.job_id")
        if name == "bytes":
            sizes = [
                _size(f"{alias}.{identifier(c)}", self.jobs.type_of(c)) for c in self.jobs.not_null
            ]
            return "(" + " + ".join(sizes or ["0"]) + ")"
        raise KeyError(f"unknown slot @{name}({alias})@")

    def walked(self, alias: str | None) -> str:
        """The part of :meth:`eligible` the reconcile's walk index holds: the soft delete and
        the documents, columns the app sets when it creates a job and changes at most once
        more (a delete, a trim). The status stays out, so the update that finishes a job can
        be HOT, and so do the not_empty columns (verdicts the app adds to as a job runs), so
        that the progress updates can be too. ``true`` when there is no such column."""
        return self._predicate(alias, whole=False)

    def eligible(self, alias: str | None) -> str:
        """The row-local half of "needs a run" for the job row ``alias`` (None: bare columns).

        Terminal values are untyped literals, so they take the column's type, text or enum.
        """
        return self._predicate(alias, whole=True)

    def _predicate(self, alias: str | None, *, whole: bool) -> str:
        jobs = self.jobs

        def col(name: str) -> str:
            return f"{alias}.{identifier(name)}" if alias else identifier(name)

        parts = [f"{col(jobs.status)} IN {self._value('terminal')}"] if whole else []
        if jobs.deleted_at:
            parts.append(f"{col(jobs.deleted_at)} IS NULL")
        for column in jobs.not_null:
            if whole or column not in jobs.not_empty:
                parts.append(f"{col(column)} IS NOT NULL")
        if whole:
            parts += [_not_empty(col(c), jobs.type_of(c)) for c in jobs.not_empty]
        return "(" + "\n     AND ".join(parts) + ")" if parts else "true"


REFERENCE = Mapping()

# Unicode's control characters (C0, DEL, C1: \n, \r, \t, ESC, NEL, ...) and its line and
# paragraph separators.
_UNSHOWABLE = frozenset({"Cc", "Zl", "Zp"})


def unshowable(mapping: Mapping) -> tuple[str, str, str] | None:
    """The first name or value of ``mapping`` (:meth:`Mapping.named`) that holds a control
    character or a line break, as (key, text, the character); None when none does.

    PostgreSQL takes any character but NUL in a quoted name, and quoted, such a name is inert
    where the reactor's SQL runs. But a comment of the SQL that `reactor migrate --print` writes
    for psql, a one-line message or a log line that showed one would end at its line break,
    and what follows would be read as something else (SQL after the comment, a second
    message); an escape sequence rewrites what a terminal shows. No app needs one in a table or
    column name: the reactor refuses them all, before it renders anything."""
    for key, text in mapping.named():
        for char in text:
            if unicodedata.category(char) in _UNSHOWABLE:
                return key, text, char
    return None


def value_of(expression: str) -> str:
    """A ``[runs.columns]`` expression as the statements use it, and as ``reactor migrate``
    checks it: in parentheses, so that what is checked is what runs (a subquery, a row or an
    alias would read one way alone and another in a select list)."""
    return f"({expression})"


def _status_literal(value: Terminal) -> str:
    # An integer bare, so that it compares with an integer column as one; a string untyped, so
    # that it takes the column's type, text or enum.
    return str(value) if isinstance(value, int) else literal(value)


def _size(column: str, type_name: str) -> str:
    # What writing it costs: octet_length reads a TOASTed text's raw length from its header,
    # where pg_column_size would give its compressed size.
    if type_name in ("text", "character varying", "bytea"):
        return f"coalesce(octet_length({column}), 0)"
    return f"coalesce(pg_column_size({column}), 0)"


def _shown(table: tuple[str, ...]) -> str:
    return table[-1] if table[0] == "public" else ".".join(table)


def qualified(table: tuple[str, ...]) -> tuple[str, ...]:
    """``table`` schema-qualified: a bare name is in the schema public."""
    return table if len(table) == 2 else ("public", *table)


def _not_empty(column: str, type_name: str) -> str:
    # By the column's own equality, so a TOASTed document is compared, never cast to text.
    if type_name == "jsonb":
        return f"{column} <> '{{}}'::jsonb"
    if type_name in ("json", "xml"):
        return f"{column}::text NOT IN ('', '{{}}', '[]')"
    if type_name.endswith("[]"):
        return f"cardinality({column}) > 0"
    return f"{column} <> ''"
