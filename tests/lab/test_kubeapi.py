"""The lab's Kubernetes API server checked with real kubectl (and raw HTTP where kubectl
hides the wire): get, cordon, label, taint, drain with and without a blocking PDB, the GPU
Operator's ClusterPolicy and its driver upgrade walk (a skip-labelled node held back),
415/409 Status bodies, API faults and watch. Every test restores what it changes."""
from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lab.fixture import Lab
from tests.lab.kubehelp import (
    DEFAULT_DRIVER,
    DRIVER_LABEL,
    UPGRADE_STATE,
    api,
    have_kubectl,
    is_daemonset_pod,
    kubectl,
    nodes,
    pods_on,
    set_driver,
    settled,
    wait_until,
)

pytestmark = [pytest.mark.lab,
              pytest.mark.skipif(not have_kubectl(), reason="kubectl is missing "
                                 "(real kubectl is needed for the fidelity tests)")]
IDLE = {"upgrade-done", "upgrade-required"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kubectl's discovery cache for this module, away from the user's home."""
    return tmp_path_factory.mktemp("kubecache")


@pytest.fixture
def kube(lab: Lab, cache: Path) -> Iterator[Lab]:
    """The lab, calm before the test (no upgrade running, PDB at one disruption)."""
    wait_until(lambda: settled(lab), "the Kubernetes pool to settle", timeout=40)
    yield lab


def busiest_node(lab: Lab) -> str:
    """The node with the most serving pods (ties: the later name, gpu07 over gpu06)."""
    nodes: list[str] = lab["kubeapi"]["nodes"]
    return max(reversed(nodes), key=lambda n: sum(
        not is_daemonset_pod(p) for p in pods_on(lab, n)))


def test_get_nodes_table_and_json(kube: Lab, cache: Path) -> None:
    table = kubectl(kube, cache, "get", "nodes")
    assert table.returncode == 0, table.stderr
    assert table.stdout.split("\n")[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert {line.split()[0] for line in table.stdout.splitlines()[1:]} == set(
        kube["kubeapi"]["nodes"]) | set(kube["kubeapi"]["handoff_nodes"])
    out = kubectl(kube, cache, "get", "nodes", "-o", "json")
    assert out.returncode == 0, out.stderr
    items = json.loads(out.stdout)["items"]
    gpu05 = next(n for n in items if n["metadata"]["name"] == "gpu05")
    assert gpu05["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert gpu05["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert gpu05["metadata"]["labels"][UPGRADE_STATE] == "upgrade-done"
    missing = kubectl(kube, cache, "get", "node", "gpu99")
    assert missing.returncode == 1
    assert 'Error from server (NotFound): nodes "gpu99" not found' in missing.stderr


def test_cordon_and_uncordon(kube: Lab, cache: Path) -> None:
    try:
        assert kubectl(kube, cache, "cordon", "gpu05").stdout.strip() == "node/gpu05 cordoned"
        assert nodes(kube)["gpu05"]["spec"]["unschedulable"] is True
        shown = kubectl(kube, cache, "get", "node", "gpu05").stdout
        assert "Ready,SchedulingDisabled" in shown
    finally:
        done = kubectl(kube, cache, "uncordon", "gpu05")
    assert done.stdout.strip() == "node/gpu05 uncordoned", done.stderr
    assert not nodes(kube)["gpu05"]["spec"].get("unschedulable")


def test_label_and_remove(kube: Lab, cache: Path) -> None:
    try:
        added = kubectl(kube, cache, "label", "node", "gpu06", "foo=bar", "--overwrite")
        assert added.stdout.strip() == "node/gpu06 labeled", added.stderr
        assert nodes(kube)["gpu06"]["metadata"]["labels"]["foo"] == "bar"
        bad = kubectl(kube, cache, "label", "node", "gpu06", "foo=not ok!", "--overwrite")
        assert bad.returncode != 0  # kubectl refuses it before the server (422 there)
    finally:
        removed = kubectl(kube, cache, "label", "node", "gpu06", "foo-")
    assert removed.stdout.strip() == "node/gpu06 unlabeled", removed.stderr
    assert "foo" not in nodes(kube)["gpu06"]["metadata"]["labels"]


def test_taint_and_remove(kube: Lab, cache: Path) -> None:
    try:
        tainted = kubectl(kube, cache, "taint", "nodes", "gpu06", "key=value:NoSchedule")
        assert tainted.stdout.strip() == "node/gpu06 tainted", tainted.stderr
        assert nodes(kube)["gpu06"]["spec"]["taints"] == [
            {"key": "key", "value": "value", "effect": "NoSchedule"}]
    finally:
        gone = kubectl(kube, cache, "taint", "nodes", "gpu06", "key=value:NoSchedule-")
    assert gone.stdout.strip() == "node/gpu06 untainted", gone.stderr
    assert not nodes(kube)["gpu06"]["spec"].get("taints")


def test_drain_evicts_serving_pods_and_keeps_daemonsets(kube: Lab, cache: Path) -> None:
    node = busiest_node(kube)  # gpu07 in a fresh lab; pods move when nodes are drained
    before = pods_on(kube, node)
    serving = [p["metadata"]["name"] for p in before if not is_daemonset_pod(p)]
    assert serving, f"no serving pod on {node}"
    try:
        drain = kubectl(kube, cache, "drain", node, "--ignore-daemonsets",
                        "--delete-emptydir-data", "--timeout=60s")
        assert drain.returncode == 0, drain.stderr
        assert f"node/{node} drained" in drain.stdout
        for name in serving:
            assert f"pod/{name} evicted" in drain.stdout
        after = pods_on(kube, node)
        assert after and all(is_daemonset_pod(p) for p in after)
        assert len(after) == sum(is_daemonset_pod(p) for p in before)
        code, body = api(kube, "GET", f"/api/v1/namespaces/serving/pods/{serving[0]}")
        assert code == 404 and body["reason"] == "NotFound", body
    finally:
        kubectl(kube, cache, "uncordon", node)


def test_drain_blocked_by_pdb_times_out(kube: Lab, cache: Path) -> None:
    node = busiest_node(kube)
    pdb = ["-n", "serving", "pdb", "inference-pdb", "--type", "merge", "-p"]
    try:
        # No pod may go: minAvailable equals the replica count.
        assert kubectl(kube, cache, "patch", *pdb, '{"spec":{"minAvailable":10}}').returncode == 0
        wait_until(lambda: api(kube, "GET", "/apis/policy/v1/namespaces/serving/"
                               "poddisruptionbudgets/inference-pdb")[1]["status"]
                   ["disruptionsAllowed"] == 0, "the PDB to forbid disruptions")
        drain = kubectl(kube, cache, "drain", node, "--ignore-daemonsets",
                        "--delete-emptydir-data", "--timeout=6s")
        assert drain.returncode != 0
        assert "Cannot evict pod as it would violate the pod's disruption budget" in drain.stderr
        assert "global timeout reached: 6s" in drain.stderr
        assert any(not is_daemonset_pod(p) for p in pods_on(kube, node))
    finally:
        kubectl(kube, cache, "patch", *pdb, '{"spec":{"minAvailable":9}}')
        kubectl(kube, cache, "uncordon", node)


def test_clusterpolicy_upgrade_walks_nodes_within_max_parallel(kube: Lab, cache: Path) -> None:
    shown = kubectl(kube, cache, "get", "clusterpolicy")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split()[:5] == ["NAME", "STATUS", "AGE", "cluster-policy", "ready"]
    new = "550.54.15"
    patch = {"metadata": {"annotations": {"lab.gpu-runbook-bot/upgrade-step-seconds": "0.1"}},
             "spec": {"driver": {"version": new, "upgradePolicy": {"maxParallelUpgrades": 2}}}}
    seen: set[str] = set()
    busiest = 0
    try:
        out = kubectl(kube, cache, "patch", "clusterpolicy", "cluster-policy", "--type", "merge",
                      "-p", json.dumps(patch))
        assert out.stdout.strip() == "clusterpolicy.nvidia.com/cluster-policy patched", out.stderr

        def done() -> bool:
            nonlocal busiest
            states = {n: x["metadata"]["labels"][UPGRADE_STATE] for n, x in nodes(kube).items()}
            seen.update(states.values())
            busiest = max(busiest, sum(s not in IDLE for s in states.values()))
            return all(x["metadata"]["labels"].get(DRIVER_LABEL) == new
                       and x["metadata"]["labels"][UPGRADE_STATE] == "upgrade-done"
                       for x in nodes(kube).values())
        wait_until(done, "every node on the new driver", timeout=40, every=0.05)
        assert busiest == 2, f"at most 2 nodes upgrade at once, saw {busiest}"
        assert {"upgrade-required", "cordon-required", "pod-restart-required",
                "validation-required", "uncordon-required"} <= seen
        faults = json.loads((kube.dir / "faults" / "gpu05.json").read_text())
        assert faults["driver"] == new
    finally:
        set_driver(kube, DEFAULT_DRIVER, 4, 0.1)
        wait_until(lambda: all(x["metadata"]["labels"].get(DRIVER_LABEL) == DEFAULT_DRIVER
                               and x["metadata"]["labels"][UPGRADE_STATE] == "upgrade-done"
                               for x in nodes(kube).values()), "the rollback", timeout=40)
        set_driver(kube, DEFAULT_DRIVER, 1, None)


def test_upgrade_fault_marks_node_failed_until_rollback(kube: Lab, cache: Path) -> None:
    assert kube.lab("fault", "gpu06", "upgrade=fail").returncode == 0
    try:
        set_driver(kube, "550.54.15", 4, 0.1)
        wait_until(lambda: nodes(kube)["gpu06"]["metadata"]["labels"][UPGRADE_STATE]
                   == "upgrade-failed", "gpu06 to fail its upgrade")
        assert nodes(kube)["gpu06"]["spec"]["unschedulable"] is True  # stays cordoned
        assert nodes(kube)["gpu06"]["metadata"]["labels"][DRIVER_LABEL] == DEFAULT_DRIVER
    finally:
        set_driver(kube, DEFAULT_DRIVER, 4, 0.1)  # the rollback recovers the node
        wait_until(lambda: settled(kube), "the rollback", timeout=40)
        kube.lab("fault", "gpu06", "upgrade=ok")
        set_driver(kube, DEFAULT_DRIVER, 1, None)


def test_skip_label_holds_a_node_back_and_nvidiadrivers_need_the_crd_flag(
        kube: Lab, cache: Path) -> None:
    new, skip = "550.54.15", "nvidia.com/gpu-driver-upgrade.skip"
    nvd = "/apis/nvidia.com/v1alpha1/nvidiadrivers"
    code, body = api(kube, "POST", nvd, {  # ignored: useNvidiaDriverCRD is false
        "apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
        "metadata": {"name": "lab-ignored"},
        "spec": {"version": "550.90.07", "nodeSelector": {"kubernetes.io/hostname": "gpu05"}}})
    assert code == 201, body

    def gpu06() -> dict[str, str]:
        return dict(nodes(kube)["gpu06"]["metadata"]["labels"])
    try:
        out = kubectl(kube, cache, "label", "node", "gpu06", f"{skip}=true")
        assert out.returncode == 0, out.stderr
        set_driver(kube, new, 4, 0.05)
        wait_until(lambda: all(x["metadata"]["labels"].get(DRIVER_LABEL) == new
                               for n, x in nodes(kube).items() if n != "gpu06"),
                   "every node but gpu06 on the new driver", timeout=30, every=0.05)
        time.sleep(0.3)  # a few more upgrade steps: gpu06 stays parked
        assert gpu06()[UPGRADE_STATE] == "upgrade-required"
        assert gpu06()[DRIVER_LABEL] == DEFAULT_DRIVER
        kubectl(kube, cache, "label", "node", "gpu06", f"{skip}-")
        wait_until(lambda: gpu06().get(DRIVER_LABEL) == new
                   and gpu06()[UPGRADE_STATE] == "upgrade-done",
                   "gpu06 upgraded once the label is gone", timeout=20, every=0.05)
    finally:
        kubectl(kube, cache, "label", "node", "gpu06", f"{skip}-")
        api(kube, "DELETE", f"{nvd}/lab-ignored")
        set_driver(kube, DEFAULT_DRIVER, 4, 0.05)
        wait_until(lambda: settled(kube) and all(
            x["metadata"]["labels"].get(DRIVER_LABEL) == DEFAULT_DRIVER
            for x in nodes(kube).values()), "the rollback", timeout=40)
        set_driver(kube, DEFAULT_DRIVER, 1, None)


def test_strategic_merge_on_custom_resource_is_415(kube: Lab, cache: Path) -> None:
    out = kubectl(kube, cache, "patch", "clusterpolicy", "cluster-policy", "--type", "strategic",
                  "-p", '{"spec":{"driver":{"version":"1.2.3"}}}')
    assert out.returncode != 0
    assert "the body of the request was in an unknown format" in out.stderr
    code, body = api(kube, "PATCH", "/apis/nvidia.com/v1/clusterpolicies/cluster-policy",
                     {"spec": {}}, ctype="application/strategic-merge-patch+json")
    assert (code, body["kind"], body["reason"], body["code"]) == (
        415, "Status", "UnsupportedMediaType", 415)


def test_stale_resource_version_is_409(kube: Lab) -> None:
    path = "/apis/coordination.k8s.io/v1/namespaces/default/leases/kubeapi-test"
    code, lease = api(kube, "POST", "/apis/coordination.k8s.io/v1/namespaces/default/leases",
                      {"metadata": {"name": "kubeapi-test"}, "spec": {"holderIdentity": "a"}})
    assert code == 201, lease
    try:
        first = dict(lease, spec={"holderIdentity": "b"})
        code, updated = api(kube, "PUT", path, first)
        assert code == 200 and updated["spec"]["holderIdentity"] == "b"
        assert int(updated["metadata"]["resourceVersion"]) > int(
            lease["metadata"]["resourceVersion"])
        code, body = api(kube, "PUT", path, dict(lease, spec={"holderIdentity": "c"}))
        assert code == 409, body
        assert body["reason"] == "Conflict" and body["status"] == "Failure"
        assert body["details"] == {"name": "kubeapi-test", "group": "coordination.k8s.io",
                                   "kind": "leases"}
        assert body["message"].startswith('Operation cannot be fulfilled on leases.'
                                          'coordination.k8s.io "kubeapi-test"')
        code, body = api(kube, "POST", "/apis/coordination.k8s.io/v1/namespaces/default/leases",
                         {"metadata": {"name": "kubeapi-test"}})
        assert (code, body["reason"]) == (409, "AlreadyExists")
    finally:
        assert api(kube, "DELETE", path)[0] == 200
    assert api(kube, "GET", path)[0] == 404


def test_api_500_fault(kube: Lab, cache: Path) -> None:
    kubectl(kube, cache, "get", "nodes")  # discovery cached: the fault hits the request itself
    try:
        assert kube.lab("fault", "kube", "api=500").returncode == 0
        out = kubectl(kube, cache, "get", "nodes")
        assert out.returncode != 0
        assert "InternalError" in out.stderr or "error on the server" in out.stderr
        code, body = api(kube, "GET", "/api/v1/nodes")
        assert (code, body["reason"]) == (500, "InternalError")
    finally:
        kube.lab("fault", "kube", "api=ok")
    assert kubectl(kube, cache, "get", "nodes").returncode == 0


def test_api_hang_fault_times_out(kube: Lab, cache: Path) -> None:
    kubectl(kube, cache, "get", "nodes")
    try:
        assert kube.lab("fault", "kube", "api=hang").returncode == 0
        began = time.monotonic()
        out = kubectl(kube, cache, "get", "nodes", request_timeout="2s", timeout=60)
        took = time.monotonic() - began
        assert out.returncode != 0
        # "Client.Timeout exceeded" or "context deadline exceeded", by kubectl version
        assert "exceeded" in out.stderr or "timeout" in out.stderr.lower(), out.stderr
        assert took < 30
    finally:
        kube.lab("fault", "kube", "api=ok")
    assert kubectl(kube, cache, "get", "nodes").returncode == 0


def test_watch_streams_a_label_change(kube: Lab) -> None:
    code, listed = api(kube, "GET", "/api/v1/nodes?fieldSelector=metadata.name%3Dgpu06")
    rv = listed["metadata"]["resourceVersion"]
    url = (f"{kube['kubeapi']['url']}/api/v1/nodes?watch=1&resourceVersion={rv}"
           "&fieldSelector=metadata.name%3Dgpu06&timeoutSeconds=10")
    events: list[dict[str, Any]] = []

    def read() -> None:
        with urllib.request.urlopen(url, timeout=15) as stream:
            events.append(json.loads(stream.readline()))
    reader = threading.Thread(target=read)
    reader.start()
    try:
        time.sleep(0.3)
        code, _ = api(kube, "PATCH", "/api/v1/nodes/gpu06",
                      {"metadata": {"labels": {"watched": "yes"}}},
                      ctype="application/strategic-merge-patch+json")
        assert code == 200
        reader.join(timeout=10)
        assert events, "no watch event arrived"
        event = events[0]
        assert event["type"] == "MODIFIED"
        assert event["object"]["metadata"]["labels"]["watched"] == "yes"
        assert int(event["object"]["metadata"]["resourceVersion"]) > int(rv)
    finally:
        api(kube, "PATCH", "/api/v1/nodes/gpu06", {"metadata": {"labels": {"watched": None}}},
            ctype="application/merge-patch+json")
