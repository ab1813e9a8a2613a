"""The lab's reboot agent (a kured-style DaemonSet): a node labelled
`gpu-runbook-bot/reboot-requested` goes NotReady about 1 s later, then about 1 s after that
comes back Ready with a new `status.nodeInfo.bootID` and fresh validator pods. One reboot per
label value; `lab fault NODE reboot=hang` makes it ignore the label (nothing happens)."""
from __future__ import annotations

import logging
import time
import uuid

from .cluster import Cluster
from .errors import Obj
from .faults import node_faults
from .resources import by_kind
from .store import meta, now_iso

log = logging.getLogger("kubeapi")
PODS, NODES = by_kind("Pod"), by_kind("Node")
LABEL = "gpu-runbook-bot/reboot-requested"  # the bot's kubernetes.reboot_request_label
STATE = "lab.gpu-runbook-bot/reboot"  # "down:VALUE@EPOCH", "up:VALUE@EPOCH", "done:VALUE"
DELAY = 1.0
VALIDATOR_PREFIX = "nvidia-operator-validator-"


def tick(cluster: Cluster) -> None:
    for node in cluster.store.scan(NODES):
        m = meta(node)
        if LABEL in (m.get("labels") or {}) or STATE in (m.get("annotations") or {}):
            step(cluster, node)


def step(cluster: Cluster, node: Obj) -> None:
    m = meta(node)
    name, value = m["name"], (m.get("labels") or {}).get(LABEL)
    phase, _, rest = (m.get("annotations") or {}).get(STATE, "").partition(":")
    seen, _, until = rest.partition("@")
    if value is None:  # request withdrawn or done: forget it (a node half down comes back)
        if phase in ("down", "up"):
            boot(cluster, name)
        change(cluster, name, None)
        return
    if seen != value:  # a new request
        if node_faults(cluster.faults_dir, name).get("reboot") == "hang":
            return  # the agent ignores the label
        change(cluster, name, f"down:{value}@{time.time() + DELAY:.3f}")
        log.info("reboot %s: requested (%s)", name, value)
    elif phase in ("down", "up") and time.time() >= float(until or 0):
        if phase == "down":
            change(cluster, name, f"up:{value}@{time.time() + DELAY:.3f}", ready=False)
            log.info("reboot %s: NotReady", name)
        else:
            boot(cluster, name)
            change(cluster, name, f"done:{value}")
            log.info("reboot %s: booted, Ready", name)


def boot(cluster: Cluster, name: str) -> None:
    """A new bootID, Ready, and the validator pods start again (their DaemonSet recreates
    them)."""
    change(cluster, name, None, ready=True, boot_id=str(uuid.uuid4()))
    for pod in cluster.store.scan(PODS, "gpu-operator", lambda p: p["spec"].get("nodeName")
                                  == name and meta(p)["name"].startswith(VALIDATOR_PREFIX)):
        cluster.store.delete(PODS, "gpu-operator", meta(pod)["name"])


def change(cluster: Cluster, name: str, state: str | None, ready: bool | None = None,
           boot_id: str | None = None) -> None:
    def apply(node: Obj) -> None:
        notes = meta(node).setdefault("annotations", {})
        if state is None:
            notes.pop(STATE, None)
        else:
            notes[STATE] = state
        status = node.setdefault("status", {})
        if boot_id is not None:
            status.setdefault("nodeInfo", {})["bootID"] = boot_id
        for cond in status.get("conditions") or []:
            if ready is not None and cond.get("type") == "Ready":
                cond.update(status="True" if ready else "False",
                            reason="KubeletReady" if ready else "KubeletNotReady",
                            message="kubelet is posting ready status" if ready
                            else "node is rebooting", lastTransitionTime=now_iso())
    cluster.store.modify(NODES, "", name, apply)
