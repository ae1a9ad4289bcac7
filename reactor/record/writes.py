"""Whether a pair's record statements can write: the truth /readyz, the heartbeat and
`reactor status` tell about it.

A pair whose statements fail on its own objects (a column or a table gone, a privilege
revoked, a mapping that renders a statement PostgreSQL refuses) writes nothing, however well
its LISTEN session and its health checks do. Such a failure repeats for every batch until
someone repairs it, so it is judged from the failures in a row: pure, with the time passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

# SQLSTATE classes of the errors that say the statement does not fit the database's objects
# or grants: syntax error or access rule violation (42: an undefined table or column, a
# duplicate column, a privilege), invalid grantor (0L) and invalid authorization (28).
BROKEN_CLASSES = frozenset({"42", "0L", "28"})

# Failures of such a class in a row that mark the pair as unable to write: one could be a
# statement racing a migration; the second, a second or two later, is the objects themselves.
BROKEN_AFTER = 2

# How long any other error may repeat, statement after statement with the same first line,
# before the pair is judged unable to write: a connection cut short or a cancelled statement
# is over in seconds, one that fails every batch for half a minute is not.
REPEATED_FOR_S = 30.0


def is_broken_state(sqlstate: str | None) -> bool:
    """True when ``sqlstate`` says the statement does not fit the database's objects or grants."""
    return sqlstate is not None and sqlstate[:2] in BROKEN_CLASSES


@dataclass
class WriteHealth:
    """The record statements' failures in a row, and the verdict they give."""

    # The first line of the error the statements fail with, while they fail with one.
    error: str | None = None
    sqlstate: str | None = None
    # Failures in a row with that error, and when the first of them came.
    failures: int = 0
    since: float = 0.0
    # When the last of them came: the verdict is taken then, not at any later read.
    last: float = 0.0

    def failed(self, error: str, sqlstate: str | None, now: float) -> None:
        """A record statement failed with ``error`` (its first line) at ``now``."""
        if error != self.error:
            self.error, self.sqlstate, self.failures, self.since = error, sqlstate, 0, now
        self.failures += 1
        self.last = now

    def succeeded(self) -> None:
        """A record statement succeeded: the pair writes."""
        self.error, self.sqlstate, self.failures = None, None, 0

    @property
    def problem(self) -> str | None:
        """The error that keeps the pair from writing, or None while it can write."""
        if self.error is None or self.failures < BROKEN_AFTER:
            return None
        if is_broken_state(self.sqlstate) or self.last - self.since >= REPEATED_FOR_S:
            return self.error
        return None
