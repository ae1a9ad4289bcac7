"""held_rows: how soon after an outage the backlog is recorded around rows held by open
transactions.

Each round finishes a backlog of jobs with a 1 s grace, stops the embedded server at once (so
every job comes due while no replica can reach it), keeps it down, and starts it again. As it
comes back, three tabs begin saving three of the backlog's runs and keep their transactions
open; only then may the replicas reach the server, through a gate in front of it (until then
it closes every connection they make at once, as a server that is down does). The time is from
the server's start returning to the last of the rest of the backlog recorded; the held jobs
must still be the tabs' to write, and are theirs once they commit.

What it takes: the replicas' pool reconnecting (attempts half a second apart while calls
wait), the first record statement waiting out a held row's lock (0.5 s) and its parts finding
which (a tenth of a second a round of splitting).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import anyio.abc
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.conn import Conn, connect, scalar
from bench.result import Context, Result, Table, conditions, not_ours_to_stop
from bench.server import open_server
from bench.stats import ms, summarize
from bench.workload import bench_settings, replicas
from reactor.demo import EmbeddedPostgres

TITLE = "The backlog after an outage, around rows held by open transactions"
GOAL = (
    "the rest of the backlog recorded within 2 s of the server being back, with 3 of its rows "
    "held by open transactions, at 1 and at 3 replicas"
)
GOAL_SECONDS = 2.0

BACKLOG = 40
HELD = 3
GRACE_S = 1.0

FINISH = """
INSERT INTO analysis_jobs (id, run_id, status, doc_html, results)
SELECT g.id, g.run, 'complete', '<p>doc</p>', '{"verdicts": 1}'
  FROM unnest(%s::uuid[], %s::uuid[]) AS g(id, run)
"""

TAB_SAVE = """
INSERT INTO analysis_runs (id, job_id, doc_html, results, saved_by)
VALUES (%s, %s, '<p>tab</p>', '{}', 'client')
"""

RECORDED = "SELECT count(*) FROM analysis_runs WHERE id = ANY(%s) AND saved_by = 'worker'"
SAVED = "SELECT count(*) FROM analysis_runs WHERE id = ANY(%s) AND saved_by = 'client'"


class Gate:
    """A TCP forwarder to the server that, while shut, closes every connection it accepts."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.shut = False
        self.local_port = 0

    async def _serve(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            if self.shut:
                return
            try:
                upstream = await anyio.connect_tcp(self.host, self.port)
            except OSError:
                return
            async with upstream, anyio.create_task_group() as tg:

                async def pipe(
                    source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream
                ) -> None:
                    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                        async for chunk in source:
                            await sink.send(chunk)
                    tg.cancel_scope.cancel()

                tg.start_soon(pipe, client, upstream)
                tg.start_soon(pipe, upstream, client)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[Gate]:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.local_port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, self._serve)
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # Every failed connection while the server is down is a warning of the pool's and the
    # reactor's own; the figures are what matters.
    loggers = [logging.getLogger(name) for name in ("psycopg.pool", "reactor")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _through(dsn: str, port: int) -> str:
    return make_conninfo(dsn, host="127.0.0.1", port=str(port))


async def run(ctx: Context) -> Result:
    """Time the backlog's drain at each fleet size, round after round."""
    counts = (1,) if ctx.quick else (1, 3)
    rounds = 1 if ctx.quick else 3
    downtime = 2.0 if ctx.quick else 6.0
    settings: dict[str, Any] = {
        "backlog": BACKLOG,
        "held": HELD,
        "grace_s": GRACE_S,
        "downtime_s": downtime,
        "rounds": rounds,
        "replicas": counts,
    }
    drains: dict[int, list[float]] = {count: [] for count in counts}
    table = Table(["replicas", "rounds", "mean", "max", "goal"])
    with _quiet():
        async with open_server() as server:
            cond = await conditions(server, quick=ctx.quick)
            embedded = server.embedded
            if embedded is None:
                return not_ours_to_stop(table, settings=settings, conditions=cond)
            for count in counts:
                dsn = await server.app_database(f"held_rows_{count}", with_audit=False)
                params = conninfo_to_dict(dsn)
                gate_to = Gate(str(params.get("host") or "127.0.0.1"), int(str(params["port"])))
                async with gate_to.serving() as gate:
                    reactor_settings = bench_settings(
                        _through(dsn, gate.local_port),
                        grace=GRACE_S,
                        probe_interval=1.0,
                        probe_timeout=1.0,
                        scan_interval=30.0,
                        drain=2.0,
                    )
                    async with replicas(reactor_settings, count):
                        for _ in range(rounds):
                            drains[count].append(await _round(embedded, dsn, gate, downtime))

    figures: dict[str, Any] = {}
    for count, seconds in drains.items():
        stats = summarize(seconds)
        figures[str(count)] = {**stats, "each_s": seconds}
        mark = "met" if stats["max"] <= GOAL_SECONDS else "missed"
        table.add(count, len(seconds), ms(stats["mean"]), ms(stats["max"]), f"<= 2 s: {mark}")
    worst = max(max(seconds) for seconds in drains.values())
    return Result(
        met=worst <= GOAL_SECONDS,
        headline=f"the rest of the backlog recorded at most {worst:.2f} s after the server was "
        "back, the held rows still open",
        table=table,
        figures=figures,
        settings=settings,
        conditions=cond,
        notes=[
            f"Each round: {BACKLOG} jobs finish at once (grace {GRACE_S:g} s), the server stops "
            f"at once and stays down {downtime:g} s; as it is back, {HELD} tabs each insert "
            "the run of one of those jobs in a transaction they keep open, and then the "
            "replicas may reach it. The time runs from the start's return to the last of the "
            f"other {BACKLOG - HELD} runs written by a replica, read every 20 ms.",
            "Every round checks that the held jobs were not written while their tabs were open, "
            "and that they end with the tabs' rows once the tabs commit.",
        ],
    )


async def _round(embedded: EmbeddedPostgres, dsn: str, gate: Gate, downtime: float) -> float:
    jobs = [uuid.uuid4() for _ in range(BACKLOG)]
    runs = [uuid.uuid4() for _ in range(BACKLOG)]
    async with await connect(dsn, "app") as app:
        await app.execute(FINISH, (jobs, runs))
    gate.shut = True
    await anyio.to_thread.run_sync(embedded.stop, "fast")
    await anyio.sleep(downtime)
    await anyio.to_thread.run_sync(embedded.start)
    back = time.monotonic()
    held, rest = list(zip(jobs, runs, strict=True))[:HELD], runs[HELD:]
    async with contextlib.AsyncExitStack() as stack:
        tabs: list[Conn] = []
        for job, run in held:
            tab = await stack.enter_async_context(await connect(dsn, "tab", autocommit=False))
            await tab.execute(TAB_SAVE, (run, job))
            tabs.append(tab)
        gate.shut = False
        async with await connect(dsn, "check") as check:
            with anyio.fail_after(60):
                while True:
                    if await scalar(check, RECORDED, (rest,)) == len(rest):
                        break
                    await anyio.sleep(0.02)
            drained = time.monotonic() - back
            if await scalar(check, RECORDED, ([run for _, run in held],)):
                raise RuntimeError("a held job was written while its tab's transaction was open")
            for tab in tabs:
                await tab.commit()
            if await scalar(check, SAVED, ([run for _, run in held],)) != HELD:
                raise RuntimeError("a tab's save did not stand")
    return drained
