"""`lab reset` on the shared lab: dirty every part it resets, reset, and find each back as
`lab up` left it (the shared lab is left clean: that is the point)."""
from __future__ import annotations

import json
import os
import sqlite3
import sys
import tempfile
import urllib.request
from typing import Any

import pytest

from tests.lab.fixture import REPO, Lab, lab_command

sys.path.insert(0, str(REPO / "deploy" / "lab"))
from labkit import slackclient

pytestmark = pytest.mark.lab


def call(url: str, method: str = "GET", body: Any = None, token: str = "t",
         content_type: str = "application/json") -> Any:
    request = urllib.request.Request(
        url, method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": content_type, "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


def scontrol_node(lab: Lab, node: str) -> str:
    return lab.run("scontrol", "-o", "show", "node", node).stdout


def dirty(lab: Lab) -> dict[str, str]:
    """A drained node, a reservation, a running job, a feature, GPU and API faults, a
    cordoned Kubernetes node, a silence, a Slack message and a bot database."""
    first, second, third = lab["slurmd_nodes"][:3]
    kube_node = lab["kubeapi"]["nodes"][-1]
    assert lab.run("scontrol", "update", f"NodeName={second}", "State=DRAIN",
                   "Reason=reset-test").returncode == 0
    assert lab.run("scontrol", "create", "reservation", "ReservationName=reset-test",
                   f"Nodes={first}", "StartTime=now", "Duration=60", "Users=root",
                   "Flags=maint").returncode == 0
    assert lab.run("sbatch", "-o", "/dev/null", "-N1", "-w", third,
                   "--wrap", "sleep 300").returncode == 0
    assert lab.run("scontrol", "update", f"NodeName={third}", "AvailableFeatures=dirty",
                   "ActiveFeatures=dirty").returncode == 0
    assert lab.lab("fault", first, "health=fail", "temp=150").returncode == 0
    call(f"{lab['kubeapi']['url']}/api/v1/nodes/{kube_node}", "PATCH",
         {"spec": {"unschedulable": True}}, content_type="application/merge-patch+json")
    am = lab["monitoring"]["alertmanager_url"]
    call(f"{am}/api/v2/silences", "POST", {
        "matchers": [{"name": "node", "value": first, "isRegex": False}],
        "startsAt": "2020-01-01T00:00:00Z", "endsAt": "2099-01-01T00:00:00Z",
        "createdBy": "reset-test", "comment": "reset-test"})
    call(f"{am}/api/v2/alerts", "POST", [{"labels": {"alertname": "ResetTest", "node": first},
                                         "endsAt": "2099-01-01T00:00:00Z"}])
    call(f"{lab.env['SLACK_API_URL']}chat.postMessage", "POST",
         {"channel": lab["slack"]["channel"], "text": "reset-test"},
         token=lab.env["SLACK_BOT_TOKEN"])
    with sqlite3.connect(lab.dir / "bot.db") as db:
        db.execute("CREATE TABLE IF NOT EXISTS reset_test (x)")
    assert lab.lab("fault", "kube", "api=500").returncode == 0
    return {"first": first, "second": second, "third": third, "kube": kube_node}


def test_reset_puts_back_what_lab_up_left(lab: Lab) -> None:
    lab.reload()
    names = dirty(lab)
    assert slackclient.messages(lab["slack"]["url"])["messages"]
    reset = lab.lab("reset", timeout=120)
    assert reset.returncode == 0, reset.stderr
    assert "cancelled 1" in reset.stdout and "deleted 1" in reset.stdout
    assert lab.run("squeue", "--all", "-h").stdout.strip() == ""
    assert "ReservationName" not in lab.run("scontrol", "-o", "show", "res").stdout
    for node in lab["slurmd_nodes"]:
        line = scontrol_node(lab, node)
        assert " State=IDLE " in line and "AvailableFeatures=(null)" in line, line
    assert not (lab.dir / "faults" / f"{names['first']}.json").exists()
    assert not (lab.dir / "faults" / "kube.json").exists()
    node = call(f"{lab['kubeapi']['url']}/api/v1/nodes/{names['kube']}")
    assert not node["spec"].get("unschedulable")
    am = lab["monitoring"]["alertmanager_url"]
    assert all(s["status"]["state"] == "expired" for s in call(f"{am}/api/v2/silences"))
    assert call(f"{am}/api/v2/alerts") == [], "an alert still active in Alertmanager"
    assert not slackclient.messages(lab["slack"]["url"])["messages"]
    assert not (lab.dir / "bot.db").exists()
    again = lab.lab("reset", timeout=120)  # idempotent: nothing left to do
    assert again.returncode == 0, again.stderr
    assert "cancelled 0" in again.stdout and "restored 0" in again.stdout


def test_reset_refuses_a_lab_that_is_not_running() -> None:
    folder = tempfile.mkdtemp(prefix="grb-r-")
    env = dict(os.environ, RUNBOOK_LAB_DIR=folder)
    out = lab_command("reset", env=env, timeout=30)
    assert out.returncode == 1
    assert "is not running" in out.stderr and "lab up" in out.stderr
    assert os.listdir(folder) == []
    os.rmdir(folder)
