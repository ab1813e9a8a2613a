"""The resource kinds this server knows, and the discovery documents built from them."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import Obj

RW = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
READ = ("get", "list", "watch")


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short: tuple[str, ...] = ()
    verbs: tuple[str, ...] = RW
    builtin: bool = True  # custom resources reject strategic merge patches (415)
    categories: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def key(self) -> str:
        """Store key: the qualified resource name (nodes, leases.coordination.k8s.io)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


RESOURCES = [
    Resource("", "v1", "namespaces", "Namespace", False, ("ns",)),
    Resource("", "v1", "nodes", "Node", False, ("no",)),
    Resource("", "v1", "pods", "Pod", True, ("po",), categories=("all",)),
    Resource("apps", "v1", "daemonsets", "DaemonSet", True, ("ds",), categories=("all",)),
    Resource("apps", "v1", "deployments", "Deployment", True, ("deploy",), categories=("all",)),
    Resource("apps", "v1", "replicasets", "ReplicaSet", True, ("rs",), categories=("all",)),
    Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",)),
    Resource("coordination.k8s.io", "v1", "leases", "Lease", True),
    Resource("batch", "v1", "jobs", "Job", True, categories=("all",)),
    Resource("nvidia.com", "v1", "clusterpolicies", "ClusterPolicy", False, builtin=False),
    Resource("nvidia.com", "v1alpha1", "nvidiadrivers", "NVIDIADriver", False, ("nvd",),
             builtin=False),
    # Kueue (kueue.x-k8s.io): fairshare-review reads ClusterQueues' quota and usage.
    Resource("kueue.x-k8s.io", "v1beta1", "clusterqueues", "ClusterQueue", False, ("cq",),
             builtin=False),
    Resource("kueue.x-k8s.io", "v1beta1", "localqueues", "LocalQueue", True, ("queue", "queues"),
             builtin=False),
    Resource("kueue.x-k8s.io", "v1beta1", "resourceflavors", "ResourceFlavor", False,
             ("flavor", "flavors", "rf"), builtin=False),
]
# Subresources listed in discovery: (parent plural, subresource, kind, group, version, verbs).
SUBRESOURCES = {
    "pods": [("eviction", "Eviction", "policy", "v1", ("create",)),
             ("log", "Pod", "", "", ("get",)),
             ("status", "Pod", "", "", ("get", "patch", "update"))],
    "jobs": [("status", "Job", "", "", ("get", "patch", "update"))],
    "nodes": [("status", "Node", "", "", ("get", "patch", "update"))],
    "daemonsets": [("status", "DaemonSet", "", "", ("get", "patch", "update"))],
    "poddisruptionbudgets": [("status", "PodDisruptionBudget", "", "", ("get", "patch", "update"))],
    "clusterpolicies": [("status", "ClusterPolicy", "", "", ("get", "patch", "update"))],
    "nvidiadrivers": [("status", "NVIDIADriver", "", "", ("get", "patch", "update"))],
    "clusterqueues": [("status", "ClusterQueue", "", "", ("get", "patch", "update"))],
    "localqueues": [("status", "LocalQueue", "", "", ("get", "patch", "update"))],
}
# Preferred version first.
GROUPS: dict[str, list[str]] = {}
for _r in RESOURCES:
    if _r.group and _r.version not in GROUPS.setdefault(_r.group, []):
        GROUPS[_r.group].append(_r.version)


def find(group: str, version: str, plural: str) -> Resource | None:
    for res in RESOURCES:
        if (res.group, res.version, res.plural) == (group, version, plural):
            return res
    return None


def by_kind(kind: str) -> Resource:
    return next(r for r in RESOURCES if r.kind == kind)


def resource_list(group: str, version: str) -> Obj | None:
    """APIResourceList for /api/v1 or /apis/<group>/<version>."""
    items = [r for r in RESOURCES if (r.group, r.version) == (group, version)]
    if not items:
        return None
    out = []
    for res in items:
        entry: Obj = {"name": res.plural, "singularName": res.singular,
                      "namespaced": res.namespaced, "kind": res.kind, "verbs": list(res.verbs)}
        if res.short:
            entry["shortNames"] = list(res.short)
        if res.categories:
            entry["categories"] = list(res.categories)
        out.append(entry)
        for sub, kind, sgroup, sversion, verbs in SUBRESOURCES.get(res.plural, []):
            sub_entry: Obj = {"name": f"{res.plural}/{sub}", "singularName": "",
                              "namespaced": res.namespaced, "kind": kind, "verbs": list(verbs)}
            if sgroup:
                sub_entry.update(group=sgroup, version=sversion)
            out.append(sub_entry)
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version, "resources": out}


def group_doc(group: str) -> Obj:
    versions = [{"groupVersion": f"{group}/{v}", "version": v} for v in GROUPS[group]]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": versions,
            "preferredVersion": versions[0]}


def group_list() -> Obj:
    groups = []
    for group in GROUPS:
        doc = group_doc(group)
        del doc["kind"], doc["apiVersion"]
        groups.append(doc)
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_versions(address: str) -> Obj:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}]}
