"""The mapping file: ``REACTOR_CONFIG``'s TOML, read and validated key by key into a
:class:`~reactor.install.mapping.Mapping`.

Pure but for :func:`read`: every key is checked here, with a message that names it and the fix,
so the rest of the code can trust a mapping. Where a key is left out the reference mapping's
value stands. The ``[reactor]`` table, the pair's own settings, is :mod:`reactor.settings.pairs`'
to read.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

from reactor.errors import ConfigError
from reactor.install.expressions import expression_problem
from reactor.install.mapping import CONFIG_VARIABLE, Jobs, Mapping, Runs, Terminal, qualified

_NAME = re.compile(r"[^\x00]{1,63}")
# Schemas the reactor's objects never go in: every role could create in public up to PostgreSQL
# 14 (CVE-2018-1058), and the system owns the rest; the reactor cannot trust what others make.
_SHARED_SCHEMAS = frozenset({"public", "information_schema"})
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_JOB_KEYS = set(Jobs.__dataclass_fields__) - {"types"}
_RUN_KEYS = set(Runs.__dataclass_fields__) - {"sequences"}
# How the app may save its own artifact rows (runs.app_saves).
APP_SAVES = ("upsert", "plain")


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
    settings, is :mod:`reactor.settings.pairs`' to read."""
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
        app_saves=_app_saves(runs, where),
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
    return qualified(parts)


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


def _app_saves(table: dict[str, Any], where: str) -> str:
    value = table.get("app_saves", "upsert")
    if value not in APP_SAVES:
        raise ConfigError(
            f'{where} runs.app_saves must be "upsert" (the app saves with INSERT ... ON CONFLICT '
            'DO UPDATE SET ..., saved_by = its client value) or "plain" (it saves with a plain '
            "INSERT, an ORM's create)"
        )
    return str(value)


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
