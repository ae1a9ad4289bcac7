"""Checks before harm: the mapping against the catalog, before anything is changed or run.

`reactor migrate` runs :func:`fit` before it touches the database, and `run`, `sweep` and
`status` at start. The first mismatch raises ConfigError (exit 2) in one line that names the
table or column and the fix. What passes comes back as the mapping with the columns' types and
the tables' schemas filled in, which is what the SQL is rendered from. What the checks read
of the catalog is :mod:`.catalog`'s.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import psycopg
import psycopg.errors

from reactor.db.catalog import Column, Table, default_sequences, describe, unique_on
from reactor.db.installed import check_installed, check_move
from reactor.db.saves import check_plain_saves
from reactor.db.session import AnyConnection
from reactor.db.status_column import check_status
from reactor.errors import ConfigError, SchemaMissing
from reactor.install import mapping as mapping_module
from reactor.install import null_cost
from reactor.install.mapping import ID_TYPES, Mapping
from reactor.install.quote import readable

log = logging.getLogger("reactor")

_TIMES = ("timestamp with time zone", "timestamp without time zone")


async def fit(
    conn: AnyConnection,
    mapping: Mapping,
    *,
    installing: bool = False,
    reference_schema: bool = False,
) -> Mapping:
    """``mapping`` checked against the catalog and typed from it; ConfigError names the first
    problem. ``installing``: `reactor migrate`, which may add ``runs.saved_by`` itself."""
    where = f"REACTOR_CONFIG ({mapping.source})" if mapping.source else "the reference mapping"
    _check_showable(mapping, where)
    jobs_map, runs_map = mapping.jobs, mapping.runs
    # The reference tables missing is the schema missing (exit 4), as it always was.
    missing_is_schema = mapping.is_reference and not reference_schema
    jobs = await _table(conn, jobs_map.table, "jobs", where, missing_is_schema)
    runs = await _table(conn, runs_map.table, "runs", where, missing_is_schema)
    for table, section in ((jobs, "jobs"), (runs, "runs")):
        _check_relation(table, section, where, installing=installing)
        if table.schema == mapping.reactor_schema:
            # The app's owner, and whoever the app lets create there, make objects in the app's
            # schema: the reactor's definer functions cannot trust what they find in it.
            raise ConfigError(
                f"reactor_schema = {mapping.reactor_schema!r} is the schema of {table.shown}; "
                f"the reactor needs a schema of its own (set reactor_schema in {where})"
            )
    if installing:
        await check_plain_saves(conn, mapping, (runs.schema, runs.name), where)
    if runs.partitioned:
        raise ConfigError(
            f"{runs.shown} is partitioned: the reactor writes it with ON CONFLICT on its key "
            f"alone, which a partitioned table cannot be unique on; use a plain table for runs"
        )

    def column(table: Table, name: str, key: str) -> Column:
        found = table.columns.get(name)
        if found is None:
            raise ConfigError(
                f"{table.shown} has no column {name} ({key} in {where}); name the column "
                f"that holds it, or add it"
            )
        return found

    job_id = column(jobs, jobs_map.id, "jobs.id")
    job_run = column(jobs, jobs_map.run, "jobs.run")
    status = column(jobs, jobs_map.status, "jobs.status")
    times = [column(jobs, jobs_map.updated_at, "jobs.updated_at")]
    if jobs_map.created_at is not None:
        if jobs_map.created_at not in jobs.columns and not mapping.one_to_one:
            raise ConfigError(
                f"{jobs.shown} has no column {jobs_map.created_at} (jobs.created_at in {where}): "
                f"several jobs can share a run (jobs.run = {jobs_map.run} is not jobs.id), and "
                "created_at orders them, so that a re-analysis replaces the earlier job's run; "
                "name the column that holds when a job was created, or add it"
            )
        times.append(column(jobs, jobs_map.created_at, "jobs.created_at"))
    if jobs_map.deleted_at:
        times.append(column(jobs, jobs_map.deleted_at, "jobs.deleted_at"))
    documents = [column(jobs, name, "jobs.not_null") for name in jobs_map.not_null]
    run_key = column(runs, runs_map.key, "runs.key")
    run_job = column(runs, runs_map.job, "runs.job")
    if runs_map.saved_by not in runs.columns and not installing:
        raise SchemaMissing(
            f"{runs.shown} has no column {runs_map.saved_by} (runs.saved_by); run `reactor migrate`"
        )
    for name, _ in runs_map.columns:
        column(runs, name, f"[runs.columns] {name}")

    if job_id.type not in ID_TYPES:
        raise ConfigError(
            f"{jobs.shown}.{job_id.name} is {job_id.type}; job ids must be uuid, bigint or text"
        )
    if job_run.type not in ID_TYPES:
        raise ConfigError(
            f"{jobs.shown}.{job_run.name} is {job_run.type}; run keys must be uuid, bigint or text"
        )
    if run_key.type != job_run.type:
        raise ConfigError(
            f"{runs.shown}.{run_key.name} is {run_key.type} but {jobs.shown}.{job_run.name} is "
            f"{job_run.type}: jobs.run and runs.key must have one type"
        )
    if run_job.type != job_id.type:
        raise ConfigError(
            f"{runs.shown}.{run_job.name} is {run_job.type} but {jobs.shown}.{job_id.name} is "
            f"{job_id.type}: runs.job holds a job id and must have its type"
        )
    for time in times:
        if time.type not in _TIMES:
            raise ConfigError(
                f"{jobs.shown}.{time.name} is {time.type}; it must be timestamptz "
                "(or timestamp without time zone, with jobs.time_zone)"
            )
        if time.type == _TIMES[1] and not jobs_map.time_zone:
            raise ConfigError(
                f"{jobs.shown}.{time.name} is timestamp without time zone: set jobs.time_zone in "
                'REACTOR_CONFIG to the zone its values are written in ("UTC" for most ORMs)'
            )
    if jobs_map.time_zone:
        await _check_zone(conn, jobs_map.time_zone)
    await check_status(conn, jobs, status, jobs_map.terminal, installing=installing)
    if not await unique_on(conn, runs.oid, run_key.name):
        raise ConfigError(
            f"{runs.shown}.{run_key.name} (runs.key) has no unique index on it alone; add one "
            f"(CREATE UNIQUE INDEX ON {readable(runs.schema, runs.name)} "
            f"({readable(run_key.name)})), or make it the primary key"
        )
    written = {runs_map.key, runs_map.job, runs_map.saved_by, *(c for c, _ in runs_map.columns)}
    for unfilled in runs.columns.values():
        if unfilled.not_null and not unfilled.filled and unfilled.name not in written:
            raise ConfigError(
                f"{runs.shown}.{unfilled.name} is NOT NULL without a default, and the reactor "
                f'would leave it empty: add {unfilled.name} = "j.<column>" (an SQL expression '
                f"over the job row) to [runs.columns] in REACTOR_CONFIG"
            )

    # Typed, and with both tables schema-qualified: the reactor's functions run with a
    # search_path of pg_catalog only, and must find the same tables as the app.
    typed = mapping.typed({c.name: c.type for c in (job_id, job_run, status, *times, *documents)})
    unwritten = [name for name in runs.columns if name not in written]
    located = replace(
        typed,
        jobs=replace(typed.jobs, table=(jobs.schema, jobs.name)),
        runs=replace(
            typed.runs,
            table=(runs.schema, runs.name),
            sequences=await default_sequences(conn, runs.oid, unwritten),
        ),
    )
    await _check_expressions(conn, located, where)
    if not installing:
        await check_installed(conn, located, (jobs.oid, runs.oid))
    else:
        await check_move(conn, located, (jobs.oid, runs.oid))
        _warn_null_costs(mapping, jobs, runs)
    return located


def _warn_null_costs(mapping: Mapping, jobs: Table, runs: Table) -> None:
    """A warning line (never a refusal) for each NOT NULL artifact column filled from a job
    column that may be NULL (:mod:`reactor.install.null_cost`): such a job would be set aside."""
    found = null_cost.costs(
        mapping,
        [c.name for c in runs.columns.values() if c.not_null],
        [c.name for c in jobs.columns.values() if not c.not_null],
    )
    for column, _, sources in found:
        log.warning(
            "a NULL in the job would be refused by the artifact's NOT NULL, and the job set "
            "aside: " + null_cost.fixes(mapping, column, sources),
            extra={"table": runs.shown, "column": column},
        )


def _check_showable(mapping: Mapping, where: str) -> None:
    """No mapped name or value holds a control character or a line break
    (:func:`~reactor.install.mapping.unshowable` says why); the message shows it escaped."""
    found = mapping_module.unshowable(mapping)
    if found is not None:
        key, text, char = found
        raise ConfigError(
            f"{key} = {text!r} in {where} holds {char!r}, a control character or line break, "
            "which no name or value the reactor renders may hold: rename the table or column "
            "(or change the value), and the mapping with it"
        )


async def _table(
    conn: AnyConnection, name: tuple[str, ...], section: str, where: str, missing_is_schema: bool
) -> Table:
    found = await describe(conn, name)
    if found is not None:
        return found
    shown = name[-1] if name[0] == "public" else ".".join(name)
    if missing_is_schema:
        raise SchemaMissing(
            f"table {shown} not found; create the app's tables first, or run "
            "`reactor migrate --reference-schema` for the reference ones"
        )
    raise ConfigError(
        f"table {shown} not found ({section}.table in {where}); create it, or name the "
        f"app's {section} table there"
    )


# What each relkind is, for the message that refuses it.
_KINDS = {
    "v": "a view",
    "m": "a materialized view",
    "f": "a foreign table",
    "S": "a sequence",
    "i": "an index",
    "I": "a partitioned index",
    "c": "a composite type",
    "t": "a TOAST table",
}


def _check_relation(table: Table, section: str, where: str, *, installing: bool) -> None:
    """A mapped relation is a table (the triggers go on it, the reactor writes it), and the
    migrate role owns it: installing SECURITY DEFINER triggers on another role's table would
    run that role's code (its triggers, casts, defaults) with the migrate role's rights."""
    if table.kind not in ("r", "p"):
        what = _KINDS.get(table.kind, f"a relation of kind {table.kind!r}")
        raise ConfigError(
            f"{table.shown} ({section}.table in {where}) is {what}, not a table; name the "
            f"app's {section} table itself"
        )
    if installing and not table.owned:
        raise ConfigError(
            f"{table.shown} ({section}.table in {where}) belongs to role {table.owner}, which "
            f"this role is not a member of; run `reactor migrate` as {table.owner} (the "
            f"owner of the app's tables), or name the app's own table there"
        )


async def _check_zone(conn: AnyConnection, zone: str) -> None:
    try:
        async with conn.transaction():
            await conn.execute("SELECT now() AT TIME ZONE %s", (zone,))
    except psycopg.errors.InvalidParameterValue:
        raise ConfigError(
            f"jobs.time_zone = {zone!r} is not a time zone PostgreSQL knows; use a name of "
            "pg_timezone_names, e.g. UTC or Europe/Berlin"
        ) from None


# The check of [runs.columns] expressions: the record statements' write of their columns, in
# their parentheses (Mapping.value_of), planned and never run. One parameter, so that psycopg
# sends it over the extended protocol, as it sends the record statements: a statement with
# parameters goes by PQsendQueryParams, one without by PQsendQuery, the simple protocol, which
# runs every statement the text holds (psycopg/_cursor_base.py, BaseCursor._execute_send:
# "elif force_extended or query.params or fmt == BINARY"). The extended protocol takes one
# statement only; a second is an error, not a second statement.
_CHECK_EXPRESSIONS = (
    "EXPLAIN (COSTS OFF) INSERT INTO @runs@ (@columns@) SELECT @values@ FROM @jobs@ j"
    " WHERE %(never)s"
)


async def _check_expressions(conn: AnyConnection, mapping: Mapping, where: str) -> None:
    """Plan (never run) the write's column list, so that an expression that does not compile
    or does not fit its column is named now, not at the first write.

    Planning may still call a function (the planner folds an immutable one), so each check
    runs in a READ ONLY transaction of its own that is rolled back: what an expression's
    functions try to change fails, and is named as the reason it does not fit.
    """
    columns = mapping.runs.columns
    # All at once, as the write has them; each alone only to name the one that does not fit.
    if not columns or await _plans(conn, mapping, columns) is None:
        return
    for name, expression in columns:
        error = await _plans(conn, mapping, ((name, expression),))
        if error is not None:
            first = (
                str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            )
            raise ConfigError(
                f"[runs.columns] {name} = {expression!r} in {where} does not compile as a value "
                f"of that column: {first}"
            )


async def _plans(
    conn: AnyConnection, mapping: Mapping, columns: tuple[tuple[str, str], ...]
) -> psycopg.Error | None:
    """Why the write of ``columns`` (name, expression) does not plan; None when it does."""
    from reactor.install import sql

    text = sql.render(
        _CHECK_EXPRESSIONS,
        mapping,
        values={
            "columns": ", ".join(
                psycopg.sql.Identifier(name).as_string(None) for name, _ in columns
            ),
            "values": ", ".join(mapping_module.value_of(expression) for _, expression in columns),
        },
        parameters=True,
    )
    try:
        async with conn.transaction(force_rollback=True):
            await conn.execute("SET TRANSACTION READ ONLY")
            await conn.execute(text, {"never": False})
    except psycopg.errors.InsufficientPrivilege:
        raise
    except psycopg.Error as error:
        return error
    return None
