"""The baseline: the backstop sweep of the article the reactor replaces, implemented faithfully.

Every tick (30 s in the article), a sweep detached from the tick and guarded against stacking
on itself claims the unpersisted runs with the article's query, oldest first,
``FOR UPDATE OF j SKIP LOCKED``, and writes them with ``INSERT ... ON CONFLICT DO NOTHING`` in
the same transaction, as ``saved_by = 'worker'``. The article does not say how many rows a
sweep takes; this one takes batches of ``limit`` until a batch comes back short, which is what
the reactor's own scan does and is the baseline's best case.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import anyio
import anyio.abc
import psycopg

from bench.conn import Conn, connect

log = logging.getLogger(__name__)

# The article's query, with psycopg placeholders for its $1 (grace, whole seconds) and $2.
ARTICLE_QUERY = """
SELECT j.id, j.run_id
  FROM analysis_jobs j
  LEFT JOIN analysis_runs r ON r.id = j.run_id
 WHERE j.status IN ('complete', 'failed')
   AND j.deleted_at IS NULL
   AND j.doc_html IS NOT NULL
   AND j.results IS NOT NULL
   AND j.results <> '{}'::jsonb
   AND j.updated_at < NOW() - (%(grace)s::int * INTERVAL '1 second')
   AND r.id IS NULL
 ORDER BY j.updated_at ASC
 LIMIT %(limit)s
 FOR UPDATE OF j SKIP LOCKED
"""

WRITE = """
INSERT INTO analysis_runs (id, job_id, doc_html, results, saved_by)
SELECT j.run_id, j.id, j.doc_html, j.results, 'worker'
  FROM analysis_jobs j
 WHERE j.id = ANY(%(ids)s::uuid[])
ON CONFLICT DO NOTHING
"""


class Sweep:
    """One container's sweeper: a tick loop that starts detached, non-stacking sweeps."""

    def __init__(
        self, dsn: str, *, grace: int, tick: float, limit: int = 500, phase: float = 0.0
    ) -> None:
        self.dsn = dsn
        self.grace = grace
        self.tick = tick
        self.limit = limit
        self.phase = phase  # seconds from start to the first tick
        self.in_flight = False
        self.sweeps = 0
        self.skipped = 0
        self.recorded = 0

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Tick for ever (cancel to stop); started once the sweep's connection is open."""
        async with await connect(self.dsn, "sweep", autocommit=False) as conn:
            task_status.started()
            next_tick = time.monotonic() + self.phase
            async with anyio.create_task_group() as tg:
                while True:
                    await anyio.sleep(max(0.0, next_tick - time.monotonic()))
                    next_tick += self.tick
                    if self.in_flight:
                        self.skipped += 1
                        continue
                    self.in_flight = True
                    tg.start_soon(self._sweep, conn)

    async def _sweep(self, conn: Conn) -> None:
        try:
            while True:
                written = await self.sweep_once(conn)
                if written < self.limit:
                    break
        except psycopg.Error as error:
            log.warning("sweep failed: %s", error)
        finally:
            self.sweeps += 1
            self.in_flight = False

    async def sweep_once(self, conn: Conn) -> int:
        """One claim-and-write transaction; returns how many rows it claimed."""
        params: dict[str, Any] = {"grace": self.grace, "limit": self.limit}
        async with conn.transaction():
            cur = await conn.execute(ARTICLE_QUERY, params)
            ids = [row[0] for row in await cur.fetchall()]
            if ids:
                cur = await conn.execute(WRITE, {"ids": ids})
                self.recorded += cur.rowcount
        return len(ids)


def phases(count: int, tick: float, seed: int) -> list[float]:
    """Independent random first-tick offsets, one per sweeper (containers start at will)."""
    rng = random.Random(seed)
    return [rng.uniform(0, tick) for _ in range(count)]
