"""The benchmark's PostgreSQL (embedded, or DATABASE_URL's server) and its scratch databases.

A benchmark gets its own server from :func:`open_server`, creates the databases it measures on
(:meth:`Server.app_database`: the app's tables, every migration, the audit trigger), and leaves
them to be dropped when the server closes.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import psycopg
import psycopg.conninfo

from bench.conn import connect, scalar
from reactor import db
from reactor.demo import EmbeddedPostgres
from reactor.install import REFERENCE_INSTALL
from reactor.testing import REFERENCE, audit

# The embedded server's settings on top of EmbeddedPostgres' own (fsync and full_page_writes
# off: a throwaway cluster). Room for the bulk loads of catchup and scan_scale.
SERVER_SETTINGS: Mapping[str, str] = {
    "shared_buffers": "512MB",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "30min",
}

# What a benchmark that counts statements needs of its server.
STAT_STATEMENTS: Mapping[str, str] = {"shared_preload_libraries": "pg_stat_statements"}

# Server settings recorded with every result, whichever server ran it.
_SHOWN = (
    "server_version",
    "shared_buffers",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_level",
    "max_wal_size",
    "autovacuum",
    "default_toast_compression",
    "shared_preload_libraries",
    "max_connections",
)


class Server:
    """One PostgreSQL for one benchmark, and the scratch databases made on it."""

    def __init__(self, admin_dsn: str, embedded: EmbeddedPostgres | None) -> None:
        self.admin_dsn = admin_dsn
        self.embedded = embedded
        self._scratch: list[str] = []

    @property
    def source(self) -> str:
        """Where the server came from, for the conditions."""
        return "embedded" if self.embedded is not None else "DATABASE_URL"

    @property
    def bin_dir(self) -> Path:
        """Client binaries (pgbench) matching the embedded server; also used for DATABASE_URL."""
        if self.embedded is not None:
            return self.embedded.bin_dir
        return EmbeddedPostgres().bin_dir

    def dsn_for(self, dbname: str) -> str:
        """A DSN for ``dbname`` on this server."""
        return psycopg.conninfo.make_conninfo(self.admin_dsn, dbname=dbname)

    async def create_database(self, label: str, *, template: str | None = None) -> str:
        """A new scratch database (dropped when the server closes); returns its name."""
        name = f"bench_{label}_{secrets.token_hex(3)}"
        clause = f" TEMPLATE {template} STRATEGY FILE_COPY" if template else ""
        async with await connect(self.admin_dsn, "admin") as conn:
            await conn.execute(f"CREATE DATABASE {name}{clause}")
        self._scratch.append(name)
        return name

    async def drop_database(self, name: str) -> None:
        """Drop one scratch database now."""
        async with await connect(self.admin_dsn, "admin") as conn:
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        if name in self._scratch:
            self._scratch.remove(name)

    async def app_database(
        self, label: str, *, with_audit: bool = True, notify: bool = True, spread: bool = False
    ) -> str:
        """A scratch database with the app's tables, every migration, and the audit trigger;
        with ``notify`` False, the job trigger is installed not to notify; with ``spread``, it
        notifies each share of the jobs on a channel of its own (`reactor migrate --spread`)."""
        dsn = self.dsn_for(await self.create_database(label))
        async with await connect(dsn, "setup") as conn:
            await db.migrate(conn, REFERENCE, reference_schema=True, notify=notify, spread=spread)
            if with_audit:
                await audit.install(conn, REFERENCE_INSTALL.mapping)
            await conn.execute(DOC_FUNCTION)
        return dsn

    async def info(self) -> dict[str, str]:
        """The server settings that matter for the figures."""
        async with await connect(self.admin_dsn, "admin") as conn:
            shown = {}
            for name in _SHOWN:
                cur = await conn.execute(f"SHOW {name}")
                row = await cur.fetchone()
                shown[name] = str(row[0]) if row else ""
            return shown

    async def postmaster_pid(self) -> int | None:
        """The server's postmaster, when it runs on this machine (its ``postmaster.pid`` is
        readable here), else None: what :func:`cpu_by_process` reads the server's CPU from."""
        async with await connect(self.admin_dsn, "admin") as conn:
            data_dir = str(await scalar(conn, "SHOW data_directory"))
        try:
            return int((Path(data_dir) / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    async def close(self) -> None:
        """Drop every scratch database still around."""
        for name in list(self._scratch):
            await self.drop_database(name)


@asynccontextmanager
async def open_server(settings: Mapping[str, str] | None = None) -> AsyncIterator[Server]:
    """The benchmark's server: ``DATABASE_URL``'s if set, else a fresh embedded cluster.

    ``settings`` apply to the embedded cluster only; a DATABASE_URL server runs as configured,
    and the conditions record what it actually had.
    """
    url = os.environ.get("DATABASE_URL")
    if url:
        server = Server(url, None)
        try:
            yield server
        finally:
            await server.close()
        return
    # Trusting 127.0.0.1, as the tests do: pgbench and the load generators connect over TCP.
    pg = EmbeddedPostgres(settings={**SERVER_SETTINGS, **(settings or {})}, trust_localhost=True)
    await anyio.to_thread.run_sync(pg.start)
    try:
        server = Server(pg.dsn, pg)
        try:
            yield server
        finally:
            await server.close()
    finally:
        await anyio.to_thread.run_sync(pg.cleanup)


# An HTML-like body of ``size`` bytes: citation paragraphs, mostly markup with a few random
# tokens, so it compresses roughly like real extracted HTML rather than to nothing.
DOC_FUNCTION = """
CREATE OR REPLACE FUNCTION bench_doc(seed int, size int) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT left(string_agg(format(
    '<p class="citation" id="c%1$s"><span class="author">%2$s et al.</span> (%3$s). '
    '<em class="title">On %4$s and its consequences</em>. '
    '<span class="journal">Journal of Applied Studies</span>, %5$s(%6$s), pp. %7$s-%8$s. '
    '<a href="https://doi.org/10.%9$s/%10$s">https://doi.org/10.%9$s/%10$s</a></p>' || chr(10),
    g, initcap(substr(h, 1, 8)), 1950 + (g * 7 + seed) % 75, substr(h, 9, 12), g % 90 + 1,
    g % 12 + 1, g % 400, g % 400 + 17, 1000 + g % 9000, substr(h, 21, 10)), ''), size)
  FROM (SELECT g, md5(seed || ':' || g) AS h FROM generate_series(1, size / 200 + 2) g) s
$$;
"""


async def stat_statements_problem(server: Server) -> str | None:
    """None when pg_stat_statements works on ``server`` (loaded by its settings); else why not."""
    try:
        async with await connect(server.admin_dsn, "count") as conn:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            await scalar(conn, "SELECT count(*) FROM pg_stat_statements")
    except psycopg.Error as error:
        return f"pg_stat_statements is not available on this server: {error}".splitlines()[0]
    return None


@asynccontextmanager
async def open_counting_server(
    settings: Mapping[str, str] | None = None,
) -> AsyncIterator[tuple[Server, str | None]]:
    """:func:`open_server` with pg_stat_statements loaded, and None when it works there, else
    why not (a DATABASE_URL server that does not load it): the benchmark then says so."""
    async with open_server({**STAT_STATEMENTS, **(settings or {})}) as server:
        yield server, await stat_statements_problem(server)
