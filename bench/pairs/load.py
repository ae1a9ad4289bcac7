"""A load phase of the pairs benchmark: fresh jobs finished on each pair by a child process,
and the lateness of their runs."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from bench.conn import Conn, connect
from bench.pairs.plan import (
    DOC_BYTES,
    FIRST_S,
)
from bench.processes import cpu_by_process
from bench.workload import RESULTS
from reactor.install import Install
from reactor.testing import (
    App,
)

# Per job, its first write by the reactor (the audit trigger's clock_timestamp()) past its due
# time, by the database clock; rendered in the pair's names by App.render.
LATENESS = """
SELECT extract(epoch FROM @j.updated_at@)::float8,
       extract(epoch FROM min(a.at) - (@j.updated_at@ + make_interval(secs => %(grace)s)))::float8
  FROM @audit@ a JOIN @jobs@ j ON @j.id@ = a.job_id
 WHERE a.saved_by = @worker@ AND @j.id@ = ANY(%(ids)s::@job_type@[])
 GROUP BY @j.id@, @j.updated_at@
"""


@dataclass
class Phase:
    """One load phase: each measured pair's lateness, what was left unrecorded, the load."""

    late: dict[str, list[float]]  # after the load's first second
    first: dict[str, list[float]]  # in its first second
    missing: dict[str, int]
    load: dict[str, dict[str, float]]
    cpu: dict[str, float]  # share of one core while the load ran, by process
    seconds: float  # from the load's start until every measured run was recorded

    @property
    def behind(self) -> float:
        """The most the load generator fell behind its schedule, in seconds."""
        return max(played["behind_s"] for played in self.load.values())


async def load_phase(
    dsn: str,
    installs: dict[str, Install],
    loaded: Sequence[str],
    measured: Sequence[str],
    *,
    grace: float,
    rate: float,
    load_s: float,
    postmaster: int | None,
) -> Phase:
    """Finish ``rate * load_s`` fresh jobs on each of the ``loaded`` pairs, at ``rate`` per
    second each; wait for the ``measured`` pairs' runs and read their lateness."""
    count = int(rate * load_s)
    apps = {p: App(installs[p].mapping) for p in loaded}
    ids: dict[str, list[str]] = {}
    async with await connect(dsn, "jobs") as conn:
        cur = await conn.execute("SELECT bench_doc(1, %s)", (DOC_BYTES,))
        row = await cur.fetchone()
        document = str(row[0]) if row else ""
        for p in loaded:
            ids[p] = [str(uuid.uuid4()) for _ in range(count)]
            runs = [apps[p].new_run() for _ in range(count)]
            await conn.execute(*apps[p].create(runs, jobs=ids[p], document=document))
            await conn.execute(f"ANALYZE {_table(installs[p].mapping.jobs.table)}")
    work = {}
    for p in loaded:
        finish = apps[p].finish(uuid.UUID(int=0), verdicts=RESULTS)
        params = {k: v for k, v in finish.params.items() if k != "jobs"}
        work[p] = {"query": finish.query, "params": params, "ids": ids[p]}
    before = _cpu(postmaster)
    started = time.monotonic()
    played, generator_cpu = await _play_elsewhere({"dsn": dsn, "rate": rate, "pairs": work})
    wall = time.monotonic() - started
    after = _cpu(postmaster)
    cpu = {who: (after[who] - before[who]) / wall for who in before}
    cpu["load generator"] = generator_cpu / wall
    async with await connect(dsn, "check") as conn:
        missing = await _wait_until_recorded(conn, [apps[p] for p in measured], grace + 60)
        late, first = {}, {}
        for p in measured:
            query = apps[p].render(LATENESS, parameters=True)
            cur = await conn.execute(query, {"grace": grace, "ids": ids[p]})
            rows = [(float(at), float(value)) for at, value in await cur.fetchall()]
            begun = min((at for at, _ in rows), default=0.0)
            late[p] = [value for at, value in rows if at >= begun + FIRST_S]
            first[p] = [value for at, value in rows if at < begun + FIRST_S]
    seconds = time.monotonic() - started
    missed = dict(zip(measured, missing, strict=True))
    return Phase(late, first, missed, played, cpu, seconds)


def _cpu(postmaster: int | None) -> dict[str, float]:
    """CPU seconds so far of this process (the reactors) and of the server's processes."""
    found = {"reactor process": time.process_time()}
    if postmaster is not None:
        found["server"] = sum(cpu_by_process([postmaster], children=True).values())
    return found


def _table(name: tuple[str, ...]) -> str:
    return ".".join(f'"{part}"' for part in name)


async def _wait_until_recorded(conn: Conn, apps: Sequence[App], within: float) -> list[int]:
    """Poll until none of ``apps``' jobs needs a run, or ``within`` seconds pass; returns what
    each has left."""
    missing = [0] * len(apps)
    with anyio.move_on_after(within):
        while True:
            for k, app in enumerate(apps):
                cur = await conn.execute(*app.unsettled())
                row = await cur.fetchone()
                missing[k] = int(row[0]) if row else 0
            if not any(missing):
                break
            await anyio.sleep(0.1)
    return missing


async def _play_elsewhere(spec: dict[str, Any]) -> tuple[dict[str, dict[str, float]], float]:
    """Run the load generator (``python -m bench.pairs``) in a child process; what it did
    for each pair, and its CPU seconds."""
    done = await anyio.run_process(
        [sys.executable, "-m", "bench.pairs"], input=json.dumps(spec).encode(), check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed: {done.stderr.decode()[-2000:]}")
    found = json.loads(done.stdout)
    played: dict[str, dict[str, float]] = found["pairs"]
    return played, float(found["cpu_s"])
