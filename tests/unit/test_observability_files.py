"""The alert rules and the dashboard: promtool accepts and tests them, they read real metrics."""

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from ricochet.observe.metrics import Metrics

from tests.support import ROOT

PROMETHEUS_DIR = ROOT / "config" / "prometheus"
RULES = PROMETHEUS_DIR / "rules.yml"
RULE_TESTS = PROMETHEUS_DIR / "rules.test.yml"
DASHBOARD = ROOT / "config" / "grafana" / "dashboards" / "ricochet.json"
SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run Debian's promtool (`make tools` installs it)."""
    assert shutil.which("promtool"), "promtool is missing: run `make tools`"
    return subprocess.run(
        ["promtool", *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


def exported_names() -> set[str]:
    """Every sample name ricochet's /metrics can show."""
    names: set[str] = set()
    for family in Metrics("q").registry.collect():
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


def alerts() -> list[dict[str, Any]]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def test_promtool_accepts_config_and_rules() -> None:
    """The compose stack's Prometheus config, and the rule files it loads, pass promtool's check."""
    result = promtool("check", "config", PROMETHEUS_DIR / "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_rules_pass_their_unit_tests() -> None:
    """Every case in rules.test.yml holds: each rule fires when it should and only then."""
    result = promtool("test", "rules", RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_rule_has_a_unit_test() -> None:
    """rules.test.yml has a case that expects each alert of rules.yml to fire."""
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert {rule["alert"] for rule in alerts()} == tested


@pytest.mark.parametrize(
    "expr", [rule["expr"] for rule in alerts()] + dashboard_exprs(), ids=lambda e: e[:60]
)
def test_queries_read_metrics_ricochet_exports(expr: str) -> None:
    """Every ricochet_* name in a rule or a dashboard query is one that /metrics shows."""
    used = set(re.findall(r"\bricochet_\w+", expr))
    assert used <= exported_names(), f"not exported: {used - exported_names()}"


def test_dashboard_has_a_panel_per_stage() -> None:
    """One depth panel repeats over every stage of the queue (main, each tier, failed)."""
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert "ricochet_queue_messages" in variables["stage"]["definition"]
    (repeated,) = [p for p in board["panels"] if p.get("repeat") == "stage"]
    assert all('stage="$stage"' in target["expr"] for target in repeated["targets"])


def test_docs_list_every_alert() -> None:
    """The alert table of docs/observability.md names exactly the rules' alerts."""
    doc = ROOT / "docs" / "observability.md"
    listed = set(re.findall(r"^\| (Ricochet\w+) \|", doc.read_text(), re.MULTILINE))
    assert listed == {rule["alert"] for rule in alerts()}
