"""The chart's alert rules and dashboard: `promtool test rules` fires each alert in one case and keeps it quiet in
another (tests/alerts/ddpjob_rules_test.yaml), and every metric they read is one the operator exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "ddpjob-operator"
CASES = REPO / "tests" / "alerts" / "ddpjob_rules_test.yaml"
TROUBLESHOOTING = REPO / "docs" / "troubleshooting.md"
DASHBOARD = CHART / "files" / "ddpjob-dashboard.json"
#: PromQL functions and keywords, and the series the rules read that the operator does not export (Prometheus' own).
NOT_OURS = {"up", "by", "le", "sum", "max", "min", "rate", "increase", "absent", "histogram_quantile", "or", "and",
            "label_values", "deriv", "time", "job", "phase", "verb", "cause", "state", "code", "pod",
            "ddpjob_namespace", "ddpjob_name"}


def _tool(name: str) -> Path:
    from tests.cluster.controlplane import tool

    return tool(name)


@pytest.fixture(scope="module")
def rules() -> dict[str, Any]:
    """The PrometheusRule the chart renders (release r in namespace ops, default thresholds)."""
    args = ["template", "r", str(CHART), "--namespace", "ops", "--kube-version=1.30.0", "--set",
            "metrics.prometheusRule.enabled=true", "--show-only", "templates/prometheusrule.yaml"]
    out = subprocess.run([str(_tool("helm")), *args], capture_output=True, text=True, check=True).stdout
    doc: dict[str, Any] = yaml.safe_load(out)
    return doc


def test_promtool_checks_and_unit_tests_the_rules(rules: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rules["spec"]["groups"]}))
    shutil.copy(CASES, tmp_path / CASES.name)
    promtool = str(_tool("promtool"))
    check = subprocess.run([promtool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    tested = subprocess.run([promtool, "test", "rules", CASES.name], cwd=tmp_path, capture_output=True, text=True)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_each_alert_has_a_firing_and_a_quiet_case(rules: dict[str, Any]) -> None:
    alerts = {r["alert"] for g in rules["spec"]["groups"] for r in g["rules"] if "alert" in r}
    cases = [c for t in yaml.safe_load(CASES.read_text())["tests"] for c in t.get("alert_rule_test") or []]
    firing = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert alerts and firing == alerts and quiet == alerts, (alerts, firing, quiet)


def _exported() -> set[str]:
    """Every sample name the operator's /metrics can carry (the registry after importing its metrics)."""
    from ddpjob_operator.metrics import registry as metrics  # noqa: F401  (registers the metrics)
    from prometheus_client import REGISTRY

    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
                "gauge": ("",), "summary": ("", "_count", "_sum", "_created"), "info": ("_info",)}
    # By type, not by samples: a labelled metric has none until its first label values are used.
    return {f.name + end for f in REGISTRY.collect() for end in suffixes.get(f.type, ("",))}


def _names(expr: str) -> set[str]:
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", expr)
    return {n for n in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare) if n not in NOT_OURS and not n.startswith("$")}


def test_the_rules_and_the_dashboard_read_only_metrics_the_operator_exports(rules: dict[str, Any]) -> None:
    exprs = [r["expr"] for g in rules["spec"]["groups"] for r in g["rules"]]
    dashboard = json.loads(DASHBOARD.read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    read = set().union(*(_names(e) for e in exprs))
    missing = read - _exported()
    assert not missing, f"read but not exported: {sorted(missing)}"
    assert {"ddpjob_workqueue_depth", "ddpjob_api_request_duration_seconds_bucket",
            "ddpjob_checkpoint_age_max_seconds", "ddpjob_recovery_seconds_bucket"} <= read


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file (lower case, punctuation dropped, spaces to -)."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", markdown, flags=re.S), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_each_alert_links_its_runbook_section_of_the_troubleshooting_guide(rules: dict[str, Any]) -> None:
    anchors = _anchors(TROUBLESHOOTING.read_text(encoding="utf-8"))
    for rule in (r for g in rules["spec"]["groups"] for r in g["rules"] if "alert" in r):
        url = rule["annotations"].get("runbook_url", "")
        page, _, anchor = url.partition("#")
        assert page.endswith("/docs/troubleshooting.md") and anchor == rule["alert"].lower(), (rule["alert"], url)
        assert anchor in anchors, f"{rule['alert']}: no section #{anchor} in docs/troubleshooting.md"


#: Alerts that cannot name the job, and why (the rule's comment and its runbook say so too).
UNNAMED = {"DDPJobOperatorDown": "the operator's", "DDPJobOperatorNoLeader": "the operator's",
           "DDPJobOperatorWorkQueueBacklog": "the operator's",
           "DDPJobRecoverySlow": "the recovery histogram has no job label"}


def test_an_alert_about_a_job_names_it(rules: dict[str, Any]) -> None:
    for rule in (r for g in rules["spec"]["groups"] for r in g["rules"] if "alert" in r):
        if rule["alert"] in UNNAMED:
            continue
        assert "by (ddpjob_namespace, ddpjob_name)" in rule["expr"], rule["alert"]
        assert "$labels.ddpjob_name" in rule["annotations"]["summary"], rule["alert"]


def test_a_panels_unit_fits_its_queries() -> None:
    """A panel in seconds shows durations: quantiles of a _seconds histogram or a _seconds gauge, never a per-second
    rate (the steps/s panel was in seconds)."""
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        if panel["fieldConfig"]["defaults"].get("unit") != "s":
            continue
        for expr in (t["expr"] for t in panel["targets"]):
            duration = ("histogram_quantile" in expr and "_seconds_bucket" in expr) or \
                re.fullmatch(r"max\(\w+_seconds\{[^}]*\}\)", expr)
            assert duration, (panel["title"], expr)
