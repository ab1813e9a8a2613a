"""Lab controllers, one loop: ReplicaSets and DaemonSets keep their pods, PDB status is
recomputed, and the GPU Operator's driver upgrade walks nodes through its states."""
from __future__ import annotations

import logging
import threading
import time

from . import jobs, mig, policy, reboot
from .cluster import Cluster, selects, set_crashing, tolerates
from .errors import Obj
from .faults import node_faults, record_driver
from .resources import by_kind
from .store import Narrow, meta, now_iso

log = logging.getLogger("kubeapi")
PODS, NODES = by_kind("Pod"), by_kind("Node")
RS, DS = by_kind("ReplicaSet"), by_kind("DaemonSet")
CLUSTER_POLICY, NVIDIA_DRIVER = by_kind("ClusterPolicy"), by_kind("NVIDIADriver")

STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
DRIVER_LABEL = "lab.gpu-runbook-bot/driver-version"
INITIAL_UNSCHEDULABLE = "nvidia.com/gpu-driver-upgrade.node-initial-state.unschedulable"
SKIP_LABEL = "nvidia.com/gpu-driver-upgrade.skip"  # "true": parks in upgrade-required
STEP_ANNOTATION = "lab.gpu-runbook-bot/upgrade-step-seconds"
GPU_PRESENT = "nvidia.com/gpu.present"
OPERATOR_NS = "gpu-operator"
DRIVER_DS, VALIDATOR_DS = "nvidia-driver-daemonset", "nvidia-operator-validator"
# States between upgrade-required and upgrade-done, in order.
WALK = ["cordon-required", "wait-for-jobs-required", "pod-deletion-required", "drain-required",
        "pod-restart-required", "validation-required", "uncordon-required", "upgrade-done"]
IDLE = {"", "upgrade-done", "upgrade-required"}  # everything else counts as in progress


def owner_ref(obj: Obj) -> Obj:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta(obj)["name"],
            "uid": meta(obj)["uid"], "controller": True, "blockOwnerDeletion": True}


def pod_from_template(owner: Obj, node: str | None) -> Obj:
    template = owner["spec"]["template"]
    pod: Obj = {"metadata": {"generateName": meta(owner)["name"] + "-",
                             "namespace": meta(owner)["namespace"],
                             "labels": dict(template["metadata"].get("labels") or {}),
                             "ownerReferences": [owner_ref(owner)]},
                "spec": dict(template["spec"])}
    if node:
        pod["spec"]["nodeName"] = node
    return pod


def _live(pods: list[Obj]) -> list[Obj]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _set_status(cluster: Cluster, obj: Obj, status: Obj) -> None:
    merged = {**obj.get("status", {}), **status}
    if merged != obj.get("status"):
        res = RS if obj["kind"] == "ReplicaSet" else DS

        def change(o: Obj) -> None:
            o["status"] = merged
        cluster.store.modify(res, meta(obj)["namespace"], meta(obj)["name"], change)


def reconcile_replicasets(cluster: Cluster) -> None:
    store = cluster.store
    for rs in store.scan(RS):
        ns, uid = meta(rs)["namespace"], meta(rs)["uid"]
        live = _live(store.scan_owned(PODS, ns, uid))
        for pod in live:
            if not pod["spec"].get("nodeName"):
                bind(cluster, pod)
        for _ in range(int(rs["spec"].get("replicas", 1)) - len(live)):
            pod = pod_from_template(rs, None)
            pod["spec"]["nodeName"] = cluster.pick_node(pod)
            if not pod["spec"]["nodeName"]:
                del pod["spec"]["nodeName"]  # stays Pending until a node has room
            cluster.create_pod(pod)
        ready = sum(policy.pod_ready(p) for p in live)
        _set_status(cluster, rs, {"replicas": len(live), "readyReplicas": ready,
                                  "availableReplicas": ready,
                                  "observedGeneration": meta(rs).get("generation", 1)})


