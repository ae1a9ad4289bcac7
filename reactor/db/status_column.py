"""The job table's status column against the mapping's terminal values: a type the reactor can
compare them with, an enum's labels, and the column's CHECK constraints, evaluated as the
table's owner. Part of :func:`reactor.db.fit.fit`.
"""

from __future__ import annotations

import logging

import psycopg
import psycopg.errors

from reactor.db.catalog import Column, Table, enum_labels
from reactor.db.session import AnyConnection
from reactor.errors import ConfigError
from reactor.install.mapping import Terminal

log = logging.getLogger("reactor")

_TEXTS = ("text", "character varying")
_INTEGERS = ("smallint", "integer", "bigint")


async def check_status(
    conn: AnyConnection,
    jobs: Table,
    status: Column,
    terminal: tuple[Terminal, ...],
    *,
    installing: bool,
) -> None:
    """The status column is one the reactor compares with ``terminal``, and each terminal value
    is one a row can hold: of the column's type, an enum's label, allowed by its CHECKs."""
    shown = f"{jobs.shown}.{status.name}"
    numbers = isinstance(terminal[0], int)
    if status.type in _INTEGERS:
        if not numbers:
            raise ConfigError(
                f"{shown} is {status.type}: give jobs.terminal as integers, the values the app "
                "stores for its finished jobs (e.g. terminal = [3, 4])"
            )
    elif status.type in _TEXTS or status.enum:
        if numbers:
            raise ConfigError(
                f"{shown} is {status.type}: give jobs.terminal as strings, the values the app "
                'stores for its finished jobs (e.g. terminal = ["complete", "failed"])'
            )
    else:
        raise ConfigError(
            f"{shown} is {status.type}; the status must be text, varchar, an enum or an integer"
        )
    if status.enum:
        labels = await enum_labels(conn, jobs.oid, status.name)
        missing = [str(value) for value in terminal if value not in labels]
        if missing:
            raise ConfigError(
                f"jobs.terminal names {', '.join(missing)}, which the enum {status.type} of "
                f"{shown} lacks; its values are {', '.join(labels)}"
            )
    await _check_terminal_allowed(conn, jobs, status, terminal, installing=installing)


async def _check_terminal_allowed(
    conn: AnyConnection,
    jobs: Table,
    status: Column,
    terminal: tuple[Terminal, ...],
    *,
    installing: bool,
) -> None:
    """Each terminal value passes every CHECK constraint on the status column alone, as
    PostgreSQL itself evaluates it: the constraint's own expression (pg_get_expr) over a one-row
    table whose one column has the status column's name and type, holding the value. Never run
    for real: a READ ONLY transaction, rolled back. A constraint that cannot be evaluated so
    (it calls a function that fails without a row of the table) is left to the app.

    The expression runs as the table's owner (SET LOCAL ROLE), as it does when the app writes:
    a CHECK may call the owner's functions, and READ ONLY does not stop all that a function
    can do (COPY ... TO PROGRAM), so it never runs with the rights of whoever checks the
    mapping (a superuser running `reactor init` or `migrate`). A role that cannot act as the
    owner (the runtime role at `run`, `status`) skips the evaluation: `migrate` made it.
    """
    cur = await conn.execute(
        "SELECT c.conname, pg_get_constraintdef(c.oid), pg_get_expr(c.conbin, c.conrelid),"
        "       format_type(a.atttypid, a.atttypmod)"
        "  FROM pg_constraint c JOIN pg_attribute a"
        "    ON a.attrelid = c.conrelid AND a.attname = %s"
        " WHERE c.conrelid = %s AND c.contype = 'c' AND c.conkey = ARRAY[a.attnum]"
        " ORDER BY c.conname",
        (status.name, jobs.oid),
    )
    checks = await cur.fetchall()
    if not checks:
        return
    as_owner = psycopg.sql.SQL("SET LOCAL ROLE {}").format(psycopg.sql.Identifier(jobs.owner))
    if not await _may_act_as(conn, as_owner):
        log.log(
            logging.WARNING if installing else logging.DEBUG,
            "the terminal values are not evaluated against the status column's CHECK "
            "constraints: this role cannot act as the owner of the job table, and never runs "
            "the owner's code with its own rights",
            extra={"table": jobs.shown, "owner": jobs.owner},
        )
        return
    for name, definition, expression, type_name in checks:
        # The value as text, cast to the column's type as a row's would be; a CHECK passes
        # when its expression is not false (NULL passes, as PostgreSQL has it).
        # The catalog's text runs with a parameter: its own % are literal ('a%' in a LIKE).
        expression, type_name = expression.replace("%", "%%"), type_name.replace("%", "%%")
        query = (
            f"SELECT ({expression}) IS NOT FALSE"
            f" FROM (SELECT CAST(%(value)s::text AS {type_name}) AS"
            f" {psycopg.sql.Identifier(status.name).as_string(None)}) AS row_of_status"
        )
        for value in terminal:
            try:
                async with conn.transaction(force_rollback=True):
                    await conn.execute("SET TRANSACTION READ ONLY")
                    await conn.execute(as_owner)
                    found = await (await conn.execute(query, {"value": str(value)})).fetchone()
            except psycopg.Error:
                # As the owner, whatever fails (a privilege its function lacks included) is
                # the constraint's own doing: left to the app, as a row would find it.
                break
            if found is not None and not found[0]:
                raise ConfigError(
                    f"jobs.terminal names {value!r}, which no row of {jobs.shown} can hold: "
                    f"its constraint {name} is {definition}; name the values the app stores "
                    "for its finished jobs"
                )


async def _may_act_as(conn: AnyConnection, as_owner: psycopg.sql.Composed) -> bool:
    """Whether ``as_owner`` (SET LOCAL ROLE) succeeds here: a superuser, or a member of the
    owner with its SET option."""
    try:
        async with conn.transaction(force_rollback=True):
            await conn.execute("SET TRANSACTION READ ONLY")
            await conn.execute(as_owner)
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True
