"""The pairs benchmark's databases, each with the three pairs installed, and the reactors
running on them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio

from bench.conn import connect
from bench.pairs.plan import (
    PAIRS,
)
from bench.server import Server
from reactor import db
from reactor.install import Install
from reactor.testing import (
    REFERENCE,
    Reactor,
    Replica,
    audit,
    mapping_file,
)


def _document(pair: str) -> dict[str, Any]:
    """The mapping of a copy of the reference tables, with a reactor schema of its own."""
    return {
        "reactor_schema": f"reactor_{pair}",
        "jobs": {
            "table": f"analysis_jobs_{pair}",
            "deleted_at": "deleted_at",
            "not_null": ["doc_html", "results"],
            "not_empty": ["results"],
        },
        "runs": {"table": f"analysis_runs_{pair}"},
    }


async def pair_database(server: Server, label: str) -> tuple[str, dict[str, Install]]:
    """A database with the three pairs installed, and the run audit on every runs table."""
    dsn = await server.app_database(label)
    installs: dict[str, Install] = {}
    async with await connect(dsn, "setup") as conn:
        installs["a"] = (await db.migrate(conn, REFERENCE)).install
        for pair in PAIRS[1:]:
            await conn.execute(
                f"CREATE TABLE analysis_jobs_{pair} (LIKE analysis_jobs INCLUDING ALL);"
                f"CREATE TABLE analysis_runs_{pair} (LIKE analysis_runs INCLUDING ALL)"
            )
            parsed = mapping_file.parse(_document(pair), source=f"pair {pair}")
            installs[pair] = (await db.migrate(conn, parsed)).install
            await audit.install(conn, installs[pair].mapping)
    return dsn, installs


@asynccontextmanager
async def running(replicas: Sequence[Replica]) -> AsyncIterator[None]:
    """Run ``replicas`` for the block; stop them all at once on the way out, as a process (or
    a fleet) stops, each then draining."""
    async with AsyncExitStack() as stack:
        for replica in replicas:
            await stack.enter_async_context(replica.running())
        try:
            yield
        finally:
            for replica in replicas:
                replica.stop()


async def wait_for_first_scans(reactors: Sequence[Reactor], within: float = 30.0) -> None:
    with anyio.fail_after(within):
        while any(r.scans < 1 for r in reactors):  # noqa: ASYNC110 - a counter, not an event
            await anyio.sleep(0.05)


def record_errors(reactor: Reactor) -> float:
    found = reactor.metrics.registry.get_sample_value("reactor_record_errors_total")
    return found or 0.0
