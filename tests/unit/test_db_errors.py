"""The driver's errors as the reactor's own (reactor.db.errors), with their exit codes."""

from __future__ import annotations

import psycopg
import psycopg.errors
import pytest
from psycopg_pool import PoolTimeout

from reactor.db import errors
from reactor.errors import (
    DatabaseReadOnly,
    DatabaseUnreachable,
    PrivilegeMissing,
    ReactorError,
    SchemaMissing,
)


@pytest.mark.parametrize(
    ("driver", "ours", "project", "exit_code"),
    [
        (psycopg.errors.InsufficientPrivilege, errors.PrivilegeDenied, PrivilegeMissing, 5),
        (psycopg.errors.ReadOnlySqlTransaction, errors.ServerReadOnly, DatabaseReadOnly, 3),
        (psycopg.errors.UndefinedTable, errors.SchemaAbsent, SchemaMissing, 4),
        (psycopg.errors.InvalidSchemaName, errors.SchemaAbsent, SchemaMissing, 4),
        (psycopg.errors.AdminShutdown, errors.ConnectionFailed, DatabaseUnreachable, 3),
        (psycopg.OperationalError, errors.ConnectionFailed, DatabaseUnreachable, 3),
        (PoolTimeout, errors.ConnectionFailed, DatabaseUnreachable, 3),
        (ConnectionResetError, errors.ConnectionFailed, DatabaseUnreachable, 3),
        (psycopg.errors.SyntaxError, errors.StatementFailed, ReactorError, 1),
    ],
)
def test_each_driver_error_becomes_the_projects_with_its_exit_code(
    driver: type[Exception],
    ours: type[errors.DatabaseError],
    project: type[ReactorError],
    exit_code: int,
) -> None:
    translated = errors.translate(driver("first line\nDETAIL: the rest"))  # type: ignore[arg-type]
    assert type(translated) is ours
    assert isinstance(translated, project)
    assert isinstance(translated, errors.DatabaseError)
    assert translated.exit_code == exit_code
    assert str(translated) == "first line"


def test_an_error_without_a_message_is_named_by_its_type() -> None:
    assert str(errors.translate(psycopg.OperationalError())) == "OperationalError"


def test_a_block_raises_the_translation_with_the_driver_error_as_its_cause() -> None:
    original = psycopg.errors.InsufficientPrivilege("permission denied for table jobs")
    with pytest.raises(errors.PrivilegeDenied) as caught, errors.translated():
        raise original
    assert caught.value.__cause__ is original


def test_only_the_classes_asked_for_are_translated() -> None:
    with pytest.raises(psycopg.errors.UndefinedTable), errors.translated(errors.PrivilegeDenied):
        raise psycopg.errors.UndefinedTable("relation does not exist")
    with pytest.raises(errors.PrivilegeDenied), errors.translated(errors.PrivilegeDenied):
        raise psycopg.errors.InsufficientPrivilege("permission denied")


def test_a_bound_the_caller_set_and_other_errors_pass_untouched() -> None:
    with pytest.raises(TimeoutError), errors.translated():
        raise TimeoutError
    with pytest.raises(ValueError, match="not ours"), errors.translated():
        raise ValueError("not ours")
