"""The errors a user can cause, each with the exit code the CLI turns it into.

The CLI prints ``str(error)`` as one line and exits with ``error.exit_code``: no traceback for a
mistake the user can fix. Messages say what to do, and never contain a password.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ReactorError(Exception):
    """Base class of the errors the CLI reports as one line."""

    exit_code: ClassVar[int] = 1

    def __init_subclass__(cls, *, exit_code: int | None = None, **kwargs: Any) -> None:
        # Each error names its code on its class line; one that names none keeps its base's.
        super().__init_subclass__(**kwargs)
        if exit_code is not None:
            cls.exit_code = exit_code


class ConfigError(ReactorError, exit_code=2):
    """A setting, flag or hook specification is invalid."""


class UsageError(ReactorError, exit_code=2):
    """A command names something that does not exist, or asks what cannot be done to it."""


class DatabaseUnreachable(ReactorError, exit_code=3):
    """The database did not accept a connection at startup, even after retries."""


class DatabaseReadOnly(ReactorError, exit_code=3):
    """The database is a read-only hot standby, and the reactor writes: it needs the primary."""


class InstallLocked(ReactorError, exit_code=3):
    """A first install waited its bound for the install lock, and another session still holds it."""


class SchemaMissing(ReactorError, exit_code=4):
    """The reactor's schema is absent or older than this version needs."""


class UntrustedSchema(ReactorError, exit_code=2):
    """The reactor's schema holds, or lets others make, what its owner did not."""


class PrivilegeMissing(ReactorError, exit_code=5):
    """The database role lacks a privilege the reactor needs."""
