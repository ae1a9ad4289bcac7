"""The errors a user can cause, each with the exit code the CLI turns it into.

The CLI prints ``str(error)`` as one line and exits with ``error.exit_code``: no traceback for a
mistake the user can fix. Messages say what to do, and never contain a password.
"""

from __future__ import annotations


class ReactorError(Exception):
    """Base class of the errors the CLI reports as one line."""

    exit_code = 1


class ConfigError(ReactorError):
    """A setting, flag or hook specification is invalid."""

    exit_code = 2


class UsageError(ReactorError):
    """A command names something that does not exist, or asks what cannot be done to it."""

    exit_code = 2


class DatabaseUnreachable(ReactorError):
    """The database did not accept a connection at startup, even after retries."""

    exit_code = 3


class DatabaseReadOnly(ReactorError):
    """The database is a read-only hot standby, and the reactor writes: it needs the primary."""

    exit_code = 3


class SchemaMissing(ReactorError):
    """The reactor's schema is absent or older than this version needs."""

    exit_code = 4


class UntrustedSchema(ReactorError):
    """The reactor's schema holds, or lets others make, what its owner did not."""

    exit_code = 2


class PrivilegeMissing(ReactorError):
    """The database role lacks a privilege the reactor needs."""

    exit_code = 5
