"""The bot's RBAC (deploy/kubernetes/base/rbac.yaml) against what its Kubernetes adapter really
sends: the lab's API server logs every request with its RBAC attributes
($LAB/log/kubeapi-audit.jsonl, deploy/lab/kubeapi/audit.py). This test runs last in the
session (tests/deploy/conftest.py), so it judges every request the adapter sent during the
session's tests (the runbooks end to end, the adapter's contract tests, leader election),
plus a round of its own that touches every operation the adapter has (cordon, uncordon,
label, taint, drain with evictions, wait_labels, the GPU diagnostic's Job and log, the GPU
Operator in both driver modes, leader election's Lease), so that it judges the same ground
when run alone.

Two directions, both must hold:
  - every request the adapter sent is allowed by the rendered ClusterRole (or, for Leases,
    by the namespaced Role: the request must be namespaced);
  - every verb on every resource the roles grant was used by some request.
The adapter is the official `kubernetes` client (user agent OpenAPI-Generator/X/python);
kubectl, the lab's probes and test scaffolding (tests.lab.kubehelp.TEST_USER_AGENT, raw
urllib) are not the bot and are left out.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from adapters.actions import ActionContext
from adapters.kubernetes.actions import KubernetesActions
from adapters.kubernetes.client import ClientBackend
from adapters.kubernetes.config import KubernetesConfig
from adapters.kubernetes.leader import LeaseElector
from tests.deploy.conftest import SESSION_STARTED
from tests.deploy.kustomize import render
from tests.lab.fixture import Lab
from tests.lab.kubehelp import DRIVER_LABEL, api, nodes, settled, wait_until

pytestmark = [pytest.mark.lab, pytest.mark.rbac_audit]

ADAPTER_AGENT = re.compile(r"^OpenAPI-Generator/[0-9][^/]*/python$")
# Discovery and version: every authenticated user has them (system:discovery), not our role.
DISCOVERY = re.compile(r"^/(api|apis|version|openapi)(/|$)")
MIN_REQUESTS = 30
NODE = "gpu08"
AUDIT_LABEL = "grb-rbac-audit/touched"
AUDIT_DRIVER = "grb-rbac-audit"
CP_PATH = "/apis/nvidia.com/v1/clusterpolicies/cluster-policy"
NVD_PATH = "/apis/nvidia.com/v1alpha1/nvidiadrivers"

Kind = tuple[str, str, str, bool]  # apiGroup, resource[/subresource], verb, namespaced


def context(seconds: float = 120) -> ActionContext:
    return ActionContext(execution_id=1, step_id="rbac-audit",
                         deadline=time.monotonic() + seconds, progress=lambda line: None)


def kind_of(entry: dict[str, Any]) -> Kind:
    resource = entry["resource"] + (f"/{entry['subresource']}" if entry["subresource"] else "")
    return entry["apiGroup"], resource, entry["verb"], entry["namespace"] is not None


def grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def drive_the_adapter(lab: Lab) -> None:
    """One request of every kind the adapter makes, through its own actions and elector."""
    wait_until(lambda: settled(lab), "the Kubernetes pool to settle", timeout=60)
    config = KubernetesConfig.model_validate({
        "kubeconfig": lab["kubeapi"]["kubeconfig"], "eviction_retry": 0.5,
        "gpu_operator": {"driver_version_label": DRIVER_LABEL}})
    backend = ClientBackend(config)
    actions = KubernetesActions(backend, config).by_name()

    def run(name: str, config_: KubernetesConfig | None = None, **arguments: Any) -> Any:
        action = (KubernetesActions(backend, config_).by_name() if config_ else actions)[name]
        return action.run(action.Arguments(**arguments), context())

    code, policy = api(lab, "GET", CP_PATH)
    assert code == 200, policy
    driver = policy["spec"]["driver"]["version"]
    upgrade_policy = policy["spec"]["driver"].get("upgradePolicy")
    lease = f"grb-rbac-audit-{time.monotonic_ns()}"
    try:
        run("k8s.cordon", node=NODE)
        run("k8s.uncordon", node=NODE)
        run("k8s.label", node=NODE, labels={AUDIT_LABEL: "yes"})
        run("k8s.label", node=NODE, labels={AUDIT_LABEL: None})
        run("k8s.taint", node=NODE, key=AUDIT_LABEL, value="yes")
        run("k8s.taint", node=NODE, key=AUDIT_LABEL, remove=True)
        run("k8s.wait_labels", nodes=[NODE], labels={DRIVER_LABEL: driver}, timeout=5, poll=0.1)
        run("k8s.drain", node=NODE, timeout=90)
        run("k8s.uncordon", node=NODE)
        run("k8s.gpu_diag", node=NODE, timeout=60, poll=0.2)  # a Job, its pod's log
        run("gpu_operator.driver_versions")
        run("gpu_operator.wait_validator", node=NODE, timeout=60, poll=0.2)
        # The ClusterPolicy: a change and back, with the lab's upgrades paused meanwhile.
        code, body = api(lab, "PATCH", CP_PATH, {"spec": {"driver": {"upgradePolicy": {
            "autoUpgrade": False}}}}, ctype="application/merge-patch+json")
        assert code == 200, body
        run("gpu_operator.set_driver_version", version="999.1.0")
        run("gpu_operator.set_driver_version", version=driver)
        # An NVIDIADriver (driver_mode nvidiadriver) that selects no node.
        code, body = api(lab, "POST", NVD_PATH, {
            "apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
            "metadata": {"name": AUDIT_DRIVER},
            "spec": {"version": driver, "nodeSelector": {AUDIT_LABEL: "no-such-node"}}})
        assert code == 201, body
        per_pool = config.model_copy(update={"gpu_operator": config.gpu_operator.model_copy(
            update={"driver_mode": "nvidiadriver", "nvidiadrivers": {"audit": AUDIT_DRIVER}})})
        run("gpu_operator.set_driver_version", per_pool, version="999.1.0", pool="audit")
        backend.list_custom_objects("kueue.x-k8s.io", "v1beta1", "clusterqueues")  # fairshare
        # Leader election: create, renew, release.
        elector = LeaseElector(backend, lease, "default", "rbac-audit", lease_seconds=5)
        assert elector.try_acquire()
        assert elector.try_acquire()
        elector.release()
    finally:
        backend.close()
        restore = {**(upgrade_policy or {})}
        restore.setdefault("autoUpgrade", None)  # absent before: removed again
        api(lab, "PATCH", CP_PATH, {"spec": {"driver": {"version": driver,
                                                        "upgradePolicy": restore}}},
            ctype="application/merge-patch+json")
        api(lab, "DELETE", f"{NVD_PATH}/{AUDIT_DRIVER}")
        api(lab, "DELETE", f"/apis/coordination.k8s.io/v1/namespaces/default/leases/{lease}")
        if nodes(lab)[NODE]["spec"].get("unschedulable"):
            api(lab, "PATCH", f"/api/v1/nodes/{NODE}", {"spec": {"unschedulable": None}},
                ctype="application/merge-patch+json")
        wait_until(lambda: settled(lab), "the pool to settle after the audit", timeout=60)


def test_the_roles_grant_exactly_what_the_adapter_sends(lab: Lab) -> None:
    log = Path(lab["kubeapi"].get("audit_log") or "")
    assert log.name, ("the lab's kubeapi has no audit_log in lab.json: restart the lab "
                      "(deploy/lab/lab down; the fixture starts it with request logging)")
    driven_from = time.time()
    drive_the_adapter(lab)
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    entries = [e for e in entries if e["ts"] >= SESSION_STARTED]
    adapter = [e for e in entries if ADAPTER_AGENT.match(e["userAgent"])]
    resource_requests = [e for e in adapter if "nonResourceURL" not in e]
    others = Counter(e["userAgent"].split("/")[0] for e in entries if e not in adapter)
    earlier = sum(1 for e in resource_requests if e["ts"] < driven_from)

    docs = render("ha")
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole")
    role = next(d for d in docs if d["kind"] == "Role")
    cluster_grants, role_grants = grants(cluster_role), grants(role)

    seen: Counter[Kind] = Counter(kind_of(e) for e in resource_requests)
    lines = [f"{count:5d}  {verb:8s} {group or 'core'}/{resource}"
             f"{' (namespaced)' if namespaced else ''}"
             for (group, resource, verb, namespaced), count in sorted(seen.items())]
    print(f"\nadapter requests this session: {len(resource_requests)} ({earlier} from the other "
          f"tests, {len(resource_requests) - earlier} from this one); other clients: "
          f"{dict(others)}\n" + "\n".join(lines))

    assert len(resource_requests) >= MIN_REQUESTS, (
        f"only {len(resource_requests)} requests with the adapter's user agent in {log}: the "
        "request log is not recording the adapter (is the lab's kubeapi started with "
        "--audit-log?)")
    driven = {kind_of(e) for e in resource_requests if e["ts"] >= driven_from}
    assert ("", "pods/eviction", "create", True) in driven and \
        ("coordination.k8s.io", "leases", "create", True) in driven, sorted(driven)

    refused = []
    for kind, count in sorted(seen.items()):
        group, resource, verb, namespaced = kind
        if (group, resource, verb) in cluster_grants:
            continue
        if namespaced and (group, resource, verb) in role_grants:
            continue
        example = next(e for e in resource_requests if kind_of(e) == kind)
        refused.append(f"{verb} {group or 'core'}/{resource} x{count}, e.g. "
                       f"{example['method']} {example['path']}")
    assert not refused, (
        "the bot's adapter sent requests its RBAC (deploy/kubernetes/base/rbac.yaml) would "
        "refuse; grant them there, or, when test scaffolding sent them through the official "
        "client, give that client tests.lab.kubehelp.TEST_USER_AGENT:\n  " + "\n  ".join(refused))

    used = {(g, r, v) for g, r, v, _ in seen}
    used_namespaced = {(g, r, v) for g, r, v, namespaced in seen if namespaced}
    unused = sorted(cluster_grants - used) + sorted(role_grants - used_namespaced)
    assert not unused, ("the bot's RBAC grants what its adapter never asked for during the "
                        f"session; take it out of deploy/kubernetes/base/rbac.yaml: {unused}")
    discovery = [e for e in adapter if "nonResourceURL" in e
                 and not DISCOVERY.match(e["nonResourceURL"])]
    assert not discovery, discovery
