"""The Grafana dashboard shipped in deploy/grafana/: valid JSON Grafana imports (a
datasource variable, unique panel ids, panels on the grid), the panels the bot and the fleet
need, and every panel's query reading only metrics a real `runbook serve` exports at /metrics
(tests/deploy/metricnames.py); promtool parses each query when it is installed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.metricnames import bot_metrics, promql_metric_names, promtool

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "gpu-runbook-bot.json"
__all__ = ["bot_metrics"]  # the fixture, used by name


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def queries() -> list[tuple[str, str]]:
    """(panel title, expression) of every query of every panel."""
    return [(p["title"], t["expr"]) for p in panels() for t in p["targets"]]


def test_the_dashboard_loads_as_grafana_takes_it() -> None:
    found = dashboard()
    assert found["uid"] == "gpu-runbook-bot" and found["schemaVersion"] >= 36
    (variable,) = found["templating"]["list"]
    assert (variable["name"], variable["type"], variable["query"]) == (
        "datasource", "datasource", "prometheus")
    ids = [p["id"] for p in found["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels():
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["w"] > 0 and grid["h"] > 0, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"] and panel["description"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])


def test_the_panels_cover_the_bot_and_the_fleet() -> None:
    read = {name for _, expr in queries() for name in promql_metric_names(expr)}
    assert {
        "runbook_executions",  # executions by state, approvals waiting, held, quarantines
        "runbook_step_duration_seconds_bucket", "runbook_breaker_tripped",
        "runbook_audit_ship_lag_events", "runbook_http_request_duration_seconds_bucket",
        "runbook_nodes_held_out", "runbook_proposals_created_total", "runbook_proposals",
    } <= read, read
    exprs = " ".join(expr for _, expr in queries())
    for wanted in ('state="awaiting_approval"', 'state="held"', 'runbook="quarantine-node"'):
        assert wanted in exprs


def test_every_query_reads_metrics_the_bot_exports(bot_metrics: set[str]) -> None:
    unknown = {}
    for title, expr in queries():
        names = promql_metric_names(expr)
        assert names, f"{title}: {expr} reads no metric"
        if names - bot_metrics:
            unknown[title] = sorted(names - bot_metrics)
    assert not unknown, f"queries of metrics /metrics does not export: {unknown}"


def test_the_metric_name_parser_tells_names_from_the_rest() -> None:
    assert promql_metric_names(
        'histogram_quantile(0.9, sum by (le, route) (rate(a_bucket{route="/x", le!="1"}'
        '[$__rate_interval]))) > bool on (instance) group_left (pod) b offset 5m '
        'and time() - max without (job) (c) unless count(d)') == {"a_bucket", "b", "c", "d"}


def test_promtool_parses_every_query(tmp_path: Path) -> None:
    tool = promtool()
    rules = [{"record": f"dashboard:query_{i}", "expr": expr.replace("$__rate_interval", "5m")}
             for i, (_, expr) in enumerate(queries())]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run([tool, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("title", sorted({p["title"] for p in panels()}))
def test_panel_titles_are_unique(title: str) -> None:
    assert [p["title"] for p in panels()].count(title) <= 2  # a stat and its time series
