"""A PgBouncer in transaction mode in front of the test server, as a production pooler would be.

Debian's ``pgbouncer`` package provides the binary (``.ci/run`` installs it). The pooler trusts
its clients, as the embedded server does; ``auth_type = trust`` still wants each user in the
auth file, which also carries the password pgbouncer logs in to the server with (none for the
embedded server). Every database of the server is reachable through it under its own name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self

import psycopg
import psycopg.conninfo

from reactor.demo import embedded_root

# A role some tests create, with session defaults of its own; the auth file lets it in too.
HOSTILE_ROLE = "reactor_hostile_defaults"

# Small on purpose: app sessions and the reactor share few server connections, so whatever one
# client leaves behind on a server session, another is bound to meet.
POOL_SIZE = 4


def binary() -> str | None:
    """The pgbouncer executable, or None when it is not installed."""
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if Path(p).exists()), None
    )


class PgBouncer:
    """One pgbouncer process on 127.0.0.1:``port``, forwarding to ``server_host:server_port``."""

    def __init__(
        self,
        server_host: str,
        server_port: int,
        *,
        executable: str,
        user: str = "postgres",
        password: str = "",
    ) -> None:
        self.server = (server_host, server_port)
        self.executable = executable
        self.user = user
        self.password = password
        self.dir = Path(tempfile.mkdtemp(prefix="reactor-pgbouncer-"))
        self.port = _free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> str:
        """What pgbouncer logged so far."""
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def dsn_for(self, server_dsn: str, **overrides: str) -> str:
        """``server_dsn`` with host and port pointing at the pooler instead of the server."""
        return psycopg.conninfo.make_conninfo(
            server_dsn, host="127.0.0.1", port=str(self.port), **overrides
        )

    def start(self) -> Self:
        """Write the configuration, start pgbouncer and wait until it accepts connections."""
        host, port = self.server
        quoted = self.password.replace('"', '""')
        (self.dir / "userlist.txt").write_text(f'"{self.user}" "{quoted}"\n"{HOSTILE_ROLE}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={host} port={port}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {self.dir / 'userlist.txt'}",
                    "pool_mode = transaction",
                    f"default_pool_size = {POOL_SIZE}",
                    "max_client_conn = 1000",
                    f"logfile = {self.dir / 'pgbouncer.log'}",
                    f"pidfile = {self.dir / 'pgbouncer.pid'}",
                    f"admin_users = {self.user}",
                    "",
                ]
            )
        )
        command = [self.executable, "-q"]
        if os.geteuid() == 0:
            # pgbouncer refuses to run as root; run it as the embedded server's user.
            uid, gid = embedded_root.ensure_os_user()
            os.chown(self.dir, uid, gid)
            for entry in self.dir.iterdir():
                os.chown(entry, uid, gid)
            command += ["-u", embedded_root.OS_USER]
        self._proc = subprocess.Popen(
            [*command, str(self.dir / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 20
        while True:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                raise RuntimeError(f"pgbouncer exited at startup: {err}{self.log}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer is not listening: {self.log}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop pgbouncer and remove its files."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)  # SIGINT: shut down at once
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc is not None and self._proc.stderr is not None:
            self._proc.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
