"""What a failed record statement says about its batch, read from psycopg's errors here, so that
the recorder decides from a verdict and never looks at a psycopg class itself.

- A **timeout**: the statement gave up on a row lock, or ran out of time. Something in the batch
  is held or heavy; the rest of the batch most likely is not.
- A **row** error: the data of a row in the statement caused it (the app's CHECK, NOT NULL,
  foreign key or trigger rejects a run row). Only that row is at fault.
- A **broken** statement: it does not fit the database's objects or grants (a table or a column
  gone, a grant revoked), and fails the same way for every job until someone repairs it.
- Anything else (the connection, a read-only standby) fails every row alike and is retried
  whole.
"""

from __future__ import annotations

from typing import Literal, TypeGuard

import psycopg
import psycopg.errors

from reactor.record.writes import is_broken_state

# A statement that gave up on a row lock, or ran out of time.
TIMEOUTS = (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled)

# SQLSTATE classes of the errors that a row's own data causes: data exceptions (22), integrity
# violations (23: the app's CHECK, NOT NULL, foreign key or unique index), a value past a limit
# (54: an index row too large), and what an app's trigger raises (P0, 38, 39). Anything else
# (the connection, a privilege, a missing table, a read-only standby) fails every row alike
# and is retried whole.
ROW_ERROR_CLASSES = frozenset({"22", "23", "54", "P0", "38", "39"})

Verdict = Literal["timeout", "row", "other"]


def is_row_error(error: BaseException) -> TypeGuard[psycopg.Error]:
    """True when ``error`` is one that the data of a row in the statement can cause."""
    state = getattr(error, "sqlstate", None)
    return isinstance(error, psycopg.Error) and state is not None and state[:2] in ROW_ERROR_CLASSES


def is_timeout(error: BaseException) -> bool:
    """True when ``error`` says the statement gave up on a row lock or ran out of time."""
    return isinstance(error, TIMEOUTS)


def is_broken_error(error: BaseException) -> bool:
    """True when ``error`` says the statement does not fit the database's objects or grants."""
    return isinstance(error, psycopg.Error) and is_broken_state(error.sqlstate)


def verdict(error: BaseException) -> Verdict:
    """What a failed record statement says about its batch: split it (a timeout: isolate the
    held row; a row error: set the bad row aside), or retry it whole."""
    if is_timeout(error):
        return "timeout"
    if is_row_error(error):
        return "row"
    return "other"
