"""DCGM's diagnostic on a Kubernetes-only node, on the lab: resume-node runs `dcgmi diag` as
a Job pinned to gpu06 (the lab's Job controller runs the lab's dcgmi on that node). With
`lab fault gpu06 health=fail` the node stays cordoned, marked as a failed check naming the
failing GPU, and the Job is gone with its pod; cleared, the same request (break-glass: the
failed check's cordon is the bot's) passes with the diagnostic's output in the audit log.
The lab's API server deletes a Job's pods only when asked (propagationPolicy), as the real
one does: the adapter asks."""

from __future__ import annotations

import time

import pytest

from adapters.kubernetes.cordons import FAILED_CHECK
from bot.service import Service
from tests.lab.fixture import Lab
from tests.lab.kubehelp import api, nodes, wait_until
from tests.runbooks.test_slurm_runbooks import bot, events, run

pytestmark = pytest.mark.lab
__all__ = ["bot"]  # the fixture, shared with the Slurm runbook tests

NS = "gpu-runbook-bot"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"


def leftovers(lab: Lab) -> list[str]:
    """The diagnostic Jobs and pods left in the bot's namespace."""
    _, jobs = api(lab, "GET", JOBS)
    _, pods = api(lab, "GET", f"/api/v1/namespaces/{NS}/pods")
    return [j["metadata"]["name"] for j in jobs["items"]] + \
        [p["metadata"]["name"] for p in pods["items"]]


def test_a_failing_diagnostic_keeps_a_kubernetes_node_cordoned(lab: Lab, bot: Service) -> None:
    try:
        drained = run(bot, "drain-node", {"node": "gpu06", "reason": "XID 79"},
                      approvers=("carol", "dave"), break_glass=True)  # below the pool's floor
        assert drained.state == "succeeded", drained.error
        lab.lab("fault", "gpu06", "health=fail")
        failed = run(bot, "resume-node", {"node": "gpu06"})
        assert failed.state == "failed"
        assert "step k8s-diag failed" in (failed.error or ""), failed.error
        said = failed.error or ""
        assert "dcgmi diag failed: Page Retirement/Row Remap | Fail - GPU: 3" in said
        seen = nodes(lab)["gpu06"]
        assert seen["spec"].get("unschedulable")
        assert seen["metadata"]["annotations"][FAILED_CHECK].startswith(
            "dcgmi diag failed: Page Retirement/Row Remap | Fail - GPU: 3")
        assert leftovers(lab) == []
        lab.lab("fault", "gpu06", "clear")
        passed = run(bot, "resume-node", {"node": "gpu06", "override_drains": "true"},
                     approvers=("carol", "dave"), break_glass=True)
        assert passed.state == "succeeded", passed.error
        assert not nodes(lab)["gpu06"]["spec"].get("unschedulable")
        [diag] = [e["data"] for e in events(bot, passed.id) if e["kind"] == "step_finished"
                  and e["data"]["step"] == "k8s-diag"]
        assert "Successfully ran diagnostic for group." in diag["details"]["log"]
        assert diag["details"]["argv"] == ["dcgmi", "diag", "-r", "2"]
        assert leftovers(lab) == []
    finally:
        assert lab.lab("reset", timeout=120).returncode == 0


def test_deleting_a_job_orphans_its_pod_unless_asked(lab: Lab) -> None:
    body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "orphan-check"},
            "spec": {"backoffLimit": 0, "template": {"spec": {
                "nodeName": "gpu07", "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "x", "command": ["dcgmi", "diag",
                                                                       "-r", "1"]}]}}}}
    try:
        for policy, pods_left in ((None, 1), ("Background", 0)):
            code, made = api(lab, "POST", JOBS, body)
            assert code == 201, made
            wait_until(lambda: any(c["type"] == "Complete" for c in (api(
                lab, "GET", f"{JOBS}/orphan-check")[1].get("status") or {}).get(
                    "conditions") or []), "the Job to complete", timeout=20)
            options = {"propagationPolicy": policy} if policy else {}
            assert api(lab, "DELETE", f"{JOBS}/orphan-check", options)[0] == 200
            time.sleep(0.2)
            _, pods = api(lab, "GET", f"/api/v1/namespaces/{NS}/pods")
            assert len(pods["items"]) == pods_left, (policy, pods["items"])
            for pod in pods["items"]:
                api(lab, "DELETE", f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}",
                    {"gracePeriodSeconds": 0})
    finally:
        api(lab, "DELETE", f"{JOBS}/orphan-check", {"propagationPolicy": "Background"})