def bind(cluster: Cluster, pod: Obj) -> None:
    node = cluster.pick_node(pod)
    if node is None:
        return

    def change(p: Obj) -> None:
        p["spec"]["nodeName"] = node
        for c in p.get("status", {}).get("conditions", []):
            if c.get("type") == "PodScheduled":
                c.update(status="True", lastTransitionTime=now_iso())
    store = cluster.store
    store.modify(PODS, meta(pod)["namespace"], meta(pod)["name"], change)
    with cluster.lock:
        cluster.ready_at[meta(pod)["uid"]] = time.monotonic() + cluster.timing.pod_ready


def reconcile_daemonsets(cluster: Cluster) -> None:
    store = cluster.store
    nodes = store.scan(NODES)
    for ds in store.scan(DS):
        ns, uid = meta(ds)["namespace"], meta(ds)["uid"]
        pods = _live(store.scan_owned(PODS, ns, uid))
        on_node = {p["spec"].get("nodeName") for p in pods}
        template = pod_from_template(ds, None)
        wanted = {meta(n)["name"] for n in nodes if selects(template, n)}
        for node in nodes:
            name = meta(node)["name"]
            if name in wanted and name not in on_node and tolerates(template, node):
                fails = meta(ds)["name"] == DRIVER_DS and driver_fails(cluster, node)
                pod = cluster.create_pod(pod_from_template(ds, name), ready=not fails)
                if fails:
                    store.modify(PODS, ns, meta(pod)["name"], set_crashing)
        ready = sum(policy.pod_ready(p) for p in pods)
        _set_status(cluster, ds, {
            "desiredNumberScheduled": len(wanted), "currentNumberScheduled": len(pods),
            "numberReady": ready, "numberAvailable": ready, "updatedNumberScheduled": len(pods),
            "numberMisscheduled": 0, "observedGeneration": meta(ds).get("generation", 1)})


def driver_fails(cluster: Cluster, node: Obj) -> bool:
    """The lab fault `upgrade=fail` breaks a driver install that changes the version."""
    labels = meta(node).get("labels") or {}
    return (node_faults(cluster.faults_dir, meta(node)["name"]).get("upgrade") == "fail"
            and labels.get(STATE_LABEL) in ("pod-restart-required", "upgrade-failed")
            and target_version(cluster, node) != labels.get(DRIVER_LABEL))


# --- GPU Operator driver upgrade ----------------------------------------------

def cluster_policy(cluster: Cluster) -> Obj | None:
    policies = cluster.store.scan(CLUSTER_POLICY)
    return policies[0] if policies else None


def target_version(cluster: Cluster, node: Obj) -> str | None:
    """The ClusterPolicy's version; with its spec.driver.useNvidiaDriverCRD true, the
    version of the NVIDIADriver whose nodeSelector matches (as the operator, not both)."""
    labels = meta(node).get("labels") or {}
    cp = cluster_policy(cluster)
    driver_spec = (cp or {}).get("spec", {}).get("driver", {})
    if not driver_spec.get("useNvidiaDriverCRD"):
        return str(driver_spec["version"]) if driver_spec.get("version") else None
    for driver in cluster.store.scan(NVIDIA_DRIVER):
        selector = driver.get("spec", {}).get("nodeSelector") or {}
        if all(labels.get(k) == v for k, v in selector.items()):
            version = driver.get("spec", {}).get("version")
            if version:
                return str(version)
    return None


def upgrade_step(cluster: Cluster) -> float:
    cp = cluster_policy(cluster) or {}
    value = (meta(cp).get("annotations") or {}).get(STEP_ANNOTATION)
    try:
        return float(value) if value else cluster.timing.upgrade_step
    except ValueError:
        return cluster.timing.upgrade_step


def driver_labels(version: str) -> dict[str, str]:
    """The lab's label plus the CUDA driver labels GPU Feature Discovery sets."""
    parts = ([*version.split("."), "", "", ""])[:3]
    return {DRIVER_LABEL: version, "nvidia.com/cuda.driver.major": parts[0],
            "nvidia.com/cuda.driver.minor": parts[1], "nvidia.com/cuda.driver.rev": parts[2]}


