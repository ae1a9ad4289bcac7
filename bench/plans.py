"""A statement's plan as PostgreSQL ran it: what a benchmark records beside its time.

Buffers and scans tell a figure's cause, and unlike times they do not move with the load of a
shared machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from bench.conn import Conn


async def explain(conn: Conn, query: str, params: Any = None) -> dict[str, Any]:
    """``query``'s plan from EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON): it runs the statement."""
    cur = await conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params)
    row = await cur.fetchone()
    assert row is not None, query
    plan: dict[str, Any] = row[0][0]
    return plan


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``node`` and every node below it, depth first."""
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)
