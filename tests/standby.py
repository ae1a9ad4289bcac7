"""A streaming hot standby for the tests that point the reactor at one, or fail over to one.

:func:`standby_of` makes one from a running embedded cluster (``pg_basebackup -R``) and starts
it on a port of its own; :func:`caught_up` waits until it has replayed everything the primary
wrote so far; :func:`multi_host` writes the DSN that lists several servers. Each standby is a
second cluster, so it costs about a second to make; the tests share one where they can.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Literal
from urllib.parse import quote

import psycopg
import psycopg.conninfo
import pytest

from reactor.demo.embedded import EmbeddedPostgres
from tests.conftest import Server
from tests.faults.support import connect, scalar, with_port
from tests.polling import wait_for


@contextmanager
def standby_of(
    primary: EmbeddedPostgres, *, settings: Mapping[str, str] | None = None
) -> Iterator[EmbeddedPostgres]:
    """A running hot standby of ``primary``, removed on the way out."""
    replica = primary.standby(settings=settings)
    try:
        replica.start()
        yield replica
    finally:
        replica.cleanup()


def embedded_of(server: Server) -> EmbeddedPostgres:
    """The test server's process, or a skip when it is not ours to copy."""
    if server.embedded is None:
        pytest.skip("the test server is not an embedded cluster this process can copy")
    return server.embedded


def on(standby: EmbeddedPostgres, dsn: str) -> str:
    """``dsn`` (a database of the primary) pointed at the same database on ``standby``."""
    return with_port(dsn, standby.port)


def caught_up(primary_dsn: str, standby_dsn: str, *, timeout: float = 30.0) -> None:
    """Wait until the standby has replayed all the WAL the primary had written when called
    (a database created just before, the rows committed just before)."""
    with connect(primary_dsn) as primary:
        lsn = str(scalar(primary, "SELECT pg_current_wal_insert_lsn()"))

    def replayed() -> bool:
        try:
            with connect(standby_dsn) as standby:
                return bool(
                    scalar(standby, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,))
                )
        except psycopg.OperationalError:  # the database itself is not replayed yet
            return False

    # The standby's own state, polled: nothing signals a replay position.
    wait_for(replayed, timeout, f"the standby replaying up to {lsn}")


def multi_host(
    dsn: str, *ports: int, form: Literal["url", "keywords"] = "url", **params: str
) -> str:
    """``dsn``'s database on 127.0.0.1 at each of ``ports`` in turn, with
    ``target_session_attrs=read-write`` unless ``params`` say otherwise: as a URL
    (``postgresql://u@h1:p1,h2:p2/db?...``) or as keywords (``host=h1,h2 port=p1,p2 ...``)."""
    given = psycopg.conninfo.conninfo_to_dict(dsn)
    options = {"target_session_attrs": "read-write", **params}
    if form == "keywords":
        return psycopg.conninfo.make_conninfo(
            dsn,
            host=",".join("127.0.0.1" for _ in ports),
            port=",".join(map(str, ports)),
            **options,
        )
    auth = quote(str(given.get("user") or "postgres"), safe="")
    if given.get("password"):
        auth += ":" + quote(str(given["password"]), safe="")
    hosts = ",".join(f"127.0.0.1:{port}" for port in ports)
    query = "&".join(f"{name}={value}" for name, value in options.items())
    return f"postgresql://{auth}@{hosts}/{given['dbname']}" + (f"?{query}" if query else "")
