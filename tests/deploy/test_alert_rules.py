"""The shipped alert rules (deploy/prometheus/gpu-alerts.yaml, deploy/kubernetes/base/
*prometheusrule.yaml): every rule's runbook_url names a page of docs/ and a section of it
that exist; the bot's own rules read only metrics a real `runbook serve` exports and cover
the breaker, audit shipping and held executions; promtool parses them and its unit tests
show each new bot alert firing on the series that should fire it, and not before."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.metricnames import bot_metrics, promql_metric_names, promtool

REPO = Path(__file__).resolve().parents[2]
DOCS_BASE = "https://gpu-runbook-bot.example.com/docs/"
BOT_RULES = REPO / "deploy" / "kubernetes" / "base" / "prometheusrule.yaml"
RULE_FILES = [REPO / "deploy" / "prometheus" / "gpu-alerts.yaml", BOT_RULES,
              *sorted((REPO / "deploy" / "kubernetes" / "base").glob("*prometheusrule.yaml"))]
PROMETHEUS_OWN = {"up"}  # series Prometheus makes itself
__all__ = ["bot_metrics"]  # the fixture, used by name


def groups(path: Path) -> list[dict[str, Any]]:
    loaded = yaml.safe_load(path.read_text())
    found: list[dict[str, Any]] = (loaded.get("spec") or loaded)["groups"]
    return found


def rules(path: Path) -> list[dict[str, Any]]:
    return [r for g in groups(path) for r in g["rules"] if "alert" in r]


def slug(heading: str) -> str:
    """A Markdown heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m) for m in re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE)}


def test_every_rule_links_a_docs_section_that_exists() -> None:
    seen = 0
    for path in RULE_FILES:
        for rule in rules(path):
            url = rule["annotations"].get("runbook_url", "")
            assert url.startswith(DOCS_BASE), (path.name, rule["alert"], url)
            page, _, anchor = url[len(DOCS_BASE):].partition("#")
            assert (REPO / "docs" / page).is_file(), (rule["alert"], url)
            assert anchor in anchors(REPO / "docs" / page), (rule["alert"], url)
            assert anchor == rule["alert"].lower(), "one section per alert, named after it"
            seen += 1
    assert seen >= 17


def test_the_slugs_are_githubs() -> None:
    assert slug("Install into a cluster") == "install-into-a-cluster"
    assert slug("`runbook_url`: what it is (for now)") == "runbook_url-what-it-is-for-now"


def test_the_bots_rules_read_what_it_exports(bot_metrics: set[str]) -> None:
    read = {}
    for rule in rules(BOT_RULES):
        names = promql_metric_names(rule["expr"])
        assert names, rule["alert"]
        unknown = names - bot_metrics - PROMETHEUS_OWN
        assert not unknown, (rule["alert"], sorted(unknown))
        read[rule["alert"]] = names
    assert read["GpuRunbookBreakerTripped"] == {"runbook_breaker_tripped"}
    assert read["GpuRunbookAuditShippingBehind"] == {"runbook_audit_ship_lag_events"}
    assert read["GpuRunbookAuditShippingLost"] == {
        "runbook_audit_ship_skipped_events_total", "runbook_audit_ship_rejected_records_total"}
    assert read["GpuRunbookExecutionHeld"] == {"runbook_executions"}


def test_promtool_checks_the_rule_files(tmp_path: Path) -> None:
    tool = promtool()
    for path in RULE_FILES:
        plain = tmp_path / path.name
        plain.write_text(yaml.safe_dump({"groups": groups(path)}))
        done = subprocess.run([tool, "check", "rules", str(plain)], capture_output=True,
                              text=True, timeout=60, check=False, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stdout + done.stderr


UNIT_TESTS = """
rule_files: [bot.rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'runbook_breaker_tripped{instance="a"}'
        values: '0 0 1 1'
      - series: 'runbook_breaker_tripped{instance="b"}'
        values: '0 0 1 1'
      - series: 'runbook_audit_ship_lag_events{instance="a", destination="syslog://s:514"}'
        values: '0 5 7 9 11 13 15 17 19 21 23 25 27 29 31 33 35 37 39 41'
      - series: 'runbook_audit_ship_lag_events{instance="a", destination="https://otlp"}'
        values: '0 5 0 5 0 5 0 5 0 5 0 5 0 5 0 5 0 5 0 5'
      - series: 'runbook_audit_ship_skipped_events_total{instance="a", destination="https://otlp"}'
        values: '0 0 0 0 0 0 0 0 0 0 3 3 3 3 3 3 3 3 3 3'
      - series: 'runbook_audit_ship_rejected_records_total{instance="a", destination="https://otlp"}'
        values: '0x20'
      - series: 'runbook_executions{instance="a", runbook="swap-gpu", state="held"}'
        values: '0 1 1 1 1 1 1 1 1 1 1 1 1 1'
    alert_rule_test:
      - {eval_time: 1m, alertname: GpuRunbookBreakerTripped, exp_alerts: []}
      - eval_time: 2m
        alertname: GpuRunbookBreakerTripped
        exp_alerts: [{exp_labels: {severity: warning}}]
      - {eval_time: 15m, alertname: GpuRunbookAuditShippingBehind, exp_alerts: []}
      - eval_time: 17m
        alertname: GpuRunbookAuditShippingBehind
        exp_alerts: [{exp_labels: {severity: warning, destination: "syslog://s:514"}}]
      - {eval_time: 9m, alertname: GpuRunbookAuditShippingLost, exp_alerts: []}
      - eval_time: 12m
        alertname: GpuRunbookAuditShippingLost
        exp_alerts: [{exp_labels: {severity: critical, destination: "https://otlp"}}]
      - {eval_time: 10m, alertname: GpuRunbookExecutionHeld, exp_alerts: []}
      - eval_time: 11m
        alertname: GpuRunbookExecutionHeld
        exp_alerts: [{exp_labels: {severity: warning, runbook: swap-gpu}}]
"""


def test_the_bots_new_alerts_fire_when_they_should(tmp_path: Path) -> None:
    tool = promtool()
    bare = [{**g, "rules": [{k: v for k, v in r.items() if k != "annotations"}
                            for r in g["rules"]]} for g in groups(BOT_RULES)]  # labels decide
    (tmp_path / "bot.rules.yaml").write_text(yaml.safe_dump({"groups": bare}))
    (tmp_path / "bot.test.yaml").write_text(UNIT_TESTS)
    done = subprocess.run([tool, "test", "rules", "bot.test.yaml"], capture_output=True,
                          text=True, timeout=60, check=False, stdin=subprocess.DEVNULL,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_alert_names_are_unique(path: Path) -> None:
    names = [r["alert"] for r in rules(path)]
    assert len(names) == len(set(names))
