"""Contract tests of the Kubernetes adapter against the lab's Kubernetes API server.

The backend is ``ClientBackend`` (the official ``kubernetes`` client) built from the lab's
kubeconfig. Each test starts from a calm pool (every node upgrade-done and schedulable, the
serving PDB allowing one disruption) and restores what it changed: nodes uncordoned, labels
and taints removed, the PDB, the ClusterPolicy's driver version and annotation, lab faults,
test Leases.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from adapters.actions import ActionContext, ActionError, ActionTimeout
from adapters.kubernetes.actions import KubernetesActions
from adapters.kubernetes.backend import KubernetesNotFound, KubernetesUnavailable
from adapters.kubernetes.client import ClientBackend
from adapters.kubernetes.config import KubernetesConfig
from adapters.kubernetes.leader import LeaseElector
from tests.lab.fixture import Lab
from tests.lab.kubehelp import (
    DEFAULT_DRIVER,
    DRIVER_LABEL,
    TEST_USER_AGENT,
    UPGRADE_STATE,
    api,
    is_daemonset_pod,
    nodes,
    pods_on,
    settled,
    wait_until,
)

pytestmark = pytest.mark.lab

NEW_DRIVER = "550.54.15"
# the lab's GPU nodes in Kubernetes: the serving pool and gpu04, which serves Slurm (the GPU
# Operator runs on it all the same: its DaemonSets tolerate the pool taint)
GPU_NODES = ["gpu04", "gpu05", "gpu06", "gpu07", "gpu08"]
PDB_PATH = "/apis/policy/v1/namespaces/serving/poddisruptionbudgets/inference-pdb"
CP_PATH = "/apis/nvidia.com/v1/clusterpolicies/cluster-policy"
STEP = "lab.gpu-runbook-bot/upgrade-step-seconds"


@dataclass
class Kube:
    lab: Lab
    config: KubernetesConfig
    backend: ClientBackend
    calls: list[tuple[str, str]] = field(default_factory=list)
    actions: dict[str, Any] = field(default_factory=dict)

    def run(self, name: str, ctx: ActionContext | None = None, /, **arguments: Any) -> Any:
        action = self.actions[name]
        return action.run(action.Arguments(**arguments), ctx or context())

    def plan(self, name: str, /, **arguments: Any) -> list[str]:
        action = self.actions[name]
        lines: list[str] = action.plan(action.Arguments(**arguments))
        return lines


def context(seconds: float = 60, lines: list[str] | None = None) -> ActionContext:
    sink = lines if lines is not None else []
    return ActionContext(execution_id=1, step_id="test", deadline=time.monotonic() + seconds,
                         progress=sink.append)


def lab_config(lab: Lab, **overrides: Any) -> KubernetesConfig:
    return KubernetesConfig.model_validate({
        "kubeconfig": lab["kubeapi"]["kubeconfig"],
        "eviction_retry": 0.5,
        "gpu_operator": {"driver_version_label": DRIVER_LABEL},
        **overrides,
    })


def make_kube(lab: Lab, **overrides: Any) -> Kube:
    config = lab_config(lab, **overrides)
    backend = ClientBackend(config)
    handle = Kube(lab, config, backend)
    real = backend.api_client.call_api

    def counting(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        handle.calls.append((method, url))
        return real(method, url, *args, **kwargs)

    backend.api_client.call_api = counting  # type: ignore[method-assign]
    handle.actions = KubernetesActions(backend, config).by_name()
    return handle


def set_pdb(lab: Lab, min_available: int) -> None:
    code, body = api(lab, "PATCH", PDB_PATH, {"spec": {"minAvailable": min_available}},
                     ctype="application/merge-patch+json")
    assert code == 200, body


def set_step(lab: Lab, seconds: float | None) -> None:
    code, body = api(lab, "PATCH", CP_PATH, {"metadata": {"annotations": {
        STEP: str(seconds) if seconds else None}}}, ctype="application/merge-patch+json")
    assert code == 200, body


def uncordon_all(lab: Lab) -> None:
    for name, node in nodes(lab).items():
        if node["spec"].get("unschedulable"):
            api(lab, "PATCH", f"/api/v1/nodes/{name}", {"spec": {"unschedulable": None}},
                ctype="application/strategic-merge-patch+json")


@pytest.fixture
def kube(lab: Lab) -> Iterator[Kube]:
    wait_until(lambda: settled(lab), "the Kubernetes pool to settle", timeout=40)
    handle = make_kube(lab)
    try:
        yield handle
    finally:
        handle.backend.close()
        lab.lab("fault", "kube", "api=ok", timeout=30)
        set_pdb(lab, 9)
        uncordon_all(lab)
        wait_until(lambda: settled(lab), "the pool to settle after the test", timeout=40)


def test_cordon_and_uncordon_are_idempotent(kube: Kube) -> None:
    assert kube.plan("k8s.cordon", node="gpu05") == ["kubectl cordon gpu05"]
    assert kube.plan("k8s.uncordon", node="gpu05") == ["kubectl uncordon gpu05"]
    first = kube.run("k8s.cordon", node="gpu05")
    assert first.changed and first.summary == "cordoned gpu05"
    assert nodes(kube.lab)["gpu05"]["spec"]["unschedulable"] is True
    assert not kube.run("k8s.cordon", node="gpu05").changed
    assert kube.run("k8s.uncordon", node="gpu05").changed
    assert not nodes(kube.lab)["gpu05"]["spec"].get("unschedulable")
    again = kube.run("k8s.uncordon", node="gpu05")
    assert not again.changed and "already schedulable" in again.summary


def test_label_add_and_remove(kube: Kube) -> None:
    labels = {"grb-test/maintenance": "window-1", "grb-test/other": None}
    assert kube.plan("k8s.label", node="gpu06", labels=labels) == [
        "kubectl label node gpu06 --overwrite grb-test/maintenance=window-1 grb-test/other-"]
    try:
        added = kube.run("k8s.label", node="gpu06", labels=labels)
        assert added.changed
        assert added.details["previous"] == {"grb-test/maintenance": None}
        assert nodes(kube.lab)["gpu06"]["metadata"]["labels"]["grb-test/maintenance"] == \
            "window-1"
        assert not kube.run("k8s.label", node="gpu06", labels=labels).changed
        removed = kube.run("k8s.label", node="gpu06", labels={"grb-test/maintenance": None})
        assert removed.changed
        assert "grb-test/maintenance" not in nodes(kube.lab)["gpu06"]["metadata"]["labels"]
        assert not kube.run("k8s.label", node="gpu06",
                            labels={"grb-test/maintenance": None}).changed
    finally:
        api(kube.lab, "PATCH", "/api/v1/nodes/gpu06", {"metadata": {"labels": {
            "grb-test/maintenance": None}}}, ctype="application/merge-patch+json")
    with pytest.raises(ValueError, match="not a Kubernetes label value"):
        kube.actions["k8s.label"].Arguments(node="gpu06", labels={"a": "bad value"})


def test_taint_add_and_remove(kube: Kube) -> None:
    assert kube.plan("k8s.taint", node="gpu07", key="grb-test/maint", value="yes",
                     effect="NoSchedule") == [
        "kubectl taint nodes gpu07 grb-test/maint=yes:NoSchedule --overwrite"]
    assert kube.plan("k8s.taint", node="gpu07", key="grb-test/maint", remove=True) == [
        "kubectl taint nodes gpu07 grb-test/maint:NoSchedule-"]
    try:
        assert kube.run("k8s.taint", node="gpu07", key="grb-test/maint", value="yes").changed
        taints = nodes(kube.lab)["gpu07"]["spec"]["taints"]
        assert {"key": "grb-test/maint", "value": "yes", "effect": "NoSchedule"} in taints
        assert not kube.run("k8s.taint", node="gpu07", key="grb-test/maint",
                            value="yes").changed
        changed = kube.run("k8s.taint", node="gpu07", key="grb-test/maint", value="no")
        assert changed.changed and changed.details["previous"] == ["grb-test/maint=yes:NoSchedule"]
        assert kube.run("k8s.taint", node="gpu07", key="grb-test/maint", remove=True).changed
        assert not [t for t in nodes(kube.lab)["gpu07"]["spec"].get("taints") or []
                    if t["key"] == "grb-test/maint"]
        assert not kube.run("k8s.taint", node="gpu07", key="grb-test/maint",
                            remove=True).changed
    finally:
        left = [t for t in nodes(kube.lab)["gpu07"]["spec"].get("taints") or []
                if t["key"] != "grb-test/maint"]
        api(kube.lab, "PATCH", "/api/v1/nodes/gpu07", {"spec": {"taints": left or None}},
            ctype="application/merge-patch+json")


def test_wait_labels(kube: Kube) -> None:
    done = kube.run("k8s.wait_labels", label_selector="nvidia.com/gpu.present=true",
                    labels={DRIVER_LABEL: DEFAULT_DRIVER, "grb-test/absent": None},
                    timeout=5, poll=0.1)
    assert not done.changed and done.details["nodes"] == GPU_NODES
    with pytest.raises(ActionTimeout, match=r"gpu05: grb-test/x=\(absent\) \(want y\)"):
        kube.run("k8s.wait_labels", node="gpu05", labels={"grb-test/x": "y"}, timeout=0.5,
                 poll=0.1)


def test_drain_evicts_serving_pods_keeps_daemonsets_and_counts_calls(kube: Kube) -> None:
    set_pdb(kube.lab, 0)  # nothing blocks: measure the plain path
    wait_until(lambda: api(kube.lab, "GET", PDB_PATH)[1]["status"]["disruptionsAllowed"] >= 9,
               "the PDB to allow every disruption", timeout=10)
    before = pods_on(kube.lab, "gpu05")
    serving = sorted(f"serving/{p['metadata']['name']}" for p in before
                     if not is_daemonset_pod(p))
    daemons = sorted(p["metadata"]["name"] for p in before if is_daemonset_pod(p))
    assert serving and len(daemons) == 3
    assert kube.plan("k8s.drain", node="gpu05", timeout="2m") == [
        "kubectl drain gpu05 --ignore-daemonsets --delete-emptydir-data --timeout=2m"]
    lines: list[str] = []
    kube.calls.clear()
    result = kube.run("k8s.drain", context(60, lines), node="gpu05", timeout="60s")
    calls = len(kube.calls)
    assert result.changed and result.details["cordoned"]
    assert sorted(result.details["evicted"]) == serving
    assert result.details["eviction_refusals"] == 0
    after = pods_on(kube.lab, "gpu05")
    assert sorted(p["metadata"]["name"] for p in after) == daemons  # DaemonSet pods stay
    assert nodes(kube.lab)["gpu05"]["spec"]["unschedulable"] is True
    for key in serving:
        assert f"evicted {key}" in lines and f"{key} gone" in lines
    evictions = [url for method, url in kube.calls if url.endswith("/eviction")]
    assert len(evictions) == len(serving)
    assert calls / len(serving) <= 3, kube.calls  # node read, list, cordon, evictions, lists
    again = kube.run("k8s.drain", node="gpu05")
    assert not again.changed and again.summary == "gpu05 already drained"


def test_drain_retries_the_pdb_pod_by_pod(kube: Kube) -> None:
    node = "gpu08"  # three serving pods; the PDB lets one go at a time
    lines: list[str] = []
    result = kube.run("k8s.drain", context(60, lines), node=node, timeout="40s")
    assert result.changed and len(result.details["evicted"]) >= 2
    assert result.details["eviction_refusals"] > 0
    assert any("eviction refused (PodDisruptionBudget serving/inference-pdb" in line
               for line in lines), lines
    assert all(is_daemonset_pod(p) for p in pods_on(kube.lab, node))


def test_drain_blocked_by_pdb_times_out_naming_pods_and_pdb(kube: Kube) -> None:
    set_pdb(kube.lab, 10)  # no disruption allowed
    wait_until(lambda: api(kube.lab, "GET", PDB_PATH)[1]["status"]["disruptionsAllowed"] == 0,
               "the PDB to forbid disruptions", timeout=10)
    blocked = sorted(p["metadata"]["name"] for p in pods_on(kube.lab, "gpu06")
                     if not is_daemonset_pod(p))
    began = time.monotonic()
    with pytest.raises(ActionTimeout) as timeout:
        kube.run("k8s.drain", node="gpu06", timeout=1.5)
    assert time.monotonic() - began < 1.5 + 1.5
    message = str(timeout.value)
    assert message.startswith("drain of gpu06 timed out after 1.5s:")
    assert "PodDisruptionBudget serving/inference-pdb" in message
    assert "kubectl -n serving get pdb inference-pdb" in message
    for name in blocked:
        assert f"serving/{name} blocked by" in message
    assert "gpu06 stays cordoned" in message
    assert len(pods_on(kube.lab, "gpu06")) == len(blocked) + 3  # nothing was evicted


def test_drain_refuses_emptydir_pods_without_consent(kube: Kube) -> None:
    with pytest.raises(ActionError, match=r"local storage \(emptyDir\).*nothing was changed"):
        kube.run("k8s.drain", node="gpu07", delete_emptydir_data=False)
    assert not nodes(kube.lab)["gpu07"]["spec"].get("unschedulable")


def test_missing_node_is_a_clear_error(kube: Kube) -> None:
    for name, extra in (("k8s.cordon", {}), ("k8s.drain", {}),
                        ("k8s.label", {"labels": {"a": "b"}})):
        with pytest.raises(KubernetesNotFound, match='Kubernetes has no node "gpu99"') as err:
            kube.run(name, node="gpu99", **extra)
        assert err.value.status == 404
    with pytest.raises(ActionError, match="Kubernetes has no node gpu99"):
        kube.run("gpu_operator.wait_upgrade_state", nodes=["gpu05", "gpu99"], timeout=1)


def test_api_500_is_a_clear_error(kube: Kube) -> None:
    assert kube.lab.lab("fault", "kube", "api=500", timeout=30).returncode == 0
    with pytest.raises(KubernetesUnavailable) as err:
        kube.run("k8s.cordon", node="gpu05")
    assert err.value.status == 500 and err.value.reason == "InternalError"
    text = str(err.value)
    assert text.startswith(f"Kubernetes API not answering at {kube.lab['kubeapi']['url']}: "
                           "GET /api/v1/nodes/gpu05 answered 500 InternalError: ")
    assert err.value.api_message and err.value.api_message in text  # the Status, verbatim


def test_api_hang_times_out_within_the_request_timeout(lab: Lab, kube: Kube) -> None:
    quick = make_kube(lab, request_timeout=1.0)
    try:
        assert lab.lab("fault", "kube", "api=hang", timeout=30).returncode == 0
        began = time.monotonic()
        with pytest.raises(KubernetesUnavailable, match=r"no answer within 1s \(timeout\)") \
                as err:
            quick.run("k8s.drain", node="gpu05")
        took = time.monotonic() - began
        assert took < 1.0 + 1.0, took
        assert "GET /api/v1/nodes/gpu05" in str(err.value) and err.value.status == 0
    finally:
        lab.lab("fault", "kube", "api=ok", timeout=30)
        quick.backend.close()
    assert not quick.run("k8s.uncordon", node="gpu05").changed  # it answers again


@pytest.fixture
def fast_upgrades(kube: Kube) -> Iterator[Kube]:
    """ClusterPolicy upgrade steps of 0.1 s; the default driver and step afterwards."""
    set_step(kube.lab, 0.1)
    try:
        yield kube
    finally:
        kube.lab.lab("fault", "gpu06", "upgrade=ok", timeout=30)
        kube.run("gpu_operator.set_driver_version", version=DEFAULT_DRIVER)
        try:
            # The lab's controller retries a failed node only after it reads the cleared
            # fault: wait for that first, or the wait below stops at the old failure.
            wait_until(lambda: all(n["metadata"]["labels"].get(UPGRADE_STATE) != "upgrade-failed"
                                   for n in nodes(kube.lab).values()),
                       "gpu06 to leave upgrade-failed", timeout=40)
            kube.run("gpu_operator.wait_upgrade_state", timeout=40, poll=0.1)
        finally:
            set_step(kube.lab, None)


def test_set_driver_version_and_wait_for_every_node(fast_upgrades: Kube) -> None:
    kube = fast_upgrades
    assert kube.plan("gpu_operator.set_driver_version", version=NEW_DRIVER) == [
        "kubectl patch clusterpolicies.nvidia.com cluster-policy --type merge "
        f"""-p '{{"spec":{{"driver":{{"version":"{NEW_DRIVER}"}}}}}}'"""]
    result = kube.run("gpu_operator.set_driver_version", version=NEW_DRIVER)
    assert result.changed
    assert result.details["previous_version"] == DEFAULT_DRIVER
    assert result.details["version"] == NEW_DRIVER
    assert not kube.run("gpu_operator.set_driver_version", version=NEW_DRIVER).changed
    lines: list[str] = []
    done = kube.run("gpu_operator.wait_upgrade_state", context(60, lines), timeout=40, poll=0.1)
    assert done.details["version"] == NEW_DRIVER
    assert {n: s["state"] for n, s in done.details["nodes"].items()} == {
        n: "upgrade-done" for n in GPU_NODES}
    assert kube.backend.driver_versions() == {n: NEW_DRIVER for n in GPU_NODES}
    # Progress: each node's moves as the polls see them, ending in upgrade-done.
    for name in GPU_NODES:
        assert any(line.startswith(f"{name}: ") and "-> upgrade-done" in line
                   for line in lines), lines
    assert any(f"(driver {NEW_DRIVER})" in line for line in lines), lines
    check = kube.run("gpu_operator.driver_versions", expect=NEW_DRIVER)
    assert check.details["target"] == NEW_DRIVER
    with pytest.raises(ActionError, match=f"not every node reports driver {DEFAULT_DRIVER}"):
        kube.run("gpu_operator.driver_versions", expect=DEFAULT_DRIVER)
    validated = kube.run("gpu_operator.wait_validator", timeout=20, poll=0.1)
    assert sorted(validated.details["pods"]) == GPU_NODES


def test_upgrade_failed_stops_the_wait_naming_the_node(fast_upgrades: Kube) -> None:
    kube = fast_upgrades
    assert kube.lab.lab("fault", "gpu06", "upgrade=fail", timeout=30).returncode == 0
    kube.run("gpu_operator.set_driver_version", version=NEW_DRIVER)
    began = time.monotonic()
    with pytest.raises(ActionError) as err:
        kube.run("gpu_operator.wait_upgrade_state", timeout=40, poll=0.1)
    assert not isinstance(err.value, ActionTimeout)
    assert time.monotonic() - began < 30
    message = str(err.value)
    assert message.startswith(f"driver upgrade to {NEW_DRIVER} failed: gpu06 reports "
                              "nvidia.com/gpu-driver-upgrade-state=upgrade-failed "
                              f"(still on driver {DEFAULT_DRIVER})")
    assert "gpu05 upgrade-done" in message  # the other nodes' states
    with pytest.raises(ActionTimeout, match="validator"):
        kube.run("gpu_operator.wait_validator", node="gpu06", timeout=0.5, poll=0.1)


def remove_lease(kube: Kube, name: str) -> None:
    """Test cleanup with the adapter's delete_lease, from a client that says it is a test
    (the bot never deletes Leases, so its role may not: tests/deploy/test_rbac.py)."""
    cleaner = ClientBackend(kube.config)
    cleaner.api_client.user_agent = TEST_USER_AGENT
    try:
        cleaner.delete_lease("default", name)
    finally:
        cleaner.close()


def attempt(elector: LeaseElector, barrier: threading.Barrier, results: list[bool]) -> None:
    barrier.wait()
    results.append(elector.try_acquire())


def test_lease_leader_election(kube: Kube) -> None:
    name = f"grb-test-{time.monotonic_ns()}"
    a = LeaseElector(kube.backend, name, "default", "replica-a", lease_seconds=1)
    b = LeaseElector(kube.backend, name, "default", "replica-b", lease_seconds=1)
    try:
        assert a.try_acquire() and a.is_leader()
        assert not b.try_acquire() and not b.is_leader()
        assert a.try_acquire()  # renew
        renewed = time.monotonic()
        # a stops renewing: b takes over once the record has not changed for a lease.
        wait_until(b.try_acquire, "b to take over", timeout=5, every=0.1)
        waited = time.monotonic() - renewed
        assert 0.9 <= waited < 3, waited
        assert not a.try_acquire() and not a.is_leader()
        lease = kube.backend.get_lease("default", name)
        assert lease is not None and lease.holder == "replica-b" and lease.transitions == 1
        b.release()
        assert a.try_acquire()  # a released lease is free at once
    finally:
        remove_lease(kube, name)

    # Racing for a fresh lease: exactly one of two electors wins, every time.
    for round_ in range(5):
        race = f"{name}-race-{round_}"
        electors = [LeaseElector(kube.backend, race, "default", f"r{i}", lease_seconds=5)
                    for i in range(2)]
        results: list[bool] = []
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=attempt, args=(e, barrier, results))
                   for e in electors]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        try:
            assert sorted(results) == [False, True]
        finally:
            remove_lease(kube, race)
