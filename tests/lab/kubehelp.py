"""Helpers for the lab Kubernetes API tests: real kubectl, raw HTTP, waiting for calm."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.lab.fixture import Lab

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"
DRIVER_LABEL = "lab.gpu-runbook-bot/driver-version"
DEFAULT_DRIVER = "535.161.08"
# The user agent of test scaffolding that uses the official `kubernetes` client: the lab's
# request log then tells it from the bot's adapter (tests/deploy/test_rbac.py audits only
# the adapter's requests against the bot's ClusterRole).
TEST_USER_AGENT = "grb-lab-tests/1 (kubernetes python client; test scaffolding)"


def have_kubectl() -> bool:
    return Path(KUBECTL).exists()


def kubectl(lab: Lab, cache: Path, *args: str, timeout: float = 90,
            request_timeout: str = "10s") -> subprocess.CompletedProcess[str]:
    env = dict(lab.env, KUBECONFIG=lab["kubeapi"]["kubeconfig"], KUBECACHEDIR=str(cache))
    return subprocess.run([KUBECTL, f"--request-timeout={request_timeout}", *args], env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=timeout, check=False)


def api(lab: Lab, method: str, path: str, body: Any = None,
        ctype: str = "application/json", timeout: float = 10) -> tuple[int, Any]:
    """One raw request; returns (HTTP code, decoded JSON body)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(lab["kubeapi"]["url"] + path, data=data, method=method,
                                     headers={"Content-Type": ctype,
                                              "Authorization": "Bearer test"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def nodes(lab: Lab) -> dict[str, dict[str, Any]]:
    code, body = api(lab, "GET", "/api/v1/nodes")
    assert code == 200, body
    return {n["metadata"]["name"]: n for n in body["items"]}


def set_driver(lab: Lab, version: str, parallel: int, step: float | None) -> None:
    annotations = {"lab.gpu-runbook-bot/upgrade-step-seconds": str(step) if step else None}
    code, body = api(lab, "PATCH", "/apis/nvidia.com/v1/clusterpolicies/cluster-policy", {
        "metadata": {"annotations": annotations},
        "spec": {"driver": {"version": version,
                            "upgradePolicy": {"maxParallelUpgrades": parallel}}}},
        ctype="application/merge-patch+json")
    assert code == 200, body


def wait_until(check: Any, what: str, timeout: float = 30, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def settled(lab: Lab) -> bool:
    """Every node upgrade-done and schedulable, the PDB allows one disruption."""
    code, pdb = api(lab, "GET",
                    "/apis/policy/v1/namespaces/serving/poddisruptionbudgets/inference-pdb")
    if code != 200 or pdb.get("status", {}).get("disruptionsAllowed") != 1:
        return False
    return all(n["metadata"]["labels"].get(UPGRADE_STATE) == "upgrade-done"
               and not n["spec"].get("unschedulable") for n in nodes(lab).values())


def pods_on(lab: Lab, node: str) -> list[dict[str, Any]]:
    code, body = api(lab, "GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")
    assert code == 200, body
    return [p for p in body["items"] if not p["metadata"].get("deletionTimestamp")]


def is_daemonset_pod(pod: dict[str, Any]) -> bool:
    return any(r.get("kind") == "DaemonSet" and r.get("controller")
               for r in pod["metadata"].get("ownerReferences", []))