def upgrade_tick(cluster: Cluster) -> None:
    cp = cluster_policy(cluster)
    if cp is None:
        return
    upgrade_policy = cp.get("spec", {}).get("driver", {}).get("upgradePolicy") or {}
    if upgrade_policy.get("autoUpgrade") is False:
        return
    max_parallel = int(upgrade_policy.get("maxParallelUpgrades", 1))
    nodes = [n for n in cluster.store.scan(NODES)
             if (meta(n).get("labels") or {}).get(GPU_PRESENT) == "true"]
    in_progress = sum((meta(n).get("labels") or {}).get(STATE_LABEL, "") not in IDLE
                      for n in nodes)
    for node in nodes:
        started = advance(cluster, node, in_progress < max_parallel or max_parallel == 0)
        in_progress += started
    sync_driver_daemonset(cluster, cp)
    states = {(meta(n).get("labels") or {}).get(STATE_LABEL) for n in
              cluster.store.scan(NODES) if (meta(n).get("labels") or {}).get(GPU_PRESENT)}
    state = "ready" if states <= {"upgrade-done"} else "notReady"
    if cp.get("status", {}).get("state") != state:
        def change(o: Obj) -> None:
            o.setdefault("status", {}).update(state=state, namespace=OPERATOR_NS)
        cluster.store.modify(CLUSTER_POLICY, "", meta(cp)["name"], change)


def advance(cluster: Cluster, node: Obj, may_start: bool) -> bool:
    """Move one node one state on; True when it started an upgrade."""
    name = meta(node)["name"]
    labels = meta(node).get("labels") or {}
    state, current = labels.get(STATE_LABEL, ""), labels.get(DRIVER_LABEL)
    target = target_version(cluster, node)
    changes: dict[str, str | None] = {}
    unschedulable: bool | None = None
    started = False
    if state in ("", "upgrade-done"):
        if target and current != target:
            changes[STATE_LABEL] = "upgrade-required"
        elif not state:
            changes[STATE_LABEL] = "upgrade-done"
    elif state == "upgrade-required":
        if target == current:
            changes[STATE_LABEL] = "upgrade-done"  # set back before the upgrade began
        elif may_start and labels.get(SKIP_LABEL) != "true":
            changes[STATE_LABEL], started = "cordon-required", True
    elif state == "cordon-required":
        if node.get("spec", {}).get("unschedulable"):
            changes[INITIAL_UNSCHEDULABLE] = "true"  # an annotation: see below
        unschedulable = True
        changes[STATE_LABEL] = "wait-for-jobs-required"
    elif state == "pod-restart-required":
        restart_operator_pods(cluster, name)
        if node_faults(cluster.faults_dir, name).get("upgrade") == "fail" and target != current:
            changes[STATE_LABEL] = "upgrade-failed"
        else:
            version = target or current or ""
            changes.update(driver_labels(version))
            record_driver(cluster.faults_dir, name, version)
            changes[STATE_LABEL] = "validation-required"
    elif state == "validation-required":
        if operator_pods_ready(cluster, name):
            changes[STATE_LABEL] = "uncordon-required"
    elif state == "uncordon-required":
        initial = (meta(node).get("annotations") or {}).get(INITIAL_UNSCHEDULABLE)
        unschedulable = initial == "true"
        changes[INITIAL_UNSCHEDULABLE] = None
        changes[STATE_LABEL] = "upgrade-done"
    elif state == "upgrade-failed":
        if target == current:
            restart_operator_pods(cluster, name)  # back on the installed version: recover
            changes[STATE_LABEL] = "validation-required"
        elif node_faults(cluster.faults_dir, name).get("upgrade") != "fail":
            changes[STATE_LABEL] = "pod-restart-required"  # fault cleared: retry
    elif state in WALK:
        changes[STATE_LABEL] = WALK[WALK.index(state) + 1]
    if changes or unschedulable is not None:
        apply_node_changes(cluster, name, changes, unschedulable)
        log.info("upgrade %s: %s -> %s", name, state or "(none)", changes.get(STATE_LABEL))
    return started


