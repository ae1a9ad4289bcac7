"""The container wiring, read as data: compose.yaml's services and their order, and the
Dockerfile's user, health check and entry point. No engine runs here, so this is what keeps
the two files honest between the times someone runs ``docker compose up``."""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "compose.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    found = compose["services"]
    assert isinstance(found, dict)
    return found


@pytest.fixture(scope="module")
def dockerfile() -> list[str]:
    """The Dockerfile's instructions, one string each, continuation lines joined."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and line[0] != "#"]


def instruction(dockerfile: list[str], name: str) -> list[str]:
    return [line[len(name) :].strip() for line in dockerfile if line.split()[0].upper() == name]


def command(service: dict[str, Any]) -> list[str]:
    value = service["command"]
    return shlex.split(value) if isinstance(value, str) else list(value)


def test_the_three_services_exist(services: dict[str, Any]) -> None:
    assert {"postgres", "migrate", "reactor"} <= set(services)
    assert services["postgres"]["image"] == "postgres:18"
    assert "POSTGRES_PASSWORD" in services["postgres"]["environment"]


def test_startup_order(services: dict[str, Any]) -> None:
    migrate, reactor = services["migrate"], services["reactor"]
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert reactor["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert migrate.get("restart", "no") == "no"  # one-shot: a restart loop would hide failure


def test_commands(services: dict[str, Any]) -> None:
    migrate = command(services["migrate"])
    assert migrate[0] == "migrate"
    assert "--reference-schema" in migrate
    assert command(services["reactor"]) == ["run"]


def test_both_use_the_reactor_image(services: dict[str, Any]) -> None:
    for name in ("migrate", "reactor"):
        service = services[name]
        assert service.get("build") in (".", {"context": "."}), name
        assert service["image"] == services["reactor"]["image"]


def test_one_database_url_pointing_at_the_postgres_service(services: dict[str, Any]) -> None:
    urls = {name: services[name]["environment"]["DATABASE_URL"] for name in ("migrate", "reactor")}
    assert urls["migrate"] == urls["reactor"]
    parts = urlsplit(urls["reactor"])
    assert parts.scheme in ("postgresql", "postgres")
    assert parts.hostname == "postgres"
    assert parts.port in (None, 5432)
    assert parts.path.lstrip("/") == services["postgres"]["environment"]["POSTGRES_DB"]
    assert parts.username == services["postgres"]["environment"]["POSTGRES_USER"]


def test_health_checks(services: dict[str, Any], dockerfile: list[str]) -> None:
    postgres = " ".join(services["postgres"]["healthcheck"]["test"])
    assert "pg_isready" in postgres
    reactor = services["reactor"]
    # The image's own check, word for word (compose shows it to those who read only this file).
    assert reactor["healthcheck"]["test"] == health_command(dockerfile)
    assert reactor["environment"]["REACTOR_HTTP_ADDR"] == "0.0.0.0:9187"


def test_stop_grace_outlasts_the_drain(services: dict[str, Any]) -> None:
    reactor = services["reactor"]
    grace = reactor["stop_grace_period"]
    assert grace.endswith("s")
    assert float(grace[:-1]) > float(reactor["environment"]["REACTOR_DRAIN_SECONDS"])


def test_the_bun_worker_is_optional_and_runs_the_example(services: dict[str, Any]) -> None:
    worker = services["worker"]
    assert worker["profiles"] == ["worker"]  # `docker compose up` alone does not start it
    for name in ("postgres", "migrate", "reactor"):
        assert "profiles" not in services[name], name
    lock = json.loads((ROOT / "examples/bun/package-lock.json").read_text(encoding="utf-8"))
    bun_version = lock["packages"]["node_modules/bun"]["version"]
    assert worker["image"] == f"oven/bun:{bun_version}"  # the Bun the tests ran
    assert worker["user"] != "root"
    (volume,) = worker["volumes"]
    source, target, mode = volume.split(":")
    assert (ROOT / source).resolve() == ROOT / "examples" / "bun"
    assert (target, mode) == (worker["working_dir"], "ro")
    runtime, script, *_ = command(worker)
    assert runtime == "bun"
    assert (ROOT / source / script).is_file()
    assert "--until-idle" not in command(worker)  # a service keeps taking jobs
    env = worker["environment"]
    assert env["DATABASE_URL"] == services["reactor"]["environment"]["DATABASE_URL"]
    assert worker["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def stages(dockerfile: list[str]) -> list[list[str]]:
    """The Dockerfile's stages, each from its FROM; what precedes the first is left out."""
    found: list[list[str]] = []
    for line in dockerfile:
        if line.split()[0].upper() == "FROM":
            found.append([])
        if found:
            found[-1].append(line)
    return found


def test_dockerfile_builds_on_one_base_in_two_stages(dockerfile: list[str]) -> None:
    # The venv's python is a link to the base's interpreter: both stages stand on one base,
    # python:3.11-slim unless a build argument names another (tests/container's stand-in).
    assert dockerfile[0] == "ARG BASE=python:3.11-slim"
    builder, runtime = stages(dockerfile)
    assert builder[0] == "FROM ${BASE} AS builder"
    assert runtime[0] == "FROM ${BASE}"


