"""The shipped GPU alert rules follow the bot's XID table: GpuXid fires for exactly the XIDs
whose default action (bot/config/remediation.py, DEFAULT_XID_ACTIONS) is not `none`, through
both the last-XID gauge and the windowed count, and carries node, gpu and xid; promtool's
unit tests of the rules pass."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.config.remediation import DEFAULT_XID_ACTIONS, RemediationConfig

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "gpu-alerts.yaml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "gpu-alerts.test.yaml"
GAUGE = re.compile(r'DCGM_FI_DEV_XID_ERRORS == (\d+), "xid", "(\d+)"')
COUNT = re.compile(r'DCGM_EXP_XID_ERRORS_COUNT\{xid=~"([0-9|]+)"\}')


def rule(name: str) -> dict[str, Any]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    found = [r for g in groups for r in g["rules"] if r.get("alert") == name]
    assert len(found) == 1, f"{len(found)} rules named {name}"
    one: dict[str, Any] = found[0]
    return one


def alerted(expr: str) -> tuple[set[int], set[int]]:
    """The XIDs an expression alerts on: through the gauge, through the windowed count."""
    pairs = GAUGE.findall(expr)
    assert pairs and all(value == label for value, label in pairs), pairs
    counts = COUNT.findall(expr)
    assert len(counts) == 1, counts
    return {int(value) for value, _ in pairs}, {int(x) for x in counts[0].split("|")}


def test_gpu_xid_alerts_exactly_the_tables_xids() -> None:
    wanted = {xid for xid, action in DEFAULT_XID_ACTIONS.items() if action != "none"}
    assert wanted == {xid for xid, action in RemediationConfig().xid.items() if action != "none"}
    gauge, count = alerted(rule("GpuXid")["expr"])
    assert gauge == wanted, f"alerted only: {gauge - wanted}, not alerted: {wanted - gauge}"
    assert count == wanted, f"alerted only: {count - wanted}, not alerted: {wanted - count}"


def test_gpu_xid_labels() -> None:
    found = rule("GpuXid")
    assert "max by (node, gpu, UUID, xid)" in found["expr"]
    assert '"node", "$1", "hostname"' in found["expr"] and '"node", "$1", "Hostname"' in found[
        "expr"]
    assert "xid" not in found["labels"]  # from the expression: never a templated value
    assert "{{ $labels.xid }}" in found["annotations"]["summary"]


def test_the_older_xid_alerts_alert_only_table_xids() -> None:
    """GpuXidFallenOffBus & co. stay for existing routes; none of them alerts an XID the
    table says needs nothing."""
    wanted = {xid for xid, action in DEFAULT_XID_ACTIONS.items() if action != "none"}
    for name in ("GpuXidFallenOffBus", "GpuXidUncorrectable", "GpuXidNvlink", "GpuXidGsp"):
        expr = rule(name)["expr"]
        gauge = {int(v) for v, _ in GAUGE.findall(expr)}
        count = {int(x) for c in COUNT.findall(expr) for x in c.split("|")}
        count |= {int(x) for x in re.findall(r'xid="(\d+)"', expr)}
        assert gauge and gauge == count and gauge <= wanted, (name, gauge, count)


def test_promtool_unit_tests_pass() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package; the lab "
                    "installs it): the rule tests did not run")
    done = subprocess.run([promtool, "test", "rules", str(RULE_TESTS)], capture_output=True,
                          text=True, timeout=60, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
