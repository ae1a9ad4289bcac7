"""The app's side of ``reactor demo``, for any mapping: a worker that creates and finishes jobs,
and browser tabs that save runs, each written in the app's own names, types and values.

The job table may have NOT NULL columns of its own that the mapping does not name (an owner, a
title). The demo fills each from its type (a fresh uuid, an enum's first value, 'demo', 0), so
that `reactor demo --config FILE --schema FILE` runs on the app's real table shapes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg.errors
from psycopg import sql as pgsql

from reactor import mapping as mapping_module
from reactor import sql
from reactor.db import AnyConnection, first_line
from reactor.db.fit import Column, describe, enum_labels
from reactor.errors import ConfigError
from reactor.mapping import Mapping

# The value a NOT NULL column of the job table gets when nothing else fills it, by type.
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
_TEXT_TYPES = ("text", "character varying", "character")
_JSON_TYPES = ("json", "jsonb")
_PAGE = "<p>citation</p>" * 200


@dataclass(frozen=True)
class App:
    """The app's statements, rendered for one mapping and the job table's catalog entry."""

    mapping: Mapping
    create: pgsql.Composed
    finish: pgsql.Composed
    running: str

    @classmethod
    async def fit(cls, conn: AnyConnection) -> App:
        """The app for the mapping in force (checked and typed by `reactor migrate`)."""
        m = mapping_module.in_force()
        jobs = m.jobs
        table = await describe(conn, jobs.table)
        assert table is not None, "migrate checked the job table"
        labels = await enum_labels(conn, table.oid, jobs.status)
        running = next((v for v in labels or ("running", "queued") if v not in jobs.terminal), "")
        if not running:
            raise ConfigError(
                f"{m.jobs_shown}.{jobs.status} has no value but the terminal ones; the demo "
                "needs one for a running job"
            )
        for column in jobs.not_null:
            if jobs.type_of(column) not in (*_TEXT_TYPES, *_JSON_TYPES):
                raise ConfigError(
                    f"{m.jobs_shown}.{column} is {jobs.type_of(column)}; the demo writes "
                    "documents of text or json types only"
                )
        return cls(m, _create(m, table.columns, running), _finish(m), running)

    async def create_jobs(self, conn: AnyConnection, count: int) -> list[Any]:
        """``count`` running jobs; their ids, oldest first."""
        try:
            cur = await conn.execute(self.create, {"count": count})
        except psycopg.errors.IntegrityError as error:
            raise ConfigError(
                f"the demo cannot create a job in {self.mapping.jobs_shown}: "
                f"{first_line(error)}; give the column a default in the --schema file"
            ) from None
        return [job_id for (job_id,) in await cur.fetchall()]

    async def finish_job(
        self, conn: AnyConnection, job_id: Any, *, failed: bool, empty: bool
    ) -> None:
        """The worker's finishing update; ``empty`` leaves the contents empty (no run needed)."""
        jobs = self.mapping.jobs
        values: dict[str, Any] = {
            "job": job_id,
            "status": jobs.terminal[-1] if failed else jobs.terminal[0],
        }
        for i, column in enumerate(jobs.not_null):
            blank = empty and column in jobs.not_empty
            if jobs.type_of(column) in _JSON_TYPES:
                values[f"d{i}"] = "{}" if blank else json.dumps({"verdicts": 1 + i})
            else:
                values[f"d{i}"] = "" if blank else _PAGE
        await conn.execute(self.finish, values)

    async def tab_save(self, conn: AnyConnection, job_id: Any) -> None:
        """A tab's save of the job's run: the client's value of saved_by, over any other."""
        await conn.execute(sql.query("tab_save", "demo.sql"), {"job": job_id})

    async def unsettled(self, conn: AnyConnection) -> int:
        """Jobs that still need a run, due or inside their grace window."""
        cur = await conn.execute(sql.query("unsettled", "demo.sql"), {})
        row = await cur.fetchone()
        return int(row[0]) if row else 0


def _now(m: Mapping, column: str) -> pgsql.Composable:
    if m.jobs.naive(column):
        return pgsql.SQL("(now() AT TIME ZONE {})").format(pgsql.Literal(m.jobs.time_zone))
    return pgsql.SQL("now()")


def _create(m: Mapping, columns: dict[str, Column], running: str) -> pgsql.Composed:
    jobs = m.jobs
    table = pgsql.Identifier(*jobs.table)
    # Each new id or run key: a fresh uuid, as text if need be, or the next of the bigints.
    fresh = {
        "uuid": "gen_random_uuid()",
        "text": "gen_random_uuid()::text",
    }
    values: dict[str, pgsql.Composable] = {}
    for column in (jobs.id, jobs.run):
        if column in values or columns[column].filled:
            continue
        kind = jobs.type_of(column)
        if kind in fresh:
            values[column] = pgsql.SQL(fresh[kind])
        else:
            values[column] = pgsql.SQL("(SELECT coalesce(max({c}), 0) FROM {t}) + g").format(
                c=pgsql.Identifier(column), t=table
            )
    status_type = pgsql.SQL(jobs.type_of(jobs.status))
    values[jobs.status] = pgsql.SQL("{}::{}").format(pgsql.Literal(running), status_type)
    for column in (jobs.created_at, jobs.updated_at):
        values.setdefault(column, _now(m, column))
    for other in columns.values():
        if other.name not in values and other.not_null and not other.filled:
            values[other.name] = pgsql.SQL(_filler(m, other))
    return pgsql.SQL(
        "INSERT INTO {t} ({c}) SELECT {v} FROM generate_series(1, %(count)s) AS g"
        " ORDER BY g RETURNING {id}"
    ).format(
        t=table,
        c=pgsql.SQL(", ").join(pgsql.Identifier(c) for c in values),
        v=pgsql.SQL(", ").join(values.values()),
        id=pgsql.Identifier(jobs.id),
    )


def _filler(m: Mapping, column: Column) -> str:
    if column.enum:
        return f"(enum_range(NULL::{column.type}))[1]"
    if column.type.endswith("[]"):
        return "'{}'"
    if column.type in _FILLERS:
        return _FILLERS[column.type]
    raise ConfigError(
        f"the demo cannot fill {m.jobs_shown}.{column.name} ({column.type}, NOT NULL without a "
        "default); give it a default in the --schema file"
    )


def _finish(m: Mapping) -> pgsql.Composed:
    jobs = m.jobs
    sets = [
        pgsql.SQL("{} = %(status)s::{}").format(
            pgsql.Identifier(jobs.status), pgsql.SQL(jobs.type_of(jobs.status))
        ),
        pgsql.SQL("{} = {}").format(pgsql.Identifier(jobs.updated_at), _now(m, jobs.updated_at)),
    ]
    for i, column in enumerate(jobs.not_null):
        sets.append(
            pgsql.SQL("{} = {}::{}").format(
                pgsql.Identifier(column),
                pgsql.Placeholder(f"d{i}"),
                pgsql.SQL(jobs.type_of(column)),
            )
        )
    return pgsql.SQL("UPDATE {t} SET {s} WHERE {id} = %(job)s").format(
        t=pgsql.Identifier(*jobs.table),
        s=pgsql.SQL(", ").join(sets),
        id=pgsql.Identifier(jobs.id),
    )
