"""Podman as this machine runs it, and the stand-in base image the Dockerfile is built on.

No Docker engine and no image registry here: the base (``python:3.11-slim`` by default) is
replaced by one made from Debian's packages with debootstrap, passed as the Dockerfile's
``BASE``. Debian's podman works as root with runc (crun fails on hybrid cgroups) and the
cgroupfs manager, and with rlimits the host's hard limits allow.

The base is kept between runs twice over: as a podman image of a name that carries its key, and
as a tarball under ``~/.cache/backstop-reactor`` (a new podman store imports it in seconds
rather than bootstrapping Debian again). The key covers the suite, the packages and the host's
CA bundle, which the base carries so that builds inside reach PyPI the way the host does.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests import tools

SUITE = "bookworm"
PACKAGES = ("python3", "python3-pip", "python3-venv", "ca-certificates")
MIRROR = os.environ.get("REACTOR_DEBIAN_MIRROR", "http://deb.debian.org/debian")
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "backstop-reactor"

# The flags every container command needs on this machine (see the module's docstring).
GLOBAL = ("--runtime", "runc", "--cgroup-manager", "cgroupfs")
RUN_LIMITS = ("--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096")


@dataclass(frozen=True)
class Podman:
    """The podman binary, and the commands this machine needs it run with."""

    binary: str

    def command(self, *args: str) -> list[str]:
        """The argv of ``podman ARGS``."""
        return [self.binary, *GLOBAL, *args]

    def run(
        self, *args: str, timeout: float = 120, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``podman ARGS`` to completion; with ``check``, AssertionError quoting its stderr."""
        result = subprocess.run(
            self.command(*args),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check:
            assert result.returncode == 0, f"podman {' '.join(args[:2])}: {result.stderr[-3000:]}"
        return result

    def image_size(self, name: str) -> int:
        """The bytes of image ``name``, its base's included."""
        return int(self.run("image", "inspect", name, "--format", "{{.Size}}").stdout)

    def has_image(self, name: str) -> bool:
        """Whether the store holds image ``name``."""
        return self.run("image", "exists", name, check=False).returncode == 0


def podman() -> Podman:
    """Podman, as root (the stand-in base needs debootstrap, and rootless podman a setup this
    machine lacks); skipped without it, failed under CI (.ci/run installs it)."""
    binary = shutil.which("podman")
    if binary is None or debootstrap() is None:
        tools.missing(
            "podman or debootstrap not found: apt-get install podman buildah runc debootstrap"
        )
    if os.geteuid() != 0:
        tools.missing("the container tests run podman and debootstrap as root")
    return Podman(binary)


def debootstrap() -> str | None:
    """debootstrap's path: it lives in /usr/sbin, which not every PATH holds."""
    return shutil.which("debootstrap") or shutil.which("debootstrap", path="/usr/sbin:/sbin")


def base_key() -> str:
    """What the stand-in base is made of, as a short hash: a change makes a new one."""
    digest = hashlib.sha256(" ".join((SUITE, *PACKAGES)).encode())
    digest.update(CA_BUNDLE.read_bytes())
    return digest.hexdigest()[:12]


def standin_base(engine: Podman) -> str:
    """The name of the stand-in base image, made (or imported from the cache) if missing."""
    key = base_key()
    name = f"localhost/backstop-reactor-base:{SUITE}-{key}"
    if engine.has_image(name):
        return name
    tarball = CACHE / f"base-{SUITE}-{key}.tar.gz"
    if not tarball.exists():
        _bootstrap(tarball)
    # The host's CA bundle is in it; uv reads SSL_CERT_FILE rather than the system store.
    engine.run(
        "import",
        "--change",
        f"ENV SSL_CERT_FILE={CA_BUNDLE}",
        str(tarball),
        name,
        timeout=300,
    )
    return name


def _bootstrap(tarball: Path) -> None:
    """Debian's minimal system with Python, made into ``tarball`` (written whole or not at all)."""
    with tempfile.TemporaryDirectory(prefix="reactor-base-") as folder:
        root = Path(folder) / "root"
        program = debootstrap()
        assert program is not None
        result = subprocess.run(
            [
                program,
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(root),
                MIRROR,
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert result.returncode == 0, f"debootstrap failed:\n{result.stdout[-3000:]}"
        _as_the_python_image(root)
        tarball.parent.mkdir(parents=True, exist_ok=True)
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(root), "-czf", str(partial), "."], check=True, timeout=600)
        partial.replace(tarball)


def _as_the_python_image(root: Path) -> None:
    """What the python image has and Debian's system lacks: pip may install into the system
    Python, ``python`` names it, and the host's CAs are trusted (TLS to the package registries
    goes through a proxy only the host's bundle knows)."""
    (root / "usr/lib/python3.11/EXTERNALLY-MANAGED").unlink(missing_ok=True)
    python = root / "usr/bin/python"
    python.unlink(missing_ok=True)
    python.symlink_to("python3")
    shutil.copyfile(CA_BUNDLE, root / CA_BUNDLE.relative_to("/"))
    # The packages debootstrap downloaded: the system needs them no more.
    for deb in (root / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()


def standin_bun(engine: Podman, base: str, binary: Path, version: str) -> str:
    """An image holding Bun where the official one does (/usr/local/bin/bun), on ``base``: the
    binary npm installed for examples/bun, which deploy/fly/Dockerfile copies out of it."""
    name = f"localhost/backstop-reactor-bun:{version}-{base.rpartition(':')[2]}"
    if engine.has_image(name):
        return name
    with tempfile.TemporaryDirectory(prefix="reactor-bun-") as folder:
        context = Path(folder)
        shutil.copyfile(binary.resolve(), context / "bun")
        (context / "bun").chmod(0o755)
        (context / "Dockerfile").write_text(f"FROM {base}\nCOPY bun /usr/local/bin/bun\n")
        engine.run(
            "build", "--isolation=chroot", "--pull=never", "-t", name, str(context), timeout=600
        )
    return name
