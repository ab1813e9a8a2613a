"""Server-side printing: meta.k8s.io/v1 Table answers for `kubectl get` (as the real
server's columns for the kinds kubectl shows most)."""
from __future__ import annotations

import calendar
import time
from collections.abc import Callable
from typing import Any

from .errors import Obj
from .resources import Resource

Column = tuple[str, str, int, Callable[[Obj], Any]]  # name, type, priority, cell


def age(obj: Obj) -> str:
    stamp = obj.get("metadata", {}).get("creationTimestamp")
    if not stamp:
        return "<unknown>"
    seconds = int(time.time() - calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))
    return human_duration(max(seconds, 0))


def human_duration(s: int) -> str:
    """Like k8s.io/apimachinery duration.HumanDuration."""
    if s < 120:
        return f"{s}s"
    m, h, d = s // 60, s // 3600, s // 86400
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if h < 3:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    return f"{d}d" if d < 730 else f"{d // 365}y"


def _node_status(node: Obj) -> str:
    conds = {c.get("type"): c.get("status") for c in node.get("status", {}).get("conditions", [])}
    state = "Ready" if conds.get("Ready") == "True" else "NotReady"
    return state + (",SchedulingDisabled" if node.get("spec", {}).get("unschedulable") else "")


def _roles(node: Obj) -> str:
    prefix = "node-role.kubernetes.io/"
    roles = [k[len(prefix):] for k in node["metadata"].get("labels", {}) if k.startswith(prefix)]
    return ",".join(sorted(roles)) or "<none>"


def _address(node: Obj, kind: str) -> str:
    addrs = node.get("status", {}).get("addresses", [])
    return next((a["address"] for a in addrs if a.get("type") == kind), "<none>")


def _pod_ready(pod: Obj) -> str:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    total = len(pod.get("spec", {}).get("containers", []))
    return f"{sum(bool(s.get('ready')) for s in statuses)}/{total}"


def _pod_status(pod: Obj) -> str:
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    for s in pod.get("status", {}).get("containerStatuses") or []:
        waiting = s.get("state", {}).get("waiting")
        if waiting:
            return str(waiting.get("reason", "Waiting"))
    return str(pod.get("status", {}).get("phase", "Unknown"))


def _restarts(pod: Obj) -> int:
    return sum(int(s.get("restartCount", 0))
               for s in pod.get("status", {}).get("containerStatuses") or [])


def _get(*path: str, default: Any = "<none>") -> Callable[[Obj], Any]:
    def cell(obj: Obj) -> Any:
        value: Any = obj
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        return default if value is None else value
    return cell


NAME: Column = ("Name", "string", 0, lambda o: o["metadata"]["name"])
AGE: Column = ("Age", "string", 0, age)
COLUMNS: dict[str, list[Column]] = {
    "Node": [NAME, ("Status", "string", 0, _node_status), ("Roles", "string", 0, _roles), AGE,
             ("Version", "string", 0, _get("status", "nodeInfo", "kubeletVersion", default="")),
             ("Internal-IP", "string", 1, lambda o: _address(o, "InternalIP")),
             ("External-IP", "string", 1, lambda o: _address(o, "ExternalIP")),
             ("OS-Image", "string", 1, _get("status", "nodeInfo", "osImage")),
             ("Kernel-Version", "string", 1, _get("status", "nodeInfo", "kernelVersion")),
             ("Container-Runtime", "string", 1,
              _get("status", "nodeInfo", "containerRuntimeVersion"))],
    "Pod": [NAME, ("Ready", "string", 0, _pod_ready), ("Status", "string", 0, _pod_status),
            ("Restarts", "string", 0, _restarts), AGE,
            ("IP", "string", 1, _get("status", "podIP")),
            ("Node", "string", 1, _get("spec", "nodeName"))],
    "DaemonSet": [NAME] + [
        (title, "integer", 0, _get("status", field, default=0)) for title, field in (
            ("Desired", "desiredNumberScheduled"), ("Current", "currentNumberScheduled"),
            ("Ready", "numberReady"), ("Up-to-date", "updatedNumberScheduled"),
            ("Available", "numberAvailable"))] + [
        ("Node Selector", "string", 0, lambda o: ",".join(
            f"{k}={v}" for k, v in (o["spec"]["template"]["spec"].get("nodeSelector") or {})
            .items()) or "<none>"), AGE],
    "PodDisruptionBudget": [
        NAME, ("Min Available", "string", 0, _get("spec", "minAvailable", default="N/A")),
        ("Max Unavailable", "string", 0, _get("spec", "maxUnavailable", default="N/A")),
        ("Allowed Disruptions", "integer", 0, _get("status", "disruptionsAllowed", default=0)),
        AGE],
    "Lease": [NAME, ("Holder", "string", 0, _get("spec", "holderIdentity", default="")), AGE],
    "ClusterPolicy": [NAME, ("Status", "string", 0, _get("status", "state", default="")), AGE],
    "NVIDIADriver": [NAME, ("Status", "string", 0, _get("status", "state", default="")), AGE],
    "ClusterQueue": [NAME, ("Cohort", "string", 0, _get("spec", "cohort", default="")),
                     ("Pending Workloads", "integer", 0,
                      _get("status", "pendingWorkloads", default=0))],
    "LocalQueue": [NAME, ("ClusterQueue", "string", 0, _get("spec", "clusterQueue", default="")),
                   ("Pending Workloads", "integer", 0,
                    _get("status", "pendingWorkloads", default=0)),
                   ("Admitted Workloads", "integer", 0,
                    _get("status", "admittedWorkloads", default=0))],
    "Namespace": [NAME, ("Status", "string", 0, _get("status", "phase", default="")), AGE],
}


def wants_table(accept: str) -> bool:
    return "as=Table" in accept


def partial(obj: Obj) -> Obj:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata", {})}


def table(res: Resource, items: list[Obj], rv: str, include: str = "Metadata") -> Obj:
    columns = COLUMNS.get(res.kind, [NAME, AGE])
    rows = []
    for obj in items:
        row: Obj = {"cells": [cell(obj) for _, _, _, cell in columns]}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = partial(obj)
        rows.append(row)
    definitions = [{"name": n, "type": t, "format": "name" if n == "Name" else "",
                    "description": "", "priority": p} for n, t, p, _ in columns]
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv},
            "columnDefinitions": definitions, "rows": rows}
