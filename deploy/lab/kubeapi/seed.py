"""The Kubernetes pool `lab up` starts with: GPU nodes, serving pods behind a PDB, the GPU
Operator's DaemonSets and ClusterPolicy, node Leases."""
from __future__ import annotations

import copy
import hashlib
import time

from .cluster import Cluster, set_ready
from .controllers import (
    DRIVER_DS,
    OPERATOR_NS,
    STATE_LABEL,
    VALIDATOR_DS,
    driver_labels,
    owner_ref,
    pod_from_template,
)
from .errors import ApiError, Obj
from .faults import record_driver
from .kueue import seed_kueue
from .resources import by_kind
from .server import VERSION
from .store import meta

# gpu-runbook-bot: the bot's own namespace, where its GPU diagnostic Jobs run
NAMESPACES = ["default", "kube-system", "kube-public", "kube-node-lease", "serving", OPERATOR_NS,
              "gpu-runbook-bot"]
PRODUCT = "NVIDIA-H100-80GB-HBM3"
POOL_LABEL = "lab.gpu-runbook-bot/node-pool"
POOL = "serving-h100"
SERVING_NS, APP = "serving", "inference"
RS_HASH = "7d9f8c6b5d"
# one GPU a pod: 10 of the pool's 32 GPUs serve, so taking a node out keeps the capacity
# guard's default floor (8 free GPUs) whichever node it is
GPUS_PER_POD = 1
PDB_NAME = "inference-pdb"
# Serving pods per node in seed order: 10 pods, at most 4 per node.
PODS_PER_NODE = [3, 2, 2, 3]
# Slurm nodes registered here too while they serve Slurm (handoff-node moves them): the
# bot's pool label says slurm and its NoSchedule taint keeps serving pods off; the GPU
# Operator's DaemonSets tolerate it (the driver serves Slurm jobs too).
HANDOFF_NODES = ["gpu04"]
OPERATOR_VERSION = "v23.9.2"  # the GPU Operator release (its validator image has the same tag)
HANDOFF_POOL = "gpu-runbook-bot/pool"
GENERATE_NAME_TRIES = 5
HANDOFF_TOLERATION = {"key": HANDOFF_POOL, "operator": "Exists", "effect": "NoSchedule"}


