"""deploy/: the Prometheus alert rules and the Grafana dashboard, checked by promtool itself;
the Kubernetes, Fly.io and Coolify recipes, checked against the schemas and the code.

promtool comes from Debian's ``prometheus`` package (``.ci/run`` installs it). It checks the
rules, runs their unit tests (each alert fires and clears), and parses every dashboard query,
rendered into a rules file of its own. The metric names they use are checked against the ones
the reactor serves.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from reactor.telemetry.metrics import Metrics
from tests import tools

DEPLOY = tools.ROOT / "deploy"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
ALERT_TESTS = DEPLOY / "prometheus" / "alerts.test.yml"
DASHBOARD = DEPLOY / "grafana" / "reactor.json"

# Served once the reconcile lands; the rules and the dashboard already watch them.
RECONCILE_METRICS = {
    "reactor_reconcile_found_total",
    "reactor_reconcile_last_pass_timestamp_seconds",
    "reactor_reconcile_interval_seconds",
}
# What Grafana substitutes before a query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$job": "reactor", "$pair": ".*"}


def rules() -> list[dict[str, Any]]:
    (group,) = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    found = group["rules"]
    assert isinstance(found, list)
    return found


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [
        target["expr"]
        for panel in dashboard["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


def served_metrics() -> set[str]:
    """Every sample name the reactor's /metrics can carry (counters with _total, buckets...)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    return {
        family.name + suffix
        for family in Metrics().registry.collect()
        for suffix in suffixes[family.type]
    }


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\breactor_[a-z_]+\b", expr))


