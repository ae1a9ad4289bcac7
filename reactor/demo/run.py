"""``reactor demo``: the whole loop on an embedded PostgreSQL, in well under a minute.

A worker finishes jobs at a steady rate while browser tabs save most of them within the grace
window; reactor replicas record the rest. Midway every replica stops (an outage: the timers they
hold in memory are gone, as after a kill -9) while jobs keep finishing; fresh replicas then
start, and their startup scan and re-arm recover what was missed. The summary is counted from
the database by an audit trigger, not taken from the reactor's word.
"""

from __future__ import annotations

import logging
import random
import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import psycopg
import psycopg.errors
from rich.console import Console
from rich.live import Live

from reactor import db
from reactor.demo.embedded import EmbeddedPostgres
from reactor.demo.view import Scoreboard, refresh, report
from reactor.errors import ConfigError
from reactor.install.mapping import REFERENCE, Mapping
from reactor.ops import http
from reactor.ops.dashboard import Dashboard
from reactor.runtime.replica import Replica, open_replica
from reactor.settings.config import Settings
from reactor.settings.pairs import Pair
from reactor.settings.parsers import address
from reactor.settings.table import DASHBOARD_ADDR
from reactor.telemetry.metrics import Metrics
from reactor.testing import audit
from reactor.testing.app import App

# Where the page is served while the demo runs: the reactor's own default for the page
# (REACTOR_DASHBOARD_ADDR). The demo serves no probes: its replicas come and go.
DEMO_HTTP_ADDR = address(DASHBOARD_ADDR)("REACTOR_DASHBOARD_ADDR", DASHBOARD_ADDR)

# What the worker's jobs carry: a page of a document, and the verdicts they end with.
_PAGE = "<p>citation</p>" * 200
VERDICTS = '{"verdicts": [1, 2]}'


@dataclass(frozen=True)
class AppSchema:
    """The SQL file of the app's CREATE statements (``--schema``), read before anything starts."""

    path: str
    text: str

    @classmethod
    def read(cls, path: str) -> AppSchema:
        try:
            with open(path, encoding="utf-8") as file:
                return cls(path, file.read())
        except OSError as error:
            raise ConfigError(f"--schema {path}: {error.strerror}") from None


async def main(
    shapes: Mapping | Sequence[Mapping] = REFERENCE,
    *,
    jobs: int,
    grace: float,
    save_ratio: float,
    replicas: int = 2,
    as_json: bool = False,
    hold: bool = False,
    http_addr: tuple[str, int] | None = DEMO_HTTP_ADDR,
    schema: AppSchema | None = None,
) -> int:
    """Run the demo; exit code 0 when every invariant held. The operator's page is served on
    ``http_addr`` (another free port when that one is taken) while it runs; with ``hold``, the
    cluster, a fresh fleet and the page stay up after the summary until SIGINT or SIGTERM.

    It runs on the app's tables each of ``shapes`` maps: one pair, or several served by each
    replica side by side (``jobs`` is per pair; the page shows one pair, so several have
    none). ``schema`` creates them on the embedded cluster first; without it the reference
    tables are created."""
    shapes = (shapes,) if isinstance(shapes, Mapping) else tuple(shapes)
    console = Console(stderr=as_json)
    # The live view tells the story; per-run log lines would scroll it away.
    logging.getLogger("reactor").setLevel(logging.WARNING)
    started = time.monotonic()
    each = f" in each of {len(shapes)} job/artifact pairs" if len(shapes) > 1 else ""
    console.print(
        f"[bold]backstop-reactor demo[/]: {jobs} jobs{each}, grace {grace:g} s, "
        f"{replicas} replicas, tabs save {save_ratio:.0%}"
    )
    # Socket-only, in a folder of mode 0700: no one else on the machine may connect to this
    # cluster, whose superuser needs no password (see reactor.demo.embedded).
    pg = EmbeddedPostgres()
    await anyio.to_thread.run_sync(pg.start)
    try:
        console.print(f"embedded PostgreSQL {pg.version}, on a Unix socket only you can reach")
        for shape in shapes:
            if shape.source is not None:
                console.print(
                    f"the app's tables: {shape.jobs_shown} -> {shape.runs_shown}, "
                    f"mapped by {shape.source}"
                )
        settings = Settings(database_url=pg.dsn, grace=grace, http_addr=None)
        pairs: list[Pair] = []
        apps: dict[str, App] = {}
        async with await db.connect(pg.dsn, "demo") as conn:
            if schema is not None:
                await _create_tables(conn, schema)
            for shape in shapes:
                # The reference tables are made here unless the app's SQL made them.
                reference = schema is None or shape.is_reference
                install = (await db.migrate(conn, shape, reference_schema=reference)).install
                await audit.install(conn, install.mapping)
                pairs.append(Pair(install, settings))
                apps[install.schema] = await App.fit(conn, install.mapping)
        board = Scoreboard(jobs=jobs * len(pairs), replica_count=replicas)
        async with db.make_pool(pg.dsn, max_size=2) as pool:
            # The page reads through a pool of its own: it shows the backlog growing while no
            # replica runs.
            page = Dashboard(
                settings,
                db.Database.pooled(pairs[0].install, pool, settings=settings),
                lambda: board.replicas[0] if board.replicas else None,
            )
            shown = _free(http_addr) if len(pairs) == 1 else None
            async with http.serving_page(page, shown, variable="--http-addr") as bound:
                if bound is not None:
                    console.print(f"the operator's page: {http.page_url(*bound)}")
                with Live(
                    board.render(), console=console, refresh_per_second=8, transient=not as_json
                ) as live:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(refresh, live, board)
                        await _play(
                            pairs, apps, settings, board, save_ratio, jobs, live.console.print
                        )
                        tg.cancel_scope.cancel()
                verdicts: dict[str, audit.Verdict] = {}
                async with await db.connect(pg.dsn, "demo") as conn:
                    for pair in pairs:
                        verdicts[pair.name] = await audit.verdict(conn, pair.install.mapping, grace)
                report(console, verdicts, time.monotonic() - started, as_json)
                if hold:
                    await _hold(console, pg, settings, pairs, board, bound)
                elif not as_json:
                    # What goes with the demo, and how to keep it: the page it advertised.
                    what = "PostgreSQL and the page stop" if bound else "PostgreSQL stops"
                    them = "them" if bound else "it"
                    console.print(f"{what} as the demo exits.")
                    console.print(f"To keep {them} up until Ctrl-C: reactor demo --hold")
    finally:
        await anyio.to_thread.run_sync(pg.cleanup)
    return 0 if all(verdict.clean for verdict in verdicts.values()) else 1


