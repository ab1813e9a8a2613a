"""The lab's MIG Manager: a node's `nvidia.com/mig.config` label drives
`nvidia.com/mig.config.state` (pending, then success, or failed with `lab fault NODE mig=fail`)
and, on success, the node's nvidia.com/gpu or nvidia.com/mig-* resources (mixed strategy)."""
from __future__ import annotations

import logging
import time

from .cluster import Cluster
from .errors import Obj
from .faults import node_faults
from .resources import by_kind
from .store import meta

log = logging.getLogger("kubeapi")
PODS, NODES = by_kind("Pod"), by_kind("Node")
MIG_CONFIG, MIG_STATE = "nvidia.com/mig.config", "nvidia.com/mig.config.state"
GPU, MIG_PREFIX, GPU_COUNT = "nvidia.com/gpu", "nvidia.com/mig-", "nvidia.com/gpu.count"
APPLIED = "lab.gpu-runbook-bot/mig-applied"          # the layout the GPUs have now
PENDING = "lab.gpu-runbook-bot/mig-pending"          # "LAYOUT@EPOCH": applied at EPOCH
FAILED_LAYOUT = "lab.gpu-runbook-bot/mig-failed"     # the layout that failed
# What the real MIG Manager pauses while it reconfigures the GPUs.
PAUSED = ("nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.gpu-feature-discovery",
          "nvidia.com/gpu.deploy.dcgm-exporter")
PAUSED_VALUE = "paused-for-mig-change"
VALIDATOR_PREFIX = "nvidia-operator-validator-"
# The lab's layouts (the lab's bot.yaml lists the same under mig.layouts): devices per GPU.
LAYOUTS: dict[str, dict[str, int]] = {
    "all-disabled": {}, "all-3g.40gb": {"3g.40gb": 2}, "all-1g.10gb": {"1g.10gb": 7}}
DISABLED = "all-disabled"
APPLY_SECONDS = 1.0


def tick(cluster: Cluster) -> None:
    for node in cluster.store.scan(NODES):
        if MIG_CONFIG in (meta(node).get("labels") or {}):
            step(cluster, node)


def step(cluster: Cluster, node: Obj) -> None:
    labels, notes = meta(node).get("labels") or {}, meta(node).get("annotations") or {}
    name, desired = meta(node)["name"], labels[MIG_CONFIG]
    applied, state = notes.get(APPLIED, DISABLED), labels.get(MIG_STATE)
    pending_layout, _, until = notes.get(PENDING, "").partition("@")
    if pending_layout == desired:
        if time.time() >= float(until or 0):
            finish(cluster, node, desired)
        return
    if desired == applied:
        if state != "success" or pending_layout:
            change(cluster, name, {MIG_STATE: "success", **dict.fromkeys(PAUSED, "true")},
                   {PENDING: None, FAILED_LAYOUT: None})
        return
    failing = node_faults(cluster.faults_dir, name).get("mig") == "fail"
    if state == "failed" and notes.get(FAILED_LAYOUT) == desired and failing:
        return  # stays failed until the label or the fault changes
    change(cluster, name, {MIG_STATE: "pending", **dict.fromkeys(PAUSED, PAUSED_VALUE)},
           {PENDING: f"{desired}@{time.time() + APPLY_SECONDS:.3f}", FAILED_LAYOUT: None})
    log.info("mig %s: %s -> %s pending", name, applied, desired)


def finish(cluster: Cluster, node: Obj, layout: str) -> None:
    name = meta(node)["name"]
    restore = dict.fromkeys(PAUSED, "true")
    if layout not in LAYOUTS or node_faults(cluster.faults_dir, name).get("mig") == "fail":
        change(cluster, name, {MIG_STATE: "failed", **restore},
               {PENDING: None, FAILED_LAYOUT: layout})
        log.info("mig %s: %s failed", name, layout)
        return
    gpus = int((meta(node).get("labels") or {}).get(GPU_COUNT, "8") or 8)
    devices = LAYOUTS[layout]
    resources = ({f"{MIG_PREFIX}{p}": str(n * gpus) for p, n in devices.items()} if devices
                 else {GPU: str(gpus)})
    change(cluster, name, {MIG_STATE: "success", **restore},
           {PENDING: None, FAILED_LAYOUT: None, APPLIED: layout}, resources)
    for pod in cluster.store.scan(PODS, "gpu-operator", lambda p: p["spec"].get("nodeName")
                                  == name and meta(p)["name"].startswith(VALIDATOR_PREFIX)):
        cluster.store.delete(PODS, "gpu-operator", meta(pod)["name"])  # validates again
    log.info("mig %s: %s success", name, layout)


def change(cluster: Cluster, name: str, labels: dict[str, str | None],
           notes: dict[str, str | None], resources: dict[str, str] | None = None) -> None:
    def apply(node: Obj) -> None:
        m = meta(node)
        for target, values in ((m.setdefault("labels", {}), labels),
                               (m.setdefault("annotations", {}), notes)):
            for key, value in values.items():
                if value is None:
                    target.pop(key, None)
                else:
                    target[key] = value
        if resources is not None:
            status = node.setdefault("status", {})
            for part in ("capacity", "allocatable"):
                have = {k: v for k, v in (status.get(part) or {}).items()
                        if k != GPU and not k.startswith(MIG_PREFIX)}
                status[part] = {**have, **resources}
    cluster.store.modify(NODES, "", name, apply)