def apply_node_changes(cluster: Cluster, name: str, changes: dict[str, str | None],
                       unschedulable: bool | None) -> None:
    def change(node: Obj) -> None:
        m = meta(node)
        labels, annotations = m.setdefault("labels", {}), m.setdefault("annotations", {})
        for key, value in changes.items():
            target = annotations if key == INITIAL_UNSCHEDULABLE else labels
            if value is None:
                target.pop(key, None)
            else:
                target[key] = value
        if unschedulable is not None:
            if unschedulable:
                node.setdefault("spec", {})["unschedulable"] = True
            else:
                node.get("spec", {}).pop("unschedulable", None)
    cluster.store.modify(NODES, "", name, change)


def _operator_pods(cluster: Cluster, node: str) -> list[Obj]:
    prefixes = (DRIVER_DS + "-", VALIDATOR_DS + "-")
    return cluster.store.scan(PODS, OPERATOR_NS, lambda p: p["spec"].get("nodeName") == node
                              and meta(p)["name"].startswith(prefixes), Narrow(node=node))


def restart_operator_pods(cluster: Cluster, node: str) -> None:
    """The new driver pod (and the validator after it) replace the old ones."""
    for pod in _operator_pods(cluster, node):
        cluster.store.delete(PODS, OPERATOR_NS, meta(pod)["name"])


def operator_pods_ready(cluster: Cluster, node: str) -> bool:
    pods = _live(_operator_pods(cluster, node))
    return len(pods) >= 2 and all(policy.pod_ready(p) for p in pods)


def sync_driver_daemonset(cluster: Cluster, cp: Obj) -> None:
    """Like the operator: the driver DaemonSet's image follows ClusterPolicy's version."""
    driver = cp.get("spec", {}).get("driver", {})
    ds = cluster.store.peek(DS, OPERATOR_NS, DRIVER_DS)
    if ds is None or not driver.get("version"):
        return
    image = (f"{driver.get('repository', 'nvcr.io/nvidia')}/{driver.get('image', 'driver')}:"
             f"{driver['version']}-ubuntu22.04")
    containers = ds["spec"]["template"]["spec"]["containers"]
    if containers and containers[0].get("image") != image:
        def change(o: Obj) -> None:
            o["spec"]["template"]["spec"]["containers"][0]["image"] = image
        cluster.store.modify(DS, OPERATOR_NS, DRIVER_DS, change)


def reconcile(cluster: Cluster, quiet_rv: str | None) -> str | None:
    """The store-driven controllers (DaemonSets, ReplicaSets, PDBs): they act on the
    objects alone, so when nothing changed since a pass that changed nothing (quiet_rv) they
    are skipped. Returns the new quiet resourceVersion (None after a pass that wrote)."""
    store = cluster.store
    rv = store.current_rv()
    if rv == quiet_rv:
        return quiet_rv
    reconcile_daemonsets(cluster)
    reconcile_replicasets(cluster)
    policy.refresh(store)
    return rv if store.current_rv() == rv else None


class ControllerLoop(threading.Thread):
    def __init__(self, cluster: Cluster) -> None:
        super().__init__(name="controllers", daemon=True)
        self.cluster = cluster
        self.stopping = threading.Event()

    def run(self) -> None:
        last_upgrade = last_save = 0.0
        quiet_rv: str | None = None
        while not self.stopping.wait(self.cluster.timing.tick):
            try:
                self.cluster.kubelet_tick()
                quiet_rv = reconcile(self.cluster, quiet_rv)
                now = time.monotonic()
                if now - last_upgrade >= upgrade_step(self.cluster):
                    upgrade_tick(self.cluster)
                    last_upgrade = now
                mig.tick(self.cluster)
                reboot.tick(self.cluster)
                jobs.tick(self.cluster)
                if now - last_save >= 1.0:
                    self.cluster.store.save()
                    last_save = now
            except Exception:  # a controller bug must not stop the API
                quiet_rv = None
                log.exception("controller loop")
