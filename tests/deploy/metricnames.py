"""What the shipped dashboards and alert rules may query: the metric names a real `runbook
serve` exports at /metrics (a process started over a database holding a drift report, with
an audit destination configured, so that every family the bot has shows), and the metric
names a PromQL expression reads (parsed with the bot's own PromQL tokenizer)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from adapters.prometheus.template import tokens
from tests.bot.runtime.test_access import free_port, serve_env
from tests.bot.runtime.test_drift_metrics import RUNBOOK, make_bot
from tests.processes import stopped
from tests.runbooks.reporthelp import report_summary

# names in PromQL that are no metric (keywords; functions and aggregations are followed by "(")
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
            "group_right", "bool", "offset", "inf", "nan", "start", "end"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
            "summary": ("_sum", "_count"), "gauge": ("",), "untyped": ("",)}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects: names outside {...} and [...], not a function or an
    aggregation (followed by "("), not a keyword, not a grouping clause's labels, not a
    Grafana variable ($__rate_interval)."""
    found = [(kind, expr[start:end]) for kind, start, end in tokens(expr)
             if kind not in ("space", "comment")]
    names: set[str] = set()
    depth = {"{": 0, "[": 0}
    grouping = 0  # inside by (...), on (...)...
    for i, (kind, text) in enumerate(found):
        after = found[i + 1][1] if i + 1 < len(found) else ""
        before = found[i - 1][1] if i else ""
        if text in ("{", "["):
            depth[text] += 1
        elif text in ("}", "]"):
            depth["{" if text == "}" else "["] -= 1
        elif text == "(" and before.lower() in GROUPING:
            grouping = 1
        elif grouping and text == ")":
            grouping = 0
        elif (kind == "name" and not grouping and not any(depth.values())
              and after != "(" and after.lower() not in ("by", "without")  # sum by (...)
              and before != "$" and text.lower() not in KEYWORDS):
            names.add(text)
    return names


def exported(body: str) -> set[str]:
    """Every name a /metrics body has: its samples', and a family's without samples by type."""
    names: set[str] = set()
    for family in text_string_to_metric_families(body):
        names |= {sample.name for sample in family.samples}
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    return names


def serve_metrics(folder: Path) -> str:
    """/metrics of a `runbook serve` started over a database with a drift report in it."""
    url = f"sqlite:///{folder / 'bot.db'}"
    report_summary(make_bot(folder, url), "drift-report")  # its gauges show only after one
    config = {"database_url": url, "runbook_paths": [str(RUNBOOK.parent)],
              "audit": {"ship": {"syslog": {"host": "127.0.0.1", "port": free_port()}}}}
    (folder / "bot.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "bot", "--config", str(folder / "bot.yaml"), "serve",
         "--port", str(port)], env=serve_env(folder), stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=10) as answer:
                    return str(answer.read().decode())
            except OSError:
                assert server.poll() is None, server.communicate()[1]
                assert time.monotonic() < deadline, "runbook serve did not answer /metrics"
                time.sleep(0.1)
    finally:
        stopped(server)


@pytest.fixture
def bot_metrics(tmp_path: Path) -> set[str]:
    """The metric names `runbook serve` exports."""
    names = exported(serve_metrics(tmp_path))
    assert {"runbook_executions", "runbook_audit_ship_lag_events", "runbook_drift_nodes",
            "runbook_http_request_duration_seconds_bucket"} <= names, sorted(names)
    return names


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian's prometheus package; the lab "
                    "installs it): the PromQL was not parsed by Prometheus")
    return found
