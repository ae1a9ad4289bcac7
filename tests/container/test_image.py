"""The image as it is deployed: built from the Dockerfile, run by podman beside a real PostgreSQL.

The Dockerfile is built on a stand-in base (tests/container/podman.py) and run with a read-only
root filesystem, no capability and host networking, so that the containers reach the suite's
PostgreSQL on 127.0.0.1. ``migrate`` runs as the tables' owner and ``run`` as the runtime role
``reactor migrate --print-grants`` grants; jobs finish, and every invariant is read from the
database's audit. deploy/fly/Dockerfile is built on that image, and runs the Bun worker and
the reactor as fly.toml's process groups say. The figures (the image's size over its base, its
time to ready, the drain, its memory and CPU) are written to ``REACTOR_IMAGE_REPORT`` (default:
``~/.cache/backstop-reactor/image-report.md``), which docs/deploying.md and
deploy/kubernetes quote.

Run by .ci/run as ``uv run pytest -n 0 -m container tests/container``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import subprocess
import time
import tomllib
import uuid
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from reactor.install import sql
from reactor.install.mapping import REFERENCE
from reactor.testing import audit
from tests import tools
from tests.conftest import Server
from tests.container.podman import (
    CACHE,
    RUN_LIMITS,
    Podman,
    podman,
    standin_base,
    standin_bun,
)
from tests.helpers import AUDIT_SQL, client_save, finish, grant_audit, new_job
from tests.polling import wait_for
from tests.ports import free_port, http_status

# Cold, the stand-in base is bootstrapped from Debian's packages first: minutes, not seconds.
pytestmark = [pytest.mark.container, pytest.mark.timeout(1200)]

IMAGE = "localhost/backstop-reactor:test"
UID = 10001
# The goals the image is held to: what it adds to its base, and what `reactor run` spends
# before it is ready (the measured figures, the time to ready among them, are in the report).
MAX_OVER_BASE = 40 * 1024 * 1024
MAX_READY_CPU_SECONDS = 1.0
GRACE = 1.0
DRAIN = 20.0


@dataclass(frozen=True)
class Built:
    """The image, its base and what they weigh."""

    engine: Podman
    base: str
    over_base: int
    build_seconds: float


@pytest.fixture(scope="module")
def figures() -> Iterator[dict[str, str]]:
    """The measured figures, by name; written to the report when the module is done."""
    found: dict[str, str] = {}
    yield found
    path = Path(os.environ.get("REACTOR_IMAGE_REPORT") or CACHE / "image-report.md")
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# The image, measured by tests/container", "", "| figure | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in found.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"\nimage figures written to {path}:\n" + "\n".join(lines))


@pytest.fixture(scope="module")
def image(figures: dict[str, str]) -> Built:
    """The Dockerfile built on the stand-in base (podman's layer cache makes a rebuild quick)."""
    engine = podman()
    started = time.monotonic()
    base = standin_base(engine)
    based = time.monotonic()
    engine.run(
        "build",
        "--isolation=chroot",
        "--network",
        "host",
        "--pull=never",
        # HEALTHCHECK is a Docker-format field: an OCI image would drop it.
        "--format",
        "docker",
        "--build-arg",
        f"BASE={base}",
        "--build-arg",
        f"REVISION={_revision()}",
        "-t",
        IMAGE,
        str(tools.ROOT),
        timeout=900,
    )
    built = time.monotonic()
    # The layers of builds older than a day that no tag holds any more: each build would
    # leave its own. A day's stay in the cache (the builder stage's layers among them, which
    # no tag holds) makes the next run's build quick.
    engine.run("image", "prune", "--force", "--filter", "until=24h", check=False)
    over = engine.image_size(IMAGE) - engine.image_size(base)
    figures["stand-in base ready (s)"] = f"{based - started:.1f}"
    figures["image build (s)"] = f"{built - based:.1f}"
    figures["image size over its base (MB)"] = f"{over / 1e6:.1f}"
    return Built(engine, base, over, built - based)


def _revision() -> str:
    result = subprocess.run(
        ["git", "rev-parse", "HEAD"],
        cwd=tools.ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() or "unknown"


def inspect(engine: Podman, name: str, kind: str = "image") -> dict[str, Any]:
    """``podman KIND inspect NAME`` as a dict."""
    (found,) = json.loads(engine.run(kind, "inspect", name).stdout)
    assert isinstance(found, dict)
    return found


def test_the_image_is_small_labelled_and_runs_as_a_number(image: Built) -> None:
    assert image.over_base <= MAX_OVER_BASE, f"{image.over_base / 1e6:.1f} MB over the base"
    found = inspect(image.engine, IMAGE)
    config = found["Config"]
    assert config["User"] == f"{UID}:{UID}"  # a number: runAsNonRoot can check it
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == _project_version()
    assert labels["org.opencontainers.image.revision"] == _revision()
    assert labels["org.opencontainers.image.licenses"] == "MIT"
    assert found["Healthcheck"]["Test"][0] == "CMD"  # podman shows it beside Config
    # What only the builder needs stays there: uv, and the terminal's tables (the cli extra).
    listed = python_in_image(
        image.engine,
        "import importlib.util as u, shutil;"
        "print(shutil.which('uv'), *(u.find_spec(m) for m in ('rich', 'pygments')))",
    )
    assert listed.split() == ["None", "None", "None"]


def python_in_image(engine: Podman, code: str) -> str:
    """What ``python -c CODE`` prints in a throwaway container of the image, with no network."""
    return engine.run(
        "run", "--rm", "--network", "none", *RUN_LIMITS, "--entrypoint", "python", IMAGE, "-c", code
    ).stdout


def _project_version() -> str:
    project = tomllib.loads((tools.ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    version = project["project"]["version"]
    assert isinstance(version, str)
    return version


# Inside the image: every file of the installed reactor and triggers packages, by its path in
# site-packages, with the sha256 a wheel's RECORD would give it.
_INSTALLED = """
import base64, hashlib, json, pathlib, reactor, triggers
site = pathlib.Path(reactor.__file__).parent.parent
found = {}
for package in (reactor, triggers):
    for path in pathlib.Path(package.__file__).parent.rglob('*'):
        if path.is_file() and '__pycache__' not in path.parts:
            digest = hashlib.sha256(path.read_bytes()).digest()
            found[str(path.relative_to(site))] = base64.urlsafe_b64encode(digest).decode()
print(json.dumps(found))
"""


def test_the_image_carries_the_wheels_code(image: Built, tmp_path: Path) -> None:
    built = subprocess.run(
        ["uv", "build", "--wheel", "--out-dir", str(tmp_path)],
        cwd=tools.ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = {
            name: base64.urlsafe_b64encode(hashlib.sha256(archive.read(name)).digest()).decode()
            for name in archive.namelist()
            if name.split("/")[0] in ("reactor", "triggers")
        }
    assert json.loads(python_in_image(image.engine, _INSTALLED)) == in_wheel


@dataclass(frozen=True)
class Roles:
    """A fresh database, with its owner (who migrates) and the runtime role (who runs)."""

    admin: str
    owner: str
    runtime: str


@pytest.fixture
def roles(server: Server, empty_database_url: str) -> Iterator[Roles]:
    if server.embedded is None:
        pytest.skip("needs the suite's own PostgreSQL on 127.0.0.1, trusting local roles")
    suffix = uuid.uuid4().hex[:8]
    owner, runtime = f"app_owner_{suffix}", f"reactor_rt_{suffix}"
    dbname = psycopg.conninfo.conninfo_to_dict(empty_database_url)["dbname"]
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {owner} LOGIN")
        conn.execute(f"CREATE ROLE {runtime} LOGIN")
        conn.execute(f"ALTER DATABASE {dbname} OWNER TO {owner}")
        conn.execute(f"ALTER SCHEMA public OWNER TO {owner}")
    yield Roles(
        empty_database_url,
        psycopg.conninfo.make_conninfo(empty_database_url, user=owner),
        psycopg.conninfo.make_conninfo(empty_database_url, user=runtime),
    )
    with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
        for role in (owner, runtime):
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def one_shot(engine: Podman, dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``reactor ARGS`` in a container of the image, to completion."""
    return engine.run(
        "run", "--rm", "--read-only", "--cap-drop=all", "--network", "host", *RUN_LIMITS,
        "-e", f"DATABASE_URL={dsn}", IMAGE, *args,
        check=False,
    )  # fmt: skip


@dataclass
class Running:
    """A ``reactor run`` container, its probes' port, and when it started."""

    name: str
    port: int
    started: float  # monotonic, when `podman run -d` returned: the container is running


@contextmanager
def reactor_container(
    engine: Podman, env: dict[str, str], command: Sequence[str] = (), image: str = IMAGE
) -> Iterator[Running]:
    """``reactor run`` (or ``command``, from the shell's path) in a detached container, as
    production runs it: read-only, no capability, no new privilege; removed afterwards."""
    name = f"reactor-test-{uuid.uuid4().hex[:8]}"
    port = free_port()
    variables = {
        "REACTOR_GRACE_SECONDS": str(GRACE),
        "REACTOR_DRAIN_SECONDS": str(DRAIN),
        **env,
        # Ports of their own: the containers share the host's network with everything else.
        "REACTOR_HTTP_ADDR": f"0.0.0.0:{port}",
        "REACTOR_DASHBOARD_ADDR": f"127.0.0.1:{free_port()}",
    }
    options = [arg for key, value in variables.items() for arg in ("-e", f"{key}={value}")]
    if command:
        options += ["--entrypoint", command[0]]
    engine.run(
        "run", "-d", "--name", name, "--read-only", "--cap-drop=all",
        "--security-opt", "no-new-privileges", "--network", "host", *RUN_LIMITS,
        *options, image, *command[1:],
    )  # fmt: skip
    try:
        yield Running(name, port, time.monotonic())
    finally:
        engine.run("rm", "--force", "--time", "0", name, check=False)


def ready_after(engine: Podman, running: Running) -> float:
    """Seconds from the container's start to /readyz answering 200."""

    def ready() -> bool:
        if http_status(f"http://127.0.0.1:{running.port}/readyz") == 200:
            return True
        state = inspect(engine, running.name, "container")["State"]
        assert state["Running"], engine.run("logs", running.name).stderr[-3000:]
        return False

    wait_for(ready, timeout=30, what="/readyz", interval=0.01)
    return time.monotonic() - running.started


def verdict(dsn: str) -> audit.Verdict:
    """The invariants, counted from the database's audit."""

    async def read() -> audit.Verdict:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await audit.verdict(conn, REFERENCE.in_public(), GRACE)

    return anyio.run(read)


def finish_jobs(dsn: str, count: int) -> None:
    """The app: ``count`` jobs finish, and a tab saves every third of them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for n in range(count):
            job, _ = new_job(conn)
            finish(conn, job)
            if n % 3 == 0:
                client_save(conn, job)


def all_recorded(dsn: str, jobs: int) -> audit.Verdict | None:
    """The verdict once each of ``jobs`` finished jobs has its run, a tab's or the reactor's."""
    found = verdict(dsn)
    done = found.jobs == found.saved_by_client + found.saved_by_worker == jobs
    return found if done and found.lost == 0 else None


def usage(engine: Podman, name: str) -> tuple[float, float]:
    """(peak resident MB, CPU seconds so far) of the container's process, from the host's
    /proc: what a Kubernetes request should cover."""
    pid = inspect(engine, name, "container")["State"]["Pid"]
    status = Path(f"/proc/{pid}/status").read_text()
    (peak,) = (line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    ticks = int(fields[11]) + int(fields[12])  # utime + stime
    return int(peak) / 1024, ticks / os.sysconf("SC_CLK_TCK")


def fly_process(field: str) -> list[str]:
    """A command of deploy/fly/fly.toml as argv: ``deploy.release_command`` or
    ``processes.NAME``."""
    config = tomllib.loads((tools.ROOT / "deploy/fly/fly.toml").read_text(encoding="utf-8"))
    table, _, key = field.partition(".")
    return shlex.split(config[table][key])


def test_deployed_migrate_as_owner_run_as_the_role_drain_and_hand_over(
    image: Built, roles: Roles, figures: dict[str, str]
) -> None:
    engine = image.engine
    # The app's tables, made by the app's own migrations, as their owner.
    with psycopg.connect(roles.owner, autocommit=True) as conn:
        conn.execute(sql.read("reference.sql"))
    # The migration as fly.toml's release command runs it: the owner's string from a variable
    # of its own, through the image's shell.
    release = fly_process("deploy.release_command")
    migrated = engine.run(
        "run", "--rm", "--read-only", "--cap-drop=all", "--network", "host", *RUN_LIMITS,
        "-e", f"MIGRATE_DATABASE_URL={roles.owner}", "--entrypoint", release[0], IMAGE,
        *release[1:],
        check=False,
    )  # fmt: skip
    assert migrated.returncode == 0, migrated.stderr
    grants = one_shot(engine, roles.owner, "migrate", "--print-grants", _user(roles.runtime))
    assert grants.returncode == 0, grants.stderr
    with psycopg.connect(roles.owner, autocommit=True) as conn:
        conn.execute(grants.stdout)
    # The audit's table and trigger, which the invariants are read from.
    with psycopg.connect(roles.admin, autocommit=True) as conn:
        conn.execute(AUDIT_SQL)
        grant_audit(conn, _user(roles.runtime))

    with reactor_container(engine, {"DATABASE_URL": roles.runtime}) as first:
        figures["time to /readyz from container start (s)"] = f"{ready_after(engine, first):.2f}"
        _, cpu_at_ready = usage(engine, first.name)
        figures["CPU spent by reactor run until ready (s)"] = f"{cpu_at_ready:.2f}"
        # What the start costs, whatever else the machine runs (the wall time above is the
        # figure; on a busy machine it measures the neighbours too).
        assert cpu_at_ready <= MAX_READY_CPU_SECONDS
        serving_since = time.monotonic()
        # The image's own HEALTHCHECK, as the engine runs it.
        checked = engine.run("healthcheck", "run", first.name, check=False)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert _in(engine, first, "id", "-u") == str(UID)
        # The page's templates (jinja2) are in the image: it answers on the container's loopback.
        page = _in(engine, first, "python", "-c", _PAGE_STATUS)
        assert page == "200"
        # The drawn table is the cli extra, which the image leaves out: the operator at the
        # container's shell gets it as plain text, and --json needs nothing more.
        table = engine.run("exec", first.name, "reactor", "status", check=False)
        assert table.returncode in (0, 1), table.stderr
        assert table.stdout.splitlines()[1].split() == ["check", "state", "value"]
        assert "LISTEN sessions" in table.stdout
        report = engine.run("exec", first.name, "reactor", "status", "--json", check=False)
        assert report.returncode in (0, 1), report.stderr
        assert json.loads(report.stdout)["jobs"] is not None

        finish_jobs(roles.admin, 20)
        found = wait_for(lambda: all_recorded(roles.admin, 20), timeout=60, what="20 runs")
        assert found.clean, found

        # A rolling deploy: the new container (started as fly.toml's reactor process starts
        # it) is ready beside the old one, the old one stops while jobs are still inside their
        # grace, and the new one records them.
        fly_env = {"RUNTIME_DATABASE_URL": roles.runtime}
        with reactor_container(engine, fly_env, fly_process("processes.reactor")) as second:
            ready_after(engine, second)
            finish_jobs(roles.admin, 10)
            peak_mb, cpu_at_stop = usage(engine, first.name)
            serving = time.monotonic() - serving_since
            drained = stop(engine, first)
            found = wait_for(lambda: all_recorded(roles.admin, 30), timeout=60, what="30 runs")
            assert found.clean, found
            # The shell of the process command exec'd the reactor: the signal reaches it.
            second_drained = stop(engine, second)
    figures["podman stop to exit 0, drain included (s)"] = (
        f"{drained:.2f} (the Fly process: {second_drained:.2f})"
    )
    figures["peak RSS of reactor run (MB)"] = f"{peak_mb:.0f}"
    figures["CPU while serving 30 jobs, from ready to stop (% of a core)"] = (
        f"{100 * (cpu_at_stop - cpu_at_ready) / serving:.1f} over {serving:.1f} s"
    )
    figures["runs recorded by the reactor / saved by tabs"] = (
        f"{found.saved_by_worker} / {found.saved_by_client}"
    )


def stop(engine: Podman, running: Running) -> float:
    """``podman stop`` with a grace over the drain: the seconds it took; the reactor must have
    heard SIGTERM, drained and exited 0 within the drain."""
    stopping = time.monotonic()
    engine.run("stop", "--time", str(int(DRAIN + 10)), running.name, timeout=60)
    took = time.monotonic() - stopping
    state = inspect(engine, running.name, "container")["State"]
    logs = engine.run("logs", running.name).stderr
    assert state["ExitCode"] == 0, logs[-3000:]
    assert took < DRAIN
    signals = [record.get("signal") for record in map(_json_or_none, logs.splitlines())]
    assert "SIGTERM" in signals, logs[-3000:]
    return took


def _json_or_none(line: str) -> dict[str, Any]:
    try:
        found = json.loads(line)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


# The page on the container's loopback: the status of GET /, from inside.
_PAGE_STATUS = (
    "import os, urllib.request;"
    "print(urllib.request.urlopen("
    "'http://' + os.environ['REACTOR_DASHBOARD_ADDR'] + '/', timeout=5).status)"
)


def _in(engine: Podman, running: Running, *argv: str) -> str:
    """What ``argv`` prints inside the running container."""
    return engine.run("exec", running.name, *argv).stdout.strip()


def _user(dsn: str) -> str:
    user = psycopg.conninfo.conninfo_to_dict(dsn)["user"]
    assert isinstance(user, str)
    return user


FLY_IMAGE = "localhost/backstop-reactor-fly:test"


def as_url(dsn: str) -> str:
    """``dsn`` as a postgresql:// URL, the form Bun's SQL takes (no password: trust)."""
    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    return f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"


def bun_version() -> str:
    lock = json.loads((tools.BUN_EXAMPLE / "package-lock.json").read_text(encoding="utf-8"))
    version = lock["packages"]["node_modules/bun"]["version"]
    assert isinstance(version, str)
    return version


def test_the_fly_image_runs_the_worker_and_the_reactor_from_fly_toml(
    image: Built, roles: Roles, figures: dict[str, str]
) -> None:
    # deploy/fly/Dockerfile on the image built here and a Bun image of the tests' Bun; each
    # process group's command and the release command as fly.toml says them.
    engine = image.engine
    bun = standin_bun(engine, image.base, tools.bun(), bun_version())
    engine.run(
        "build", "--isolation=chroot", "--network", "host", "--pull=never", "--format", "docker",
        "--build-arg", f"REACTOR_IMAGE={IMAGE}", "--build-arg", f"BUN_IMAGE={bun}",
        "-f", str(tools.ROOT / "deploy/fly/Dockerfile"), "-t", FLY_IMAGE, str(tools.ROOT),
        timeout=600,
    )  # fmt: skip
    config = tomllib.loads((tools.ROOT / "deploy/fly/fly.toml").read_text(encoding="utf-8"))
    with psycopg.connect(roles.owner, autocommit=True) as conn:
        conn.execute(sql.read("reference.sql"))
    release = fly_process("deploy.release_command")
    migrated = engine.run(
        "run", "--rm", "--read-only", "--network", "host", *RUN_LIMITS,
        "-e", f"MIGRATE_DATABASE_URL={roles.owner}", "--entrypoint", release[0], FLY_IMAGE,
        *release[1:],
        check=False,
    )  # fmt: skip
    assert migrated.returncode == 0, migrated.stderr
    grants = one_shot(engine, roles.owner, "migrate", "--print-grants", _user(roles.runtime))
    with psycopg.connect(roles.owner, autocommit=True) as conn:
        conn.execute(grants.stdout)
    with psycopg.connect(roles.admin, autocommit=True) as conn:
        conn.execute(AUDIT_SQL)
        grant_audit(conn, _user(roles.runtime))
        jobs = 12
        for _ in range(jobs):
            new_job(conn, status="queued", doc_html=None)

    # The app's secrets are every Machine's: each process picks its own connection string.
    secrets = {"DATABASE_URL": as_url(roles.admin), "RUNTIME_DATABASE_URL": roles.runtime}
    shared = {**config["env"], **secrets, "REACTOR_GRACE_SECONDS": str(GRACE)}
    with (
        reactor_container(engine, shared, fly_process("processes.reactor"), FLY_IMAGE) as reactor,
        reactor_container(engine, shared, fly_process("processes.worker"), FLY_IMAGE) as worker,
    ):
        ready_after(engine, reactor)
        try:
            found = wait_for(
                lambda: all_recorded(roles.admin, jobs), timeout=60, what="the worker's jobs' runs"
            )
        except AssertionError as error:
            logs = {c.name: engine.run("logs", c.name).stderr[-2000:] for c in (worker, reactor)}
            raise AssertionError(f"{error}; {verdict(roles.admin)}; {logs}") from None
        assert found.clean, found
        assert found.saved_by_worker == jobs  # no tab in this play: the reactor wrote each
        # Fly's kill_signal to each; the worker finishes the job in hand, the reactor drains.
        for running in (worker, reactor):
            engine.run("kill", "--signal", config["kill_signal"], running.name)
            waited = engine.run("wait", running.name, timeout=config["kill_timeout"])
            assert waited.stdout.strip() == "0", engine.run("logs", running.name).stderr[-3000:]
    figures["Fly image (reactor + Bun) over the reactor's (MB)"] = (
        f"{(engine.image_size(FLY_IMAGE) - engine.image_size(IMAGE)) / 1e6:.1f}"
    )
