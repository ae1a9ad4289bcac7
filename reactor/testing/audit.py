"""DESIGN.md's invariants, checked from the database rather than from what the reactor says.

``install`` adds an audit trigger to the runs table; ``verdict`` counts lost, duplicate,
clobbering, early, wrong and stale writes and the reactor's lateness from it. The demo, the
tests and the benchmarks share it, so all three judge the reactor the same way. Both are
rendered for the mapping they are given, like the reactor's own statements.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from reactor.db import AnyConnection
from reactor.install import sql
from reactor.install.mapping import Mapping


@dataclass(frozen=True)
class Verdict:
    """Counts over the whole database; every invariant count should be 0."""

    jobs: int
    saved_by_client: int
    saved_by_worker: int
    lost: int
    dup: int
    clobbered: int
    early: int
    wrong: int
    # Lateness of the worker's writes outside the excused stretches (run_audit_excused), and
    # the worst of all of them, excused or not.
    lateness_p50: float | None
    lateness_p99: float | None
    lateness_max: float | None
    lateness_max_overall: float | None
    # Jobs that need no run: not finished, deleted, or finished with nothing to show.
    needed_no_run: int
    # Worker rows that do not hold their run's last word once its grace has passed: an earlier
    # job's row beside a later one of the run, or an earlier finish's of a retried job.
    stale: int

    @property
    def clean(self) -> bool:
        """True when no invariant is broken."""
        return not (
            self.lost or self.dup or self.clobbered or self.early or self.wrong or self.stale
        )

    def as_dict(self) -> dict[str, Any]:
        """A plain dict, for JSON."""
        return asdict(self)


def ddl(mapping: Mapping) -> str:
    """The audit table and trigger for ``mapping``'s tables, idempotent."""
    return sql.render(sql.preamble("audit.sql"), mapping)


async def install(conn: AnyConnection, mapping: Mapping) -> None:
    """Create the audit table and trigger (idempotent)."""
    await conn.execute(ddl(mapping))


async def verdict(conn: AnyConnection, mapping: Mapping, grace: float) -> Verdict:
    """Count every invariant violation and measure lateness, by the database clock."""
    cur = await conn.execute(sql.queries("audit.sql", mapping)["verdict"], {"grace": grace})
    row = await cur.fetchone()
    assert row is not None
    return Verdict(*row)
