"""Kueue's resources as the lab seeds them: a ResourceFlavor, one ClusterQueue with a GPU
quota and a status as Kueue's controller writes it, one LocalQueue pointing at it."""
from __future__ import annotations

from .resources import by_kind
from .store import Store

FLAVOR = "h100"
CLUSTER_QUEUE = "serving-gpus"
LOCAL_QUEUE = "inference"
GPU_QUOTA = 32  # the serving pool: gpu05..gpu08, 8 each
GPU_USED = 20  # the seeded serving pods: 10 pods, 2 GPUs each


def cluster_queue() -> dict[str, object]:
    resources = [("cpu", "256", "96"), ("memory", "1Ti", "320Gi"),
                 ("nvidia.com/gpu", str(GPU_QUOTA), str(GPU_USED))]
    usage = [{"name": FLAVOR, "resources": [{"name": n, "total": used, "borrowed": "0"}
                                            for n, _, used in resources]}]
    return {
        "metadata": {"name": CLUSTER_QUEUE},
        "spec": {"namespaceSelector": {}, "queueingStrategy": "BestEffortFIFO",
                 "cohort": "serving",
                 "resourceGroups": [{"coveredResources": [n for n, _, _ in resources],
                                     "flavors": [{"name": FLAVOR, "resources": [
                                         {"name": n, "nominalQuota": quota}
                                         for n, quota, _ in resources]}]}]},
        "status": {"admittedWorkloads": 10, "reservingWorkloads": 10, "pendingWorkloads": 2,
                   "flavorsUsage": usage, "flavorsReservation": usage,
                   "conditions": [{"type": "Active", "status": "True", "reason": "Ready",
                                   "message": "Can admit new workloads"}]}}


def seed_kueue(store: Store, namespace: str) -> None:
    store.create(by_kind("ResourceFlavor"), "", {
        "metadata": {"name": FLAVOR},
        "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}})
    store.create(by_kind("ClusterQueue"), "", cluster_queue())
    store.create(by_kind("LocalQueue"), namespace, {
        "metadata": {"name": LOCAL_QUEUE}, "spec": {"clusterQueue": CLUSTER_QUEUE},
        "status": {"admittedWorkloads": 10, "pendingWorkloads": 2}})
