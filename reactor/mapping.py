"""The mapping: which of the app's tables, columns and values the reactor reads and writes.

``REACTOR_CONFIG`` names a TOML file (DESIGN.md §2), or several (:mod:`reactor.pairs`); without
one the reactor runs on the reference mapping, ``analysis_jobs``/``analysis_runs``. Parsing is
pure and validates every key, so the rest of the code can trust a :class:`Mapping`. The catalog
adds what the file does not say (the columns' types, the artifact's sequences) before any SQL.

Every statement the reactor sends or installs is written once, in ``triggers/``, with named
slots (``@jobs@``, ``@j.updated_at@``, ``@eligible(j)@``); :meth:`Mapping.slot` fills one. Names
and values are quoted by ``psycopg.sql``; the ``[runs.columns]`` expressions are the only SQL
taken from the file, written by whoever runs ``reactor migrate``, which checks they compile.

A mapping is a value: a command resolves it once, with the catalog, into an install
(:mod:`reactor.install`) that every room is given; nothing here is process state.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, replace
from typing import Any

from reactor.errors import ConfigError
from reactor.expressions import expression_problem
from reactor.ownership import share_sql
from reactor.quote import identifier, literal

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
        return jobs == Jobs() and self.runs == Runs() and self.reactor_schema == "reactor"

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
        jobs = replace(self.jobs, table=_qualified(self.jobs.table))
        return replace(self, jobs=jobs, runs=replace(self.runs, table=_qualified(self.runs.table)))

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
                # reactor.audit's objects: the pair's own, so that two pairs of one database
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


def _qualified(table: tuple[str, ...]) -> tuple[str, ...]:
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


# ---- parsing ---------------------------------------------------------------------------------

_NAME = re.compile(r"[^\x00]{1,63}")
# Schemas the reactor's objects never go in: every role could create in public up to PostgreSQL
# 14 (CVE-2018-1058), and the system owns the rest; the reactor cannot trust what others make.
_SHARED_SCHEMAS = frozenset({"public", "information_schema"})
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_JOB_KEYS = set(Jobs.__dataclass_fields__) - {"types"}
_RUN_KEYS = set(Runs.__dataclass_fields__) - {"sequences"}


def load(path: str) -> Mapping:
    """Read and validate the file at ``path``; ConfigError names the first problem."""
    return parse(read(path), source=path)


def read(path: str) -> dict[str, Any]:
    """The TOML document at ``path``; ConfigError when it cannot be read or parsed."""
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(f"{CONFIG_VARIABLE}={path}: no such file") from None
    except OSError as error:
        raise ConfigError(f"{CONFIG_VARIABLE}={path}: cannot read it ({error.strerror})") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{CONFIG_VARIABLE}={path} is not valid TOML: {error}") from None
    return document


def parse(document: dict[str, Any], *, source: str = "the mapping") -> Mapping:
    """A validated mapping from a parsed TOML document; its ``[reactor]`` table, the pair's own
    settings, is :mod:`reactor.pairs`' to read."""
    where = f"{source}:"
    _known(document, {"reactor_schema", "jobs", "runs", "reactor"}, where, "")
    schema = document.get("reactor_schema", "reactor")
    if not isinstance(schema, str) or not _SCHEMA.fullmatch(schema):
        raise ConfigError(f"{where} reactor_schema must be a lower-case identifier, e.g. reactor")
    if schema in _SHARED_SCHEMAS or schema.startswith("pg_"):
        raise ConfigError(
            f"{where} reactor_schema = {schema!r} is a schema other roles create in or the "
            "system owns; the reactor needs one of its own, e.g. reactor"
        )
    jobs_table = _table(document, "jobs", where)
    runs_table = _table(document, "runs", where)
    for table in (jobs_table, runs_table):
        if table is not None and len(table) == 2 and table[0] == schema:
            # Whoever the app lets create in its schema could plant what the reactor's definer
            # functions run.
            raise ConfigError(
                f"{where} reactor_schema = {schema!r} is the schema of the app's table "
                f"{'.'.join(table)}; the reactor needs a schema of its own"
            )
    jobs = _section(document, "jobs", where, _JOB_KEYS)
    runs = _section(document, "runs", where, _RUN_KEYS)
    reference_jobs, reference_runs = Jobs(), Runs()
    parsed_jobs = Jobs(
        table=jobs_table or reference_jobs.table,
        id=_column(jobs, "id", where, "jobs", reference_jobs.id),
        run=_column(jobs, "run", where, "jobs", reference_jobs.run),
        status=_column(jobs, "status", where, "jobs", reference_jobs.status),
        terminal=_terminal(jobs, where, reference_jobs.terminal),
        updated_at=_column(jobs, "updated_at", where, "jobs", reference_jobs.updated_at),
        created_at=_column(
            jobs, "created_at", where, "jobs", _created_default(jobs, reference_jobs)
        ),
        deleted_at=_column(jobs, "deleted_at", where, "jobs", None)
        if jobs
        else reference_jobs.deleted_at,
        not_null=_names(
            jobs, "not_null", where, "jobs", reference_jobs.not_null if not jobs else ()
        ),
        not_empty=_names(
            jobs, "not_empty", where, "jobs", reference_jobs.not_empty if not jobs else ()
        ),
        time_zone=_zone(jobs, where),
    )
    columns = runs.get("columns")
    parsed_runs = Runs(
        table=runs_table or reference_runs.table,
        key=_column(runs, "key", where, "runs", reference_runs.key),
        job=_column(runs, "job", where, "runs", reference_runs.job),
        saved_by=_column(runs, "saved_by", where, "runs", reference_runs.saved_by),
        client=_values(runs, "client", where, "runs", reference_runs.client),
        worker=_value(runs, "worker", where, reference_runs.worker),
        columns=reference_runs.columns if columns is None else _expressions(columns, where),
    )
    written = {parsed_runs.key, parsed_runs.job, parsed_runs.saved_by}
    for column, _ in parsed_runs.columns:
        if column in written:
            raise ConfigError(
                f"{where} [runs.columns] {column} is written by the reactor itself "
                "(runs.key, runs.job or runs.saved_by); remove it from [runs.columns]"
            )
    if parsed_runs.key == parsed_runs.job and parsed_jobs.run != parsed_jobs.id:
        raise ConfigError(
            f"{where} runs.key and runs.job both name {parsed_runs.key}, so the artifact is keyed "
            f"by the job's id: set jobs.run = {parsed_jobs.id!r} (jobs.id) too, or name the "
            "column that holds the job's id in runs.job"
        )
    if parsed_runs.worker in parsed_runs.client:
        raise ConfigError(f"{where} runs.worker {parsed_runs.worker!r} is also in runs.client")
    for name in parsed_jobs.not_empty:
        if name not in parsed_jobs.not_null:
            raise ConfigError(
                f"{where} jobs.not_empty names {name}, which jobs.not_null must name too"
            )
    return Mapping(jobs=parsed_jobs, runs=parsed_runs, reactor_schema=schema, source=source)