def _free(addr: tuple[str, int] | None) -> tuple[str, int] | None:
    # The demo's page is a convenience: a taken port moves it to a free one.
    if addr is None or addr[1] == 0:
        return addr
    with socket.socket(socket.AF_INET6 if ":" in addr[0] else socket.AF_INET) as probe:
        try:
            probe.bind(addr)
        except OSError:
            return addr[0], 0
    return addr


async def _hold(
    console: Console,
    pg: EmbeddedPostgres,
    settings: Settings,
    pairs: Sequence[Pair],
    board: Scoreboard,
    bound: tuple[str, int] | None,
) -> None:
    """Keep the cluster, a fresh fleet and the page up until SIGINT or SIGTERM."""
    where = f" and {http.page_url(*bound)}" if bound else ""
    # Said once it holds: the fleet is up and Ctrl-C is ours to handle.
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as tg:
            fleet = await _start_fleet(tg, settings, pairs, board)
            # The socket's folder lets in this user (and root) alone, which is what makes a
            # superuser without a password safe to hold up; the command says how to get in.
            console.print(f"holding: PostgreSQL{where} stay up; Ctrl-C ends it")
            # soft_wrap: one line whatever the width, to copy and paste.
            console.print(
                f"connect as this user (or root): psql -h {pg.socket_dir} -p {pg.port} -U postgres",
                soft_wrap=True,
            )
            async for _ in signals:
                break
            board.replicas = []
            await fleet.stop()


async def _play(
    pairs: Sequence[Pair],
    apps: dict[str, App],
    settings: Settings,
    board: Scoreboard,
    save_ratio: float,
    jobs: int,
    say: Callable[[str], None],
) -> None:
    """Worker, tabs, an outage and a recovery; returns once nothing is left to record. With
    several pairs the worker finishes a job of each in turn (``apps``: each pair's, by name).
    ``say`` prints the outage and the recovery as they happen, above the live view, where they
    stay once it is gone."""
    dsn = settings.require_database()
    rng = random.Random(7)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as worker:
        job_ids = [await _create_jobs(apps[pair.name], worker, jobs) for pair in pairs]
        async with anyio.create_task_group() as tg:
            fleet = await _start_fleet(tg, settings, pairs, board)
            board.phase = "worker finishing jobs; tabs saving most of them"
            rate = max(board.jobs / 4.0, 1.0)  # jobs per second: the worker takes about 4 s
            for i in range(jobs):
                if i == jobs * 2 // 5:
                    await fleet.stop()
                    board.replicas, board.phase = [], "OUTAGE: no reactor replica running"
                    board.note("stopped every reactor replica: the timers they held are gone")
                    say(
                        f"stopped every replica at job {board.finished}: "
                        "the timers they held are gone"
                    )
                if i == jobs * 7 // 10:
                    fleet = await _start_fleet(tg, settings, pairs, board)
                    board.phase = "recovered: fresh replicas re-armed from the database"
                    board.note("started fresh replicas: startup scan + re-arm from the database")
                    say(
                        f"started fresh replicas at job {board.finished}: "
                        "they re-arm from the database"
                    )
                for pair, ids in zip(pairs, job_ids, strict=True):
                    app, job_id = apps[pair.name], ids[i]
                    # A few jobs end with nothing to show, and need no run.
                    empty = rng.random() < 0.03
                    verdicts = app.empty(app.verdicts[0]) if empty else VERDICTS
                    await worker.execute(
                        *app.finish(job_id, failed=rng.random() < 0.1, verdicts=verdicts)
                    )
                    board.finished += 1
                    if not empty and rng.random() < save_ratio:
                        delay = rng.uniform(0.05, settings.grace * 0.6)
                        tg.start_soon(_tab_save, app, dsn, job_id, delay, board)
                    await anyio.sleep(1 / rate)
            board.phase = "waiting for the last grace windows"
            for pair in pairs:
                await _wait_until_settled(apps[pair.name], worker, settings.grace)
            board.note("nothing left to record")
            await fleet.stop()