def test_uv_and_the_build_stay_in_the_builder(dockerfile: list[str]) -> None:
    builder, runtime = stages(dockerfile)
    runs = " ".join(instruction(builder, "RUN"))
    assert re.search(r"pip install .*\buv==", runs)
    syncs = [run for run in instruction(builder, "RUN") if "uv sync" in run]
    assert syncs
    for sync in syncs:
        # --no-dev alone would install the bench group too: pyproject lists it as a default.
        assert {"--locked", "--no-dev", "--no-default-groups"} <= set(sync.split())
        # No extra: the cli extra's tables, the demo and tracing are not the sidecar's.
        assert "--extra" not in sync
        assert "--all-extras" not in sync
    # The project goes in as a wheel, not as a link to the build's sources.
    assert "--no-editable" in syncs[-1].split()
    # The runtime only copies the venv: no uv, no pip install, no build.
    assert instruction(runtime, "COPY") == ["--from=builder /app/.venv /app/.venv"]
    assert all("uv" not in run.split() and "pip" not in run for run in instruction(runtime, "RUN"))


def test_the_image_is_labelled_with_the_projects_version(dockerfile: list[str]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    _, runtime = stages(dockerfile)
    assert f"ARG VERSION={project['version']}" in runtime
    labels = " ".join(instruction(runtime, "LABEL"))
    for key in ("title", "description", "licenses", "version", "revision"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    assert 'org.opencontainers.image.version="${VERSION}"' in labels
    assert f'org.opencontainers.image.licenses="{project["license"]}"' in labels


def test_dockerfile_runs_as_non_root(dockerfile: list[str]) -> None:
    users = instruction(dockerfile, "USER")
    assert users, "no USER: the container would run as root"
    assert users[-1] not in ("root", "0")
    # USER comes after the last RUN: nothing later builds as root by accident.
    last_run = max(i for i, line in enumerate(dockerfile) if line.startswith("RUN"))
    last_user = max(i for i, line in enumerate(dockerfile) if line.startswith("USER"))
    assert last_user > last_run


def test_dockerfile_health_entrypoint_and_address(dockerfile: list[str]) -> None:
    (health,) = instruction(dockerfile, "HEALTHCHECK")
    assert "/healthz" in health
    assert "urllib" in health
    assert "curl" not in health
    assert instruction(dockerfile, "ENTRYPOINT") == ['["reactor"]']
    assert instruction(dockerfile, "CMD") == ['["run"]']
    env = " ".join(instruction(dockerfile, "ENV"))
    assert "REACTOR_HTTP_ADDR=0.0.0.0:9187" in env
    assert "9187" in instruction(dockerfile, "EXPOSE")
    # The page stays on the container's loopback, and is not exposed.
    assert "REACTOR_DASHBOARD_ADDR=127.0.0.1:9188" in env
    assert "9188" not in " ".join(instruction(dockerfile, "EXPOSE"))


def test_the_page_is_published_on_this_hosts_loopback_only(services: dict[str, Any]) -> None:
    reactor = services["reactor"]
    port = reactor["environment"]["REACTOR_DASHBOARD_ADDR"].rpartition(":")[2]
    published = [p for p in reactor["ports"] if p.endswith(f":{port}")]
    assert published == [f"127.0.0.1:{port}:{port}"]


def test_dockerignore_keeps_the_build_context_small() -> None:
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    for entry in (".git", ".venv", "tests", "bench", "examples"):
        assert entry in ignored
    for needed in ("pyproject.toml", "uv.lock", "README.md", "reactor", "triggers"):
        assert needed not in ignored


def health_command(dockerfile: list[str]) -> list[str]:
    """The exec form of the Dockerfile's HEALTHCHECK: ["CMD", argv...]."""
    (health,) = instruction(dockerfile, "HEALTHCHECK")
    found = json.loads(health[health.index("CMD") + len("CMD") :].strip())
    assert isinstance(found, list)
    return ["CMD", *found]


def run_health_check(args: list[str], port: int) -> subprocess.CompletedProcess[bytes]:
    """The HEALTHCHECK's ``args`` run by the python of this venv, with REACTOR_HTTP_ADDR on
    0.0.0.0:``port``."""
    return subprocess.run(
        [sys.executable, *args],
        env={"REACTOR_HTTP_ADDR": f"0.0.0.0:{port}"},
        capture_output=True,
        timeout=30,
        check=False,
    )


class _Probe(BaseHTTPRequestHandler):
    """Answers /healthz with the status the server was given."""

    def do_GET(self) -> None:
        status = self.server.status if self.path == "/healthz" else 404  # type: ignore[attr-defined]
        self.send_response(status)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def probed() -> Iterator[HTTPServer]:
    server = HTTPServer(("127.0.0.1", 0), _Probe)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("status", "code"), [(200, 0), (503, 1)])
def test_the_health_check_asks_the_port_of_reactor_http_addr(
    dockerfile: list[str], probed: HTTPServer, status: int, code: int
) -> None:
    # What the engine runs, with the python of this venv: 0.0.0.0 is asked on loopback, on
    # whatever port REACTOR_HTTP_ADDR names.
    probed.status = status  # type: ignore[attr-defined]
    _, python, *args = health_command(dockerfile)
    assert python == "python"
    result = run_health_check(args, probed.server_address[1])
    assert result.returncode == code, result.stderr


def test_the_health_check_fails_when_nothing_answers(dockerfile: list[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: the connection is refused
        _, _, *args = health_command(dockerfile)
        result = run_health_check(args, port)
    assert result.returncode == 1