def run_promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tools.promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_promtool_checks_the_rules() -> None:
    result = run_promtool("check", "rules", ALERTS.name, cwd=ALERTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_promtool_unit_tests_fire_and_clear_every_alert() -> None:
    result = run_promtool("test", "rules", ALERT_TESTS.name, cwd=ALERT_TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_test_that_fires_it_and_then_clears_it() -> None:
    groups = yaml.safe_load(ALERT_TESTS.read_text(encoding="utf-8"))["tests"]
    for rule in rules():
        # Per test group, in evaluation order: True where the alert fires, False where not.
        timelines = [
            [
                bool(check["exp_alerts"])
                for check in group["alert_rule_test"]
                if check["alertname"] == rule["alert"]
            ]
            for group in groups
        ]
        assert any(True in line and False in line[line.index(True) :] for line in timelines), (
            f"{rule['alert']}: no test fires it and then sees it clear"
        )


def test_every_alert_says_what_it_means_and_what_to_run() -> None:
    for rule in rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"].strip(), name
        assert re.search(r"`reactor [a-z]+", rule["annotations"]["runbook"]), name


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    queries = dashboard_queries()
    rendered = []
    for query in queries:
        for variable, value in GRAFANA_VARIABLES.items():
            query = query.replace(variable, value)
        assert "$" not in query, f"a Grafana variable the test does not render: {query}"
        rendered.append(query)
    recording = [{"record": f"dashboard:query_{i}", "expr": q} for i, q in enumerate(rendered)]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recording}]}))
    result = run_promtool("check", "rules", path.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


def test_rules_and_dashboard_use_metrics_the_reactor_serves() -> None:
    known = served_metrics() | RECONCILE_METRICS
    used_by_alerts = set().union(*(metric_names(rule["expr"]) for rule in rules()))
    used_by_dashboard = set().union(*map(metric_names, dashboard_queries()))
    assert used_by_alerts - known == set()
    assert used_by_dashboard - known == set()
    # The dashboard shows every figure an alert watches.
    assert used_by_alerts - used_by_dashboard == set()


# The platforms' recipes: deploy/kubernetes, deploy/fly and deploy/coolify, read as data and
# checked against the code they run (the settings, the probes' routes, the image's user).

KUBERNETES = DEPLOY / "kubernetes"
FLY = DEPLOY / "fly"
COOLIFY = DEPLOY / "coolify" / "compose.yaml"
# The oldest Kubernetes whose native sidecars are on by default, and the newest the validator
# knows: the manifests must hold on both.
KUBERNETES_VERSIONS = ("1.29.0", "latest")
# What a drain needs beyond REACTOR_DRAIN_SECONDS: closing the servers and the pool, exiting.
DRAIN_MARGIN = 5.0


def manifests() -> dict[str, dict[str, Any]]:
    """Every resource of deploy/kubernetes, by ``Kind/name``."""
    found = {}
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            found[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return found


def pod_of(kind_name: str) -> dict[str, Any]:
    spec = manifests()[kind_name]["spec"]["template"]["spec"]
    assert isinstance(spec, dict)
    return spec


def sidecar() -> dict[str, Any]:
    (reactor,) = pod_of("Deployment/app-worker")["initContainers"]
    assert isinstance(reactor, dict)
    return reactor


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    """A container's env, by name: the value, or the Secret and key it comes from."""
    return {
        var["name"]: var.get("value")
        or (var["valueFrom"]["secretKeyRef"]["name"], var["valueFrom"]["secretKeyRef"]["key"])
        for var in container.get("env", [])
    }


def reactor_names() -> set[str]:
    """Every environment variable the reactor reads: DATABASE_URL and each REACTOR_ name its
    code spells out."""
    source = " ".join(p.read_text(encoding="utf-8") for p in tools.ROOT.glob("reactor/**/*.py"))
    return {"DATABASE_URL", *re.findall(r"REACTOR_[A-Z0-9_]+", source)} - {
        "REACTOR_WEBHOOK_SECRET_"
    }


def probe_routes() -> set[str]:
    """The paths the probes' server answers."""
    from reactor.ops.http import probes_app

    routes = probes_app(lambda: None).router.routes()
    return {route.resource.canonical for route in routes if route.resource is not None}


def port_of(addr: str) -> int:
    return int(addr.rpartition(":")[2])


def image_uid() -> int:
    text = (tools.ROOT / "Dockerfile").read_text(encoding="utf-8")
    (user,) = re.findall(r"^USER (\d+):\d+$", text, flags=re.MULTILINE)
    return int(user)


def project_version() -> str:
    import tomllib

    text = (tools.ROOT / "pyproject.toml").read_text(encoding="utf-8")
    version = tomllib.loads(text)["project"]["version"]
    assert isinstance(version, str)
    return version


def kubernetes_validate(version: str, *paths: Path) -> subprocess.CompletedProcess[str]:
    if version == "latest":
        version_args: tuple[str, ...] = ()
    else:
        version_args = ("--kubernetes-version", version)
    return subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", *version_args]
        + [str(p) for p in paths],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_manifests_validate_against_the_kubernetes_schemas(version: str) -> None:
    paths = sorted(KUBERNETES.glob("*.yaml"))
    result = kubernetes_validate(version, *paths)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed") == len(manifests())


def test_the_validator_rejects_a_field_kubernetes_does_not_know(tmp_path: Path) -> None:
    text = (KUBERNETES / "deployment.yaml").read_text(encoding="utf-8")
    wrong = tmp_path / "deployment.yaml"
    wrong.write_text(text.replace("terminationGracePeriodSeconds", "terminationGraceSeconds"))
    assert kubernetes_validate("latest", wrong).returncode != 0


def test_the_reactor_is_a_native_sidecar_of_the_worker() -> None:
    pod = pod_of("Deployment/app-worker")
    reactor = sidecar()
    assert reactor["restartPolicy"] == "Always"
    assert reactor["args"] == ["run"]
    assert reactor["image"] == f"backstop-reactor:{project_version()}"
    # Its preStop would run as the pod begins terminating, while the worker still works.
    assert "lifecycle" not in reactor
    assert [c["name"] for c in pod["containers"]] == ["worker"]


def test_the_probes_ask_the_servers_paths_on_its_port() -> None:
    reactor = sidecar()
    env = env_of(reactor)
    (port,) = reactor["ports"]
    assert port["containerPort"] == port_of(env["REACTOR_HTTP_ADDR"])
    routes = probe_routes()
    paths = {}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = reactor[probe]["httpGet"]
        assert get["port"] in (port["name"], port["containerPort"]), probe
        assert get["path"] in routes, probe
        paths[probe] = get["path"]
    assert paths == {
        "startupProbe": "/healthz",
        "livenessProbe": "/healthz",
        "readinessProbe": "/readyz",
    }
    # The sidecar's readiness is the pod's: a blip of the database (a restart, a failover, a
    # probe the pooler swallowed) must not mark it unready at once.
    readiness = reactor["readinessProbe"]
    assert readiness["periodSeconds"] * readiness["failureThreshold"] >= 60
    annotations = manifests()["Deployment/app-worker"]["spec"]["template"]["metadata"][
        "annotations"
    ]
    assert int(annotations["prometheus.io/port"]) == port["containerPort"]
    assert annotations["prometheus.io/path"] in routes


def test_the_grace_period_covers_the_worker_and_then_the_drain() -> None:
    pod = pod_of("Deployment/app-worker")
    drain = float(env_of(sidecar())["REACTOR_DRAIN_SECONDS"])
    # The sidecar's SIGTERM comes after the worker has exited, within the same budget.
    assert pod["terminationGracePeriodSeconds"] >= 2 * drain + DRAIN_MARGIN


def test_each_container_runs_as_its_own_role_from_its_own_secret() -> None:
    found = manifests()
    (migrate,) = pod_of("Job/reactor-migrate")["containers"]
    (worker,) = pod_of("Deployment/app-worker")["containers"]
    assert migrate["args"] == ["migrate"]
    assert migrate["image"] == sidecar()["image"]
    secrets = {
        name: env_of(container)["DATABASE_URL"]
        for name, container in (("migrate", migrate), ("reactor", sidecar()), ("worker", worker))
    }
    assert secrets == {
        "migrate": ("reactor-owner", "DATABASE_URL"),
        "reactor": ("reactor-runtime", "DATABASE_URL"),
        "worker": ("app-database", "DATABASE_URL"),
    }
    for secret, key in secrets.values():
        assert key in found[f"Secret/{secret}"]["stringData"]


def test_the_reactors_containers_are_locked_down() -> None:
    for kind_name, container in (
        ("Deployment/app-worker", sidecar()),
        ("Job/reactor-migrate", pod_of("Job/reactor-migrate")["containers"][0]),
    ):
        pod = pod_of(kind_name)
        assert pod["securityContext"]["runAsNonRoot"] is True, kind_name
        assert pod["automountServiceAccountToken"] is False, kind_name
        user = container.get("securityContext", {}).get("runAsUser") or pod["securityContext"].get(
            "runAsUser"
        )
        assert user == image_uid(), kind_name
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True, kind_name
        assert security["allowPrivilegeEscalation"] is False, kind_name
        assert security["capabilities"]["drop"] == ["ALL"], kind_name
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), kind_name
        assert "cpu" not in resources.get("limits", {}), kind_name  # throttling is lateness


def test_the_budget_and_the_policy_select_the_pods() -> None:
    found = manifests()
    labels = found["Deployment/app-worker"]["spec"]["template"]["metadata"]["labels"]
    budget = found["PodDisruptionBudget/app-worker"]["spec"]
    assert budget["selector"]["matchLabels"].items() <= labels.items()
    assert budget["minAvailable"] < found["Deployment/app-worker"]["spec"]["replicas"]
    policy = found["NetworkPolicy/app-worker"]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    admitted = {port["port"] for rule in policy["ingress"] for port in rule["ports"]}
    env = env_of(sidecar())
    # The probes' and metrics' port only: never the operator's page.
    assert admitted == {port_of(env["REACTOR_HTTP_ADDR"])}
    assert port_of(env["REACTOR_DASHBOARD_ADDR"]) not in admitted
    assert env["REACTOR_DASHBOARD_ADDR"].startswith("127.0.0.1:")


def fly() -> dict[str, Any]:
    import tomllib

    return tomllib.loads((FLY / "fly.toml").read_text(encoding="utf-8"))


def test_fly_runs_the_worker_and_the_reactor_as_two_process_groups() -> None:
    config = fly()
    processes = config["processes"]
    assert set(processes) == {"worker", "reactor"}
    reactor = shlex.split(processes["reactor"])
    assert reactor[:2] == ["sh", "-c"]
    assert reactor[2].endswith("exec reactor run")  # exec: the signal reaches the reactor
    assert "$RUNTIME_DATABASE_URL" in reactor[2]
    release = shlex.split(config["deploy"]["release_command"])
    assert release[2].endswith("exec reactor migrate")
    assert "$MIGRATE_DATABASE_URL" in release[2]
    assert {vm["processes"][0] for vm in config["vm"]} == {"worker", "reactor"}
    # The worker's script is in the image the Dockerfile makes.
    (script,) = shlex.split(processes["worker"])[1:]
    assert f"COPY examples/bun/worker.ts {script}" in (FLY / "Dockerfile").read_text()


def test_fly_stops_with_sigterm_and_waits_for_the_drain() -> None:
    config = fly()
    # Fly's own default is SIGINT after 5 s; the worker stops on SIGTERM alone.
    assert config["kill_signal"] == "SIGTERM"
    assert config["kill_timeout"] >= float(config["env"]["REACTOR_DRAIN_SECONDS"]) + 10


def test_fly_checks_readiness_on_the_probes_port() -> None:
    config = fly()
    port = port_of(config["env"]["REACTOR_HTTP_ADDR"])
    (check,) = config["checks"].values()
    assert (check["type"], check["port"], check["path"]) == ("http", port, "/readyz")
    assert check["processes"] == ["reactor"]
    assert check["path"] in probe_routes()
    assert (config["metrics"]["port"], config["metrics"]["path"]) == (port, "/metrics")


def test_fly_builds_on_the_reactors_image_and_the_bun_the_tests_ran() -> None:
    text = (FLY / "Dockerfile").read_text(encoding="utf-8")
    lock = json.loads((tools.BUN_EXAMPLE / "package-lock.json").read_text(encoding="utf-8"))
    bun = lock["packages"]["node_modules/bun"]["version"]
    assert f"ARG BUN_IMAGE=oven/bun:{bun}\n" in text
    assert f"ARG REACTOR_IMAGE=backstop-reactor:{project_version()}\n" in text
    # The root build context must carry the worker's script (.dockerignore leaves out examples/).
    ignored = (tools.ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    assert "!examples/bun/worker.ts" in ignored


def coolify() -> dict[str, Any]:
    services = yaml.safe_load(COOLIFY.read_text(encoding="utf-8"))["services"]
    assert isinstance(services, dict)
    return services


# Coolify gives a container this long after SIGTERM, whatever the compose file says.
COOLIFY_STOP_SECONDS = 30.0


def test_coolify_migrates_once_outside_the_health_then_runs() -> None:
    services = coolify()
    migrate, reactor = services["migrate"], services["reactor"]
    assert migrate["command"] == ["migrate"]
    assert migrate["restart"] == "no"
    assert migrate["exclude_from_hc"] is True  # it exits, as it should: not a failure
    assert reactor["command"] == ["run"]
    assert reactor["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert "MIGRATE_DATABASE_URL" in migrate["environment"]["DATABASE_URL"]
    assert "RUNTIME_DATABASE_URL" in reactor["environment"]["DATABASE_URL"]
    for service in (migrate, reactor):
        assert service["user"] == f"{image_uid()}:{image_uid()}"
        assert service["read_only"] is True
        assert service["cap_drop"] == ["ALL"]


def test_coolify_health_and_drain_fit_its_fixed_stop() -> None:
    from tests.unit.test_compose import health_command

    reactor = coolify()["reactor"]
    text = (tools.ROOT / "Dockerfile").read_text(encoding="utf-8")
    joined = re.sub(r"\\\n\s*", " ", text)
    lines = [line.strip() for line in joined.splitlines() if line.strip() and line[0] != "#"]
    assert reactor["healthcheck"]["test"] == health_command(lines)
    drain = float(reactor["environment"]["REACTOR_DRAIN_SECONDS"])
    assert drain + DRAIN_MARGIN * 2 <= COOLIFY_STOP_SECONDS
    assert reactor["stop_grace_period"] == f"{COOLIFY_STOP_SECONDS:g}s"


def platform_env_names() -> set[str]:
    """Every variable the recipes set for a reactor process."""
    names = set(env_of(sidecar())) | set(env_of(pod_of("Job/reactor-migrate")["containers"][0]))
    names |= set(fly()["env"]) | set(
        re.findall(
            r"\b[A-Z][A-Z0-9_]+(?==)",
            fly()["deploy"]["release_command"] + fly()["processes"]["reactor"],
        )
    )
    for name in ("migrate", "reactor"):
        names |= set(coolify()[name]["environment"])
    return names


def test_the_recipes_set_only_variables_the_reactor_reads() -> None:
    known = reactor_names()
    setting = {name for name in platform_env_names() if name.startswith("REACTOR_")}
    assert setting - known == set()
    assert "DATABASE_URL" in platform_env_names()
    # The worker's own (not the reactor's) and the recipes' connection strings are the rest.
    assert platform_env_names() - known <= {"WORKER_CONCURRENCY"}


DEPLOYING = tools.ROOT / "docs" / "deploying.md"
# A fenced block of the page that quotes a file: ```lang title="PATH" ... ```.
QUOTED = re.compile(r'^```[a-z]+ title="([^"]+)"\n(.*?)^```$', re.MULTILINE | re.DOTALL)


def test_the_deploying_page_quotes_the_files_as_they_stand() -> None:
    quoted = QUOTED.findall(DEPLOYING.read_text(encoding="utf-8"))
    for path, block in quoted:
        text = (tools.ROOT / path).read_text(encoding="utf-8")
        assert block in text, f"docs/deploying.md quotes {path} as it no longer stands:\n{block}"
    # Each recipe is quoted at least once.
    assert {path for path, _ in quoted} >= {
        "Dockerfile",
        "deploy/kubernetes/deployment.yaml",
        "deploy/fly/fly.toml",
        "deploy/coolify/compose.yaml",
    }
