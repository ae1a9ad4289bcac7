"""deploy/: the Prometheus alert rules and the Grafana dashboard, checked by promtool itself.

promtool comes from Debian's ``prometheus`` package (``.ci/run`` installs it). It checks the
rules, runs their unit tests (each alert fires and clears), and parses every dashboard query,
rendered into a rules file of its own. The metric names they use are checked against the ones
the reactor serves.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

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
