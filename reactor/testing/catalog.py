"""What the simulated app reads of the catalog: what its mapping does not say of the job table.

A mapping names the columns the reactor reads; an app fills others as well. For tables the demo
has never seen, :func:`read_fit` asks PostgreSQL which NOT NULL columns nothing else fills, who
gives a new job its id, and which status a running job may have; :meth:`.app.App.fit` makes the
app of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from reactor.errors import ConfigError
from reactor.install.mapping import Mapping, Terminal

# The column types the app writes a document or a verdict to.
JSON_TYPES = ("json", "jsonb")
_TEXT_TYPES = ("text", "character varying", "character")

# The value the demo gives a NOT NULL column of the job table that nothing else fills, by type.
_FILLERS = {
    "uuid": "gen_random_uuid()",
    "text": "'demo'",
    "character varying": "'demo'",
    "character": "'d'",
    "boolean": "false",
    "smallint": "0",
    "integer": "0",
    "bigint": "0",
    "numeric": "0",
    "real": "0",
    "double precision": "0",
    "json": "'{}'",
    "jsonb": "'{}'",
    "timestamp with time zone": "now()",
    "timestamp without time zone": "localtimestamp",
    "date": "current_date",
}


@dataclass(frozen=True)
class AppFit:
    """What the app needs of the job table beside its mapping (see :class:`.app.App`)."""

    own_columns: tuple[tuple[str, str], ...]
    assigns_ids: bool
    running: Terminal


async def read_fit(conn: psycopg.AsyncConnection[Any], mapping: Mapping) -> AppFit:
    """What the catalog says of the tables ``mapping`` names that the mapping does not; a
    ConfigError (one line) for a table the app cannot write."""
    from reactor.db.catalog import describe, enum_labels

    jobs = mapping.jobs
    table = await describe(conn, jobs.table)
    if table is None:
        raise ConfigError(f"table {mapping.jobs_shown} not found")
    labels = await enum_labels(conn, table.oid, jobs.status)
    # An integer status (Rails' enum) runs as the first small number that is not terminal.
    candidates: tuple[Terminal, ...] = (
        tuple(labels or ("running", "queued"))
        if isinstance(jobs.terminal[0], str)
        else (1, 0, 2, 3)
    )
    running = next((v for v in candidates if v not in jobs.terminal), "")
    if not running:
        raise ConfigError(
            f"{mapping.jobs_shown}.{jobs.status} has no value but the terminal ones; the "
            "app needs one for a running job"
        )
    for name in jobs.not_null:
        if jobs.type_of(name) not in (*_TEXT_TYPES, *JSON_TYPES):
            raise ConfigError(
                f"{mapping.jobs_shown}.{name} is {jobs.type_of(name)}; the app writes "
                "documents of text or json types only"
            )
    mapped = {jobs.id, jobs.run, jobs.status, jobs.updated_at, *jobs.not_null}
    mapped |= {jobs.created_at} if jobs.created_at else set()
    own = []
    for column in table.columns.values():
        if column.name in mapped or not column.not_null or column.filled:
            continue
        if column.enum:
            own.append((column.name, f"(enum_range(NULL::{column.type}))[1]"))
        elif column.type.endswith("[]"):
            own.append((column.name, "'{}'"))
        elif column.type in _FILLERS:
            own.append((column.name, _FILLERS[column.type]))
        else:
            raise ConfigError(
                f"the app cannot fill {mapping.jobs_shown}.{column.name} ({column.type}, NOT "
                "NULL without a default); give it a default in the --schema file"
            )
    return AppFit(tuple(own), assigns_ids=table.columns[jobs.id].filled, running=running)
