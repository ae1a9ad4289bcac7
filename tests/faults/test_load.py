"""Load (slow only): 50,000 jobs go terminal within 60 s, three reactor processes, tabs saving
70%. Reports lateness, each replica's peak RSS and the database's CPU time."""

from __future__ import annotations

import random
import time
from typing import Any

import anyio
import psutil  # type: ignore[import-untyped]  # no stubs installed; a test-only use
import pytest

from tests.conftest import Server
from tests.faults.conftest import Report
from tests.faults.support import Replicas, connect, listeners, replica_env, settle
from tests.faults.tables import JobId, Tables
from tests.polling import wait_for

JOBS = 50_000
SECONDS = 60.0
GRACE = 5.0
STEP = 0.1


class Sampler:
    """Peak RSS of the replicas and CPU seconds of the server's processes, sampled."""

    def __init__(self, replica_pids: list[int], postmaster: int | None) -> None:
        self.replicas = {pid: psutil.Process(pid) for pid in replica_pids}
        self.peak_rss = dict.fromkeys(replica_pids, 0)
        self.postmaster = psutil.Process(postmaster) if postmaster else None
        self.cpu: dict[int, float] = {}
        self.cpu_start: dict[int, float] = {}

    def sample(self) -> None:
        for pid, proc in self.replicas.items():
            try:
                self.peak_rss[pid] = max(self.peak_rss[pid], proc.memory_info().rss)
            except psutil.NoSuchProcess:
                continue
        if self.postmaster is None:
            return
        for proc in [self.postmaster, *self.postmaster.children(recursive=True)]:
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            used = times.user + times.system
            self.cpu_start.setdefault(proc.pid, used)
            self.cpu[proc.pid] = used

    @property
    def database_cpu(self) -> float:
        return sum(self.cpu[pid] - self.cpu_start[pid] for pid in self.cpu)


@pytest.mark.slow
def test_fifty_thousand_jobs_in_a_minute(
    database_url: str, tables: Tables, server: Server, replicas: Replicas, report: Report
) -> None:
    rng = random.Random(41)
    with connect(database_url) as conn:
        with conn.transaction():
            ids = [tables.add_job(conn, doc="<p>" + "x" * 300 + "</p>")[0] for _ in range(JOBS)]
        env = replica_env(database_url, tables, REACTOR_GRACE_SECONDS=str(GRACE))
        started = [replicas.start(env, f"load{i}") for i in range(3)]
        wait_for(lambda: listeners(conn) >= 3, 30, "three replicas listening")
        postmaster = server.embedded.postmaster_pid() if server.embedded else None
        sampler = Sampler([r.pid for r in started], postmaster)
        sampler.sample()
        per_step = int(JOBS * STEP / SECONDS)
        saves: list[tuple[float, list[JobId]]] = []
        begin = time.monotonic()
        for offset in range(0, JOBS, per_step):
            batch = ids[offset : offset + per_step]
            tables.finish(conn, *batch)
            saves.append((time.monotonic() + 0.3 * GRACE, [j for j in batch if rng.random() < 0.7]))
            while saves and saves[0][0] <= time.monotonic():
                tables.client_save(conn, *saves.pop(0)[1])
            sampler.sample()
            time.sleep(max(0.0, begin + (offset // per_step + 1) * STEP - time.monotonic()))
        finished_in = time.monotonic() - begin
        for at, batch in saves:
            time.sleep(max(0.0, at - time.monotonic()))
            tables.client_save(conn, *batch)
            sampler.sample()
        time.sleep(GRACE)

        async def settled() -> Any:
            async with anyio.create_task_group() as tg:

                async def sample_loop() -> None:
                    while True:
                        sampler.sample()
                        await anyio.sleep(0.5)

                tg.start_soon(sample_loop)
                result = await settle(database_url, GRACE, within=120, mapping=tables.mapping)
                tg.cancel_scope.cancel()
            return result

        judgement, took = anyio.run(settled, backend="asyncio")
    v = judgement.verdict
    rss = ", ".join(f"{b / 1e6:.0f}" for b in sampler.peak_rss.values())
    report(
        "load: 50k jobs in 60 s, 3 replicas",
        1,
        judgement,
        recovery=took,
        note=(
            f"finished in {finished_in:.0f}s; lateness p50 {v.lateness_p50:.2f}s; "
            f"peak RSS MB {rss}; database CPU {sampler.database_cpu:.0f}s"
        ),
    )
    assert judgement.clean, str(judgement)
    assert v.lateness_max is not None
    assert v.lateness_max < 30
