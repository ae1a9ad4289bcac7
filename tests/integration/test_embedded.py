"""The embedded PostgreSQL controller survives kill, restart and cleanup, on any bin folder."""

from pathlib import Path

import psycopg
import pytest

from reactor.embedded import EmbeddedPostgres

DEBIAN_PG15 = Path("/usr/lib/postgresql/15/bin")


def _scalar(dsn: str, sql: str) -> object:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0]


def test_kill_restart_and_cleanup() -> None:
    # synchronous_commit=on: otherwise a commit just before kill() may legitimately vanish.
    pg = EmbeddedPostgres(settings={"synchronous_commit": "on"})
    try:
        pg.start()
        port = pg.port
        assert pg.dsn == f"postgresql://postgres@127.0.0.1:{port}/postgres"
        assert _scalar(pg.dsn, "SELECT 1") == 1
        assert _scalar(pg.dsn, "SHOW max_connections") == "200"
        datadir = Path(str(_scalar(pg.dsn, "SHOW data_directory")))
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE survivor AS SELECT 42 AS answer")

        crashed_pid = pg.postmaster_pid()
        pg.kill()
        assert pg.postmaster_pid() is None
        pg.start()  # crash recovery on the same port, stale postmaster.pid left in place
        assert pg.port == port
        assert pg.postmaster_pid() not in (None, crashed_pid)
        assert _scalar(pg.dsn, "SELECT answer FROM survivor") == 42

        pg.restart()
        assert pg.port == port
        assert _scalar(pg.dsn_for("template1"), "SELECT current_database()") == "template1"
    finally:
        pg.cleanup()
    assert pg.postmaster_pid() is None
    assert not datadir.exists()


@pytest.mark.skipif(not DEBIAN_PG15.is_dir(), reason="Debian PostgreSQL 15 is not installed")
def test_other_bin_dir() -> None:
    with EmbeddedPostgres(bin_dir=DEBIAN_PG15) as pg:
        assert pg.bin_dir == DEBIAN_PG15
        assert pg.version.startswith("15")
        assert str(_scalar(pg.dsn, "SHOW server_version")).startswith("15")