class Fleet:
    """Reactor replicas that go away together, dropping the timers they hold in memory."""

    def __init__(self) -> None:
        self.replicas: list[tuple[Replica, anyio.Event]] = []

    async def stop(self) -> None:
        """Stop every replica as SIGTERM does, and wait until each has closed its connections.

        Intake stops at once and the timers in memory are gone, as after a kill -9; only the
        statements already in flight (milliseconds) finish. Cancelling the replicas outright
        would interrupt those statements, and psycopg logs each interrupted cancellation.
        """
        for replica, _ in self.replicas:
            replica.stop()
        for _, done in self.replicas:
            await done.wait()


async def _start_fleet(
    tg: anyio.abc.TaskGroup, settings: Settings, pairs: Sequence[Pair], board: Scoreboard
) -> Fleet:
    fleet = Fleet()
    for _ in range(board.replica_count):
        done = anyio.Event()
        replica = await tg.start(_replica, settings, pairs, board, done)
        board.replicas.extend(replica.reactors.values())
        fleet.replicas.append((replica, done))
    board.note(f"{board.replica_count} reactor replicas listening")
    return fleet


async def _replica(
    settings: Settings,
    pairs: Sequence[Pair],
    board: Scoreboard,
    done: anyio.Event,
    *,
    task_status: anyio.abc.TaskStatus[Replica],
) -> None:
    # One replica serving every pair, as `reactor run` serves them.
    def counted() -> Metrics:
        metrics = Metrics()
        board.metrics.append(metrics)
        return metrics

    try:
        async with (
            open_replica(settings, pairs, metrics=counted) as replica,
            anyio.create_task_group() as inner,
        ):
            await inner.start(replica.run)
            task_status.started(replica)
    finally:
        done.set()


async def _create_jobs(app: App, conn: psycopg.AsyncConnection[Any], count: int) -> list[Any]:
    """``count`` running jobs, each with a page of a document; their ids, oldest first."""
    try:
        cur = await conn.execute(*app.create(count=count, document=_PAGE))
    except psycopg.errors.IntegrityError as error:
        raise ConfigError(
            f"the demo cannot create a job in {app.mapping.jobs_shown}: {db.first_line(error)}; "
            "give the column a default in the --schema file"
        ) from None
    return [job_id for job_id, _ in await cur.fetchall()]


async def _tab_save(app: App, dsn: str, job_id: Any, delay: float, board: Scoreboard) -> None:
    await anyio.sleep(delay)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as tab:
        await tab.execute(*app.tab_save(job_id))
    board.tab_saves += 1


async def _wait_until_settled(app: App, conn: psycopg.AsyncConnection[Any], grace: float) -> None:
    # Settled: no job still needs a run, neither due nor inside its grace window.
    with anyio.fail_after(grace + 30):
        # The database is the only witness, so it is asked again until it says so.
        while True:
            cur = await conn.execute(*app.unsettled())
            row = await cur.fetchone()
            if not (row and row[0]):
                return
            await anyio.sleep(0.1)


async def _create_tables(conn: db.AnyConnection, schema: AppSchema) -> None:
    """Run the app's CREATE statements on the embedded cluster."""
    # pg_dump writes psql meta-commands (\restrict, \connect) that only psql understands.
    text = "\n".join(line for line in schema.text.splitlines() if not line.startswith("\\"))
    try:
        await conn.execute(text)
    except psycopg.Error as error:
        raise ConfigError(
            f"--schema {schema.path} failed on the demo's cluster: {db.first_line(error)}"
        ) from None
