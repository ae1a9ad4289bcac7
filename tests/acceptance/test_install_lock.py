"""`reactor migrate` takes turns by what no other role can hold: a role with nothing but
CONNECT that holds the advisory keys the reactor used to wait on keeps no migrate waiting on an
install, and on a first install (where only the advisory lock exists yet) the wait is bounded
and ends with one line naming the holder and exit 3."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

import psycopg
import psycopg.conninfo
import pytest

from reactor.db.migrations import MIGRATE_LOCK
from tests.acceptance.conftest import reactor_env, run_reactor
from tests.conftest import NewRole


@pytest.fixture
def stranger(new_login_role: NewRole) -> str:
    """A LOGIN role with no grants: it can connect (PUBLIC's CONNECT) and nothing more."""
    return new_login_role("stranger")


# The key the hook outbox's retention took turns by until it took none.
OLD_PURGE_LOCK = 0x7265_6170


@contextlib.contextmanager
def holding_the_old_keys(database_url: str, role: str) -> Iterator[int]:
    """As ``role``, hold the migrate and hook-purge advisory keys in a session; its pid."""
    dsn = psycopg.conninfo.make_conninfo(database_url, user=role)
    with psycopg.connect(dsn, autocommit=True) as conn:
        keys = (MIGRATE_LOCK, OLD_PURGE_LOCK)
        conn.execute("SELECT pg_advisory_lock(%s), pg_advisory_lock(%s)", keys)
        yield conn.info.backend_pid


def test_a_stranger_holding_the_old_keys_keeps_no_migrate_waiting_on_an_install(
    database_url: str, stranger: str
) -> None:
    with holding_the_old_keys(database_url, stranger):
        result = run_reactor("migrate", env=reactor_env(database_url), timeout=60)
        assert result.returncode == 0, result.stderr


# The bound, shortened for the test: the command's own is a minute. The module is patched before
# the CLI runs, in the process that runs it.
BOUND = 3.0
_PATCHED = (
    "import sys; import reactor.db.migrations as m; "
    f"m.FIRST_INSTALL_WAIT_S = {BOUND}; "
    "from reactor.cli import main; sys.argv[0] = 'reactor'; main()"
)


def test_a_first_install_gives_up_within_its_bound_naming_the_holder(
    empty_database_url: str, stranger: str
) -> None:
    with holding_the_old_keys(empty_database_url, stranger) as pid:
        began = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-c", _PATCHED, "migrate", "--reference-schema"],
            env=reactor_env(empty_database_url),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        took = time.monotonic() - began
        assert result.returncode == 3, result.stderr
        # The JSON log lines aside (the wait is logged as it begins), one line says why.
        lines = [line for line in result.stderr.splitlines() if not line.startswith("{")]
        assert len(lines) == 1, result.stderr
        assert f"pid {pid}" in lines[0], lines[0]
        assert f"user {stranger}" in lines[0], lines[0]
        assert "Traceback" not in result.stderr
        assert BOUND <= took < BOUND + 10, took
        with psycopg.connect(empty_database_url, autocommit=True) as conn:
            absent = conn.execute("SELECT to_regnamespace('reactor') IS NULL").fetchone()
            assert absent == (True,), "nothing was changed"
    # Once the stranger has gone, the same command installs.
    result = run_reactor("migrate", "--reference-schema", env=reactor_env(empty_database_url))
    assert result.returncode == 0, result.stderr
