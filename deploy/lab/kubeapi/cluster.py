"""What kubelets and the scheduler would do, reduced to what the lab needs: pods become
Ready after a delay, deleted pods go after their (shortened) grace period, and new pods land
on a schedulable node with free GPUs."""
from __future__ import annotations

import copy
import hashlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import Obj
from .resources import by_kind
from .store import Store, meta, now_iso

PODS, NODES = by_kind("Pod"), by_kind("Node")
GPU = "nvidia.com/gpu"


@dataclass
class Timing:
    pod_ready: float = 1.0        # seconds from creation until a new pod is Ready
    pod_grace: float = 0.5        # lab cap on a pod's termination grace period
    upgrade_step: float = 0.3     # seconds per driver upgrade state
    tick: float = 0.1             # controller loop period


@dataclass
class Cluster:
    store: Store
    timing: Timing
    faults_dir: Path | None = None
    # Runtime state a kubelet would hold: when each pod becomes Ready / goes away.
    ready_at: dict[str, float] = field(default_factory=dict)   # pod uid -> monotonic
    never_ready: set[str] = field(default_factory=set)          # pod uids (failing driver)
    gone_at: dict[tuple[str, str], float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # --- pods ----------------------------------------------------------------

    def create_pod(self, pod: Obj, ready: bool = True) -> Obj:
        """Create a pod; it turns Ready after timing.pod_ready unless ready=False."""
        pod = copy.deepcopy(pod)
        pod["status"] = {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "True" if pod["spec"].get("nodeName") else "False",
             "lastTransitionTime": now_iso()}]}
        created = self.store.create(PODS, meta(pod)["namespace"], pod)
        if pod["spec"].get("nodeName"):
            with self.lock:
                if ready:
                    self.ready_at[meta(created)["uid"]] = time.monotonic() + self.timing.pod_ready
                else:
                    self.never_ready.add(meta(created)["uid"])
        return created

    def delete_pod(self, ns: str, name: str, grace: int | None) -> Obj:
        pod = self.store.get(PODS, ns, name)
        if grace is None:
            grace = int(pod["spec"].get("terminationGracePeriodSeconds", 30))
        if grace == 0 or not pod["spec"].get("nodeName"):
            return self.store.delete(PODS, ns, name)  # no kubelet to wait for
        pod = self.store.mark_deleting(PODS, ns, name, grace)
        with self.lock:
            delay = min(grace, self.timing.pod_grace)
            self.gone_at.setdefault((ns, name), time.monotonic() + delay)
        return pod

    def kubelet_tick(self) -> None:
        """Finish terminations and turn pods Ready when their time has come."""
        now = time.monotonic()
        with self.lock:
            gone = [k for k, t in self.gone_at.items() if t <= now]
            for key in gone:
                del self.gone_at[key]
            ready = {u for u, t in self.ready_at.items() if t <= now}
            for uid in ready:
                del self.ready_at[uid]
        for ns, name in gone:
            if self.store.peek(PODS, ns, name) is not None:
                self.store.delete(PODS, ns, name)
        if ready:
            for pod in self.store.scan(PODS, None, lambda p: meta(p)["uid"] in ready):
                self.store.modify(PODS, meta(pod)["namespace"], meta(pod)["name"], set_ready)

    # --- scheduling ------------------------------------------------------------

    def pick_node(self, pod: Obj) -> str | None:
        """A schedulable node with enough free GPUs whose taints the pod tolerates;
        the one with the fewest GPUs requested wins (spreading, like the default)."""
        requested = gpus_requested(self.store.scan(PODS))
        wanted = gpu_request(pod)
        best: tuple[int, str] | None = None
        for node in self.store.scan(NODES):
            name = meta(node)["name"]
            if node.get("spec", {}).get("unschedulable") or not tolerates(pod, node):
                continue
            if not selects(pod, node):
                continue
            used = requested.get(name, 0)
            free = int(node.get("status", {}).get("allocatable", {}).get(GPU, "0")) - used
            if wanted and wanted > free:
                continue
            if best is None or (used, name) < best:
                best = (used, name)
        return best[1] if best else None


def gpus_requested(pods: list[Obj]) -> dict[str, int]:
    """GPUs requested per node by its pods that are not terminating."""
    used: dict[str, int] = {}
    for p in pods:
        node = p["spec"].get("nodeName")
        if node and not meta(p).get("deletionTimestamp"):
            used[node] = used.get(node, 0) + gpu_request(p)
    return used


def set_ready(pod: Obj) -> None:
    status = pod.setdefault("status", {})
    status["phase"] = "Running"
    status.setdefault("startTime", now_iso())
    # A stable fake pod IP from the uid; the host IP is left out (no node addresses here).
    digest = int(meta(pod)["uid"].replace("-", "")[:6], 16)
    status["podIP"] = f"10.244.{digest % 250}.{digest // 250 % 250 + 2}"
    status["podIPs"] = [{"ip": status["podIP"]}]
    conditions = [c for c in status.get("conditions", []) if c.get("type") not in
                  ("Ready", "ContainersReady", "Initialized")]
    for kind in ("Initialized", "Ready", "ContainersReady"):
        conditions.append({"type": kind, "status": "True", "lastTransitionTime": now_iso()})
    status["conditions"] = conditions
    status["containerStatuses"] = [
        {"name": c["name"], "image": c.get("image", ""), "imageID": _image_id(c),
         "containerID": f"containerd://{meta(pod)['uid'].replace('-', '')}",
         "ready": True, "started": True,
         "restartCount": 0, "state": {"running": {"startedAt": now_iso()}}}
        for c in pod["spec"].get("containers", [])]


def set_crashing(pod: Obj) -> None:
    """Mark a pod's containers as CrashLoopBackOff (a driver that fails to install)."""
    status = pod.setdefault("status", {})
    status["phase"] = "Running"
    status["conditions"] = [c for c in status.get("conditions", [])
                            if c.get("type") not in ("Ready", "ContainersReady")] + [
        {"type": t, "status": "False", "reason": "ContainersNotReady",
         "lastTransitionTime": now_iso()} for t in ("Ready", "ContainersReady")]
    status["containerStatuses"] = [
        {"name": c["name"], "image": c.get("image", ""), "imageID": _image_id(c),
         "ready": False, "started": False,
         "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff",
                                                  "message": "driver install failed (lab fault)"}}}
        for c in pod["spec"].get("containers", [])]


def _image_id(container: Obj) -> str:
    image = str(container.get("image", "")).rsplit(":", 1)[0]
    return f"{image}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


def gpu_request(pod: Obj) -> int:
    total = 0
    for c in pod.get("spec", {}).get("containers", []):
        total += int(c.get("resources", {}).get("requests", {}).get(GPU, 0))
    return total


def tolerates(pod: Obj, node: Obj) -> bool:
    tolerations = pod.get("spec", {}).get("tolerations") or []
    for taint in node.get("spec", {}).get("taints") or []:
        if taint.get("effect") == "PreferNoSchedule":
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            return False
    return True


def _tolerates(toleration: Obj, taint: Obj) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint.get("key")
    return bool(toleration.get("key") == taint.get("key")
                and toleration.get("value", "") == taint.get("value", ""))


def selects(pod: Obj, node: Obj) -> bool:
    labels = meta(node).get("labels") or {}
    wanted = pod.get("spec", {}).get("nodeSelector") or {}
    return all(labels.get(k) == v for k, v in wanted.items())