def _known(table: dict[str, Any], keys: set[str], where: str, section: str) -> None:
    for key in table:
        if key not in keys:
            place = f"[{section}] " if section else ""
            raise ConfigError(
                f"{where} unknown key {place}{key}; the keys are {', '.join(sorted(keys))}"
            )


def _section(document: dict[str, Any], name: str, where: str, keys: set[str]) -> dict[str, Any]:
    section = document.get(name, {})
    if not isinstance(section, dict):
        raise ConfigError(f"{where} {name} must be a table ([{name}])")
    _known(section, keys, where, name)
    return section


def _table(document: dict[str, Any], section: str, where: str) -> tuple[str, ...] | None:
    value = (
        document.get(section, {}).get("table") if isinstance(document.get(section), dict) else None
    )
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{where} {section}.table must be a string: table or schema.table")
    parts = tuple(value.split("."))
    if len(parts) > 2 or not all(_NAME.fullmatch(part) for part in parts):
        raise ConfigError(
            f"{where} {section}.table = {value!r} must be table or schema.table, as named "
            "in the catalog (case matters)"
        )
    # An unqualified name means the schema public, always: resolved through a search_path, it
    # would find a look-alike in a schema named after the role that runs the reactor.
    return _qualified(parts)


def _column(table: dict[str, Any], key: str, where: str, section: str, default: str | None) -> Any:
    value = table.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ConfigError(f"{where} {section}.{key} must be a column name, as in the catalog")
    return value


def _names(
    table: dict[str, Any], key: str, where: str, section: str, default: tuple[str, ...]
) -> tuple[str, ...]:
    value = table.get(key, list(default))
    if not isinstance(value, list) or not all(
        isinstance(v, str) and _NAME.fullmatch(v) for v in value
    ):
        raise ConfigError(f"{where} {section}.{key} must be a list of column names")
    return tuple(value)


def _values(
    table: dict[str, Any], key: str, where: str, section: str, default: tuple[str, ...]
) -> tuple[str, ...]:
    value = table.get(key, list(default))
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} {section}.{key} must be a non-empty list of strings")
    return tuple(value)


def _terminal(
    table: dict[str, Any], where: str, default: tuple[Terminal, ...]
) -> tuple[Terminal, ...]:
    value = table.get("terminal", list(default))
    # bool is an int to Python, never a status to PostgreSQL's integer columns.
    texts = isinstance(value, list) and all(isinstance(v, str) for v in value)
    numbers = isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )
    if not value or not (texts or numbers):
        raise ConfigError(
            f"{where} jobs.terminal must be a non-empty list of strings (a text or enum status) "
            'or of integers (an integer status), e.g. ["complete", "failed"] or [3, 4]'
        )
    return tuple(value)


def _created_default(jobs: dict[str, Any], reference: Jobs) -> str | None:
    # Left out where each job is its own run (jobs.run names jobs.id): no two jobs of one run
    # to order. Elsewhere the reference's name, which db.fit requires the table to have.
    run = jobs.get("run", reference.run)
    return None if run == jobs.get("id", reference.id) else reference.created_at


def _value(table: dict[str, Any], key: str, where: str, default: str) -> str:
    value = table.get(key, default)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} runs.{key} must be a non-empty string")
    return value


def _zone(table: dict[str, Any], where: str) -> str | None:
    value = table.get("time_zone")
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where} jobs.time_zone must be a time zone name, e.g. UTC")
    return value.strip()


def _expressions(columns: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(columns, dict):
        raise ConfigError(f'{where} [runs.columns] must be a table of column = "SQL expression"')
    found = []
    for column, expression in columns.items():
        if not _NAME.fullmatch(column) or not isinstance(expression, str) or not expression.strip():
            raise ConfigError(
                f"{where} [runs.columns] {column} must be a string holding an SQL expression "
                'over the job row j, e.g. "j.results"'
            )
        problem = expression_problem(expression.strip())
        if problem is not None:
            raise ConfigError(
                f"{where} [runs.columns] {column} must be one SQL expression over the job row "
                f"j: {problem}"
            )
        found.append((column, expression.strip()))
    return tuple(found)