def node(name: str, index: int, driver: str) -> Obj:
    labels = {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64", POOL_LABEL: POOL,
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": PRODUCT,
        "nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.deploy.driver": "true", STATE_LABEL: "upgrade-done",
        **driver_labels(driver),
    }
    resources = {"cpu": "96", "memory": "1056440812Ki", "ephemeral-storage": "3750000000Ki",
                 "pods": "110", "nvidia.com/gpu": "8", "hugepages-1Gi": "0"}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    conditions = [
        {"type": t, "status": "False", "reason": f"KubeletHasNo{t}" if t != "PIDPressure"
         else "KubeletHasSufficientPID", "message": "", "lastHeartbeatTime": stamp,
         "lastTransitionTime": stamp}
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
    ] + [{"type": "Ready", "status": "True", "reason": "KubeletReady",
          "message": "kubelet is posting ready status", "lastHeartbeatTime": stamp,
          "lastTransitionTime": stamp}]
    machine = hashlib.sha256(name.encode()).hexdigest()[:32]
    # 10.244.<index>.0/24 and 10.20.0.<10+index>, carried into the next octet past 255
    cidr = f"10.{244 + index // 256}.{index % 256}.0/24"
    address = f"10.20.{(10 + index) // 256}.{(10 + index) % 256}"
    return {
        "metadata": {"name": name, "labels": labels, "annotations": {
            "node.alpha.kubernetes.io/ttl": "0",
            "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
        "status": {
            "capacity": resources, "allocatable": {**resources, "cpu": "95"},
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": address},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": machine, "systemUUID": machine, "bootID": machine[::-1],
                         "kernelVersion": "5.15.0-105-generic",
                         "osImage": "Ubuntu 22.04.4 LTS",
                         "containerRuntimeVersion": "containerd://1.7.13",
                         "kubeletVersion": VERSION["gitVersion"],
                         "kubeProxyVersion": VERSION["gitVersion"],
                         "operatingSystem": "linux", "architecture": "amd64"},
        },
    }


def serving_slurm(obj: Obj) -> Obj:
    """A hand-off node while it serves Slurm: the pool label and taint (not cordoned)."""
    obj["metadata"]["labels"][HANDOFF_POOL] = "slurm"
    obj["spec"]["taints"] = [{"key": HANDOFF_POOL, "value": "slurm", "effect": "NoSchedule"}]
    return obj


def serving_template() -> Obj:
    labels = {"app": APP, "pod-template-hash": RS_HASH}
    return {"metadata": {"labels": labels}, "spec": {
        "containers": [{"name": "triton", "image": "nvcr.io/nvidia/tritonserver:24.03-py3",
                        "ports": [{"containerPort": 8000, "name": "http", "protocol": "TCP"}],
                        "resources": {"requests": {"cpu": "4", "memory": "32Gi",
                                                   "nvidia.com/gpu": str(GPUS_PER_POD)},
                                      "limits": {"nvidia.com/gpu": str(GPUS_PER_POD)}},
                        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 30, "restartPolicy": "Always",
        "schedulerName": "default-scheduler"}}


def daemonset(name: str, image: str) -> Obj:
    labels = {"app": name}
    return {"metadata": {"name": name, "namespace": OPERATOR_NS, "labels": labels},
            "spec": {"selector": {"matchLabels": labels},
                     "updateStrategy": {"type": "OnDelete" if name == DRIVER_DS
                                        else "RollingUpdate"},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "nodeSelector": {"nvidia.com/gpu.present": "true"},
                         "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                          "effect": "NoSchedule"}, HANDOFF_TOLERATION],
                         "containers": [{"name": name.removeprefix("nvidia-"),
                                         "image": image}],
                         "terminationGracePeriodSeconds": 30}}}}


def cluster_policy(driver: str) -> Obj:
    # The GPU Operator's Helm chart labels the ClusterPolicy with its release (appVersion).
    labels = {"app.kubernetes.io/component": "gpu-operator",
              "app.kubernetes.io/version": OPERATOR_VERSION}
    return {"metadata": {"name": "cluster-policy", "labels": labels}, "spec": {
        "operator": {"defaultRuntime": "containerd"},
        "daemonsets": {"updateStrategy": "RollingUpdate"},
        "driver": {"enabled": True, "repository": "nvcr.io/nvidia", "image": "driver",
                   "version": driver, "useNvidiaDriverCRD": False,
                   "upgradePolicy": {
                       "autoUpgrade": True, "maxParallelUpgrades": 1, "maxUnavailable": "25%",
                       "waitForCompletion": {"timeoutSeconds": 0},
                       "podDeletion": {"force": False, "timeoutSeconds": 300,
                                       "deleteEmptyDir": False},
                       "drain": {"enable": False, "force": False, "timeoutSeconds": 300,
                                 "deleteEmptyDir": False}}},
        "toolkit": {"enabled": True}, "devicePlugin": {"enabled": True},
        "dcgmExporter": {"enabled": True}, "gfd": {"enabled": True},
        "validator": {"plugin": {"env": [{"name": "WITH_WORKLOAD", "value": "false"}]}}},
        "status": {"state": "ready", "namespace": OPERATOR_NS}}


def seed(cluster: Cluster, nodes: list[str], default_driver: str,
         handoff: list[str] | None = None) -> None:
    handoff = HANDOFF_NODES if handoff is None else handoff
    store = cluster.store
    for ns in NAMESPACES:
        store.create(by_kind("Namespace"), "", {"metadata": {"name": ns},
                                                "spec": {"finalizers": ["kubernetes"]},
                                                "status": {"phase": "Active"}})
    for i, name in enumerate([*nodes, *handoff]):
        # Every node starts on the ClusterPolicy's version; its fault file agrees.
        store.create(by_kind("Node"), "", serving_slurm(node(name, i, default_driver))
                     if name in handoff else node(name, i, default_driver))
        record_driver(cluster.faults_dir, name, default_driver)
        store.create(by_kind("Lease"), "kube-node-lease", {
            "metadata": {"name": name},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40}})
    store.create(by_kind("ClusterPolicy"), "", cluster_policy(default_driver))
    images = {DRIVER_DS: f"nvcr.io/nvidia/driver:{default_driver}-ubuntu22.04",
              "nvidia-dcgm-exporter": "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5-3.4.1-ubuntu22.04",
              VALIDATOR_DS: "nvcr.io/nvidia/cloud-native/gpu-operator-validator:"
                            + OPERATOR_VERSION}
    for name, image in images.items():
        ds = store.create(by_kind("DaemonSet"), OPERATOR_NS, daemonset(name, image))
        for node_name in [*nodes, *handoff]:
            ready_pod(cluster, pod_from_template(ds, node_name))
    seed_serving(cluster, nodes)
    seed_kueue(store, SERVING_NS)


def seed_serving(cluster: Cluster, nodes: list[str]) -> None:
    store = cluster.store
    per_node = [PODS_PER_NODE[i % len(PODS_PER_NODE)] for i in range(len(nodes))]
    replicas = sum(per_node)
    selector = {"matchLabels": {"app": APP}}
    deploy = store.create(by_kind("Deployment"), SERVING_NS, {
        "metadata": {"name": APP, "labels": {"app": APP}},
        "spec": {"replicas": replicas, "selector": selector, "template": serving_template(),
                 "strategy": {"type": "RollingUpdate"}}})
    rs = store.create(by_kind("ReplicaSet"), SERVING_NS, {
        "metadata": {"name": f"{APP}-{RS_HASH}", "labels": {"app": APP,
                                                            "pod-template-hash": RS_HASH},
                     "ownerReferences": [owner_ref(deploy)]},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {
            "app": APP, "pod-template-hash": RS_HASH}}, "template": serving_template()}})
    for node_name, count in zip(nodes, per_node, strict=False):
        for _ in range(count):
            ready_pod(cluster, pod_from_template(rs, node_name))
    # One pod fewer than all may be down: a node's pods leave one at a time, each
    # waiting for its replacement elsewhere to turn Ready.
    store.create(by_kind("PodDisruptionBudget"), SERVING_NS, {
        "metadata": {"name": PDB_NAME},
        "spec": {"minAvailable": replicas - 1, "selector": selector}})


def ready_pod(cluster: Cluster, pod: Obj) -> None:
    # generateName's 5 hex characters collide now and then among a scale lab's thousands of
    # pods; like a real client, try another name (a name-less copy each time).
    for attempt in range(GENERATE_NAME_TRIES):
        try:
            created = cluster.create_pod(copy.deepcopy(pod), ready=False)
            break
        except ApiError as exc:
            if exc.reason != "AlreadyExists" or attempt == GENERATE_NAME_TRIES - 1:
                raise
    cluster.never_ready.discard(meta(created)["uid"])
    cluster.store.modify(by_kind("Pod"), meta(created)["namespace"], meta(created)["name"],
                         set_ready)
