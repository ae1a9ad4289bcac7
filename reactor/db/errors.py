"""The driver's errors as the reactor's own: one place that knows psycopg's exception classes.

:func:`translate` maps an error psycopg (or the socket under it) raised to a
:class:`DatabaseError`, a :class:`~reactor.errors.ReactorError` whose subclass says what went
wrong and carries its exit code (:mod:`reactor.errors`); :func:`translated` does so for a block.
A caller outside ``db/`` catches these, never psycopg's. The message is the driver's first line:
no traceback, and no DSN (libpq never prints passwords). The driver's error stays the
translation's ``__cause__``. A ``TimeoutError`` is left as it is: it is a bound the caller set
(``anyio.fail_after``), and the caller says what running out of it means.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import psycopg.errors

from reactor.errors import (
    DatabaseReadOnly,
    DatabaseUnreachable,
    PrivilegeMissing,
    ReactorError,
    SchemaMissing,
)


class DatabaseError(ReactorError):
    """A database call failed; the subclass says how, and so which exit code it has."""


class PrivilegeDenied(PrivilegeMissing, DatabaseError):
    """The server refused a statement for want of a privilege (exit 5)."""


class ServerReadOnly(DatabaseReadOnly, DatabaseError):
    """The statement writes, and the server is a read-only standby (exit 3)."""


class ConnectionFailed(DatabaseUnreachable, DatabaseError):
    """The server could not be reached, or the connection broke or timed out (exit 3)."""


class SchemaAbsent(SchemaMissing, DatabaseError):
    """A schema, table or function the statement names does not exist (exit 4)."""


class StatementFailed(DatabaseError):
    """The server refused a statement for a reason none of the others names (exit 1)."""


# Most specific first: the first class the error is an instance of decides.
_BY_DRIVER_ERROR: tuple[tuple[type[BaseException], type[DatabaseError]], ...] = (
    (psycopg.errors.InsufficientPrivilege, PrivilegeDenied),
    (psycopg.errors.ReadOnlySqlTransaction, ServerReadOnly),
    (psycopg.errors.InvalidSchemaName, SchemaAbsent),
    (psycopg.errors.UndefinedTable, SchemaAbsent),
    (psycopg.errors.UndefinedFunction, SchemaAbsent),
    # A pool that cannot hand out a connection in time is an OperationalError too.
    (psycopg.OperationalError, ConnectionFailed),
    (psycopg.InterfaceError, ConnectionFailed),
    (OSError, ConnectionFailed),
    (psycopg.Error, StatementFailed),
)

# What translate takes: the driver's errors and the socket's.
DRIVER_ERRORS = (psycopg.Error, OSError)


def translate(error: psycopg.Error | OSError) -> DatabaseError:
    """The reactor's error for ``error``, with the driver's first line as its message."""
    lines = str(error).strip().splitlines()
    message = lines[0] if lines else type(error).__name__
    kind = next(ours for theirs, ours in _BY_DRIVER_ERROR if isinstance(error, theirs))
    return kind(message)


@contextmanager
def translated(*only: type[DatabaseError]) -> Iterator[None]:
    """Raise the driver's errors inside the block as :func:`translate` maps them; with
    ``only``, just those that map to one of these classes (the rest leave as they are)."""
    try:
        yield
    except TimeoutError:
        raise
    except DRIVER_ERRORS as error:
        ours = translate(error)
        if only and not isinstance(ours, only):
            raise
        raise ours from error
