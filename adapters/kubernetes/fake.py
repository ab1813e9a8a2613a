"""``FakeKubernetes``: an in-memory ``KubernetesBackend`` for tests, type-checked against the
Protocol.

It keeps nodes, pods, custom objects and Leases as the API server would; it never talks to
one. Nothing outside tests may use it.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from adapters.kubernetes.backend import (
    Eviction,
    Job,
    KubernetesConflict,
    KubernetesNotFound,
    Lease,
    Node,
    Pod,
    Taint,
)

if TYPE_CHECKING:
    from adapters.kubernetes.backend import KubernetesBackend

DRIVER_VERSION_LABEL = "nvidia.com/cuda.driver-version.full"


def _matches(labels: Mapping[str, str], selector: str | None) -> bool:
    """Equality-based label selectors: ``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``, by commas."""
    if "(" in (selector or ""):
        raise NotImplementedError(f"the fake reads no set-based selector: {selector!r}")
    for term in (selector or "").split(","):
        term = term.strip()
        if not term:
            continue
        if "!=" in term:
            key, value = (part.strip() for part in term.split("!=", 1))
            ok = labels.get(key) != value
        elif "=" in term:
            key, value = (part.strip() for part in term.replace("==", "=").split("=", 1))
            ok = labels.get(key) == value
        elif term.startswith("!"):
            ok = term[1:].strip() not in labels
        else:
            ok = term in labels
        if not ok:
            return False
    return True


def _merged(target: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386): None deletes a key, mappings merge, the rest replaces."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class FakeKubernetes:
    """Nodes by name (``nodes``), the pods bound to them (``pods``), custom objects by
    (group, version, plural, namespace, name) and Leases by (namespace, name).

    An evicted pod is gone at once (no termination grace, no PodDisruptionBudget), and a
    node patch applies ``spec.unschedulable``, ``spec.taints``, labels and annotations.
    Every node starts with a ``boot_id`` (``status.nodeInfo.bootID``); ``reboot()`` changes it.
    """

    url = "https://kubernetes.fake"

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = {name: Node(name=name, boot_id=f"boot-{name}-1") for name in nodes}
        self.pods: list[Pod] = []
        self.objects: dict[tuple[str, str, str, str | None, str], dict[str, Any]] = {}
        self.served: set[tuple[str, str, str]] = set()  # custom resources with no object yet
        self.leases: dict[tuple[str, str], Lease] = {}
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}  # the bodies as created
        self.jobs_created: list[tuple[str, dict[str, Any]]] = []  # (namespace, body), ever
        self.job_outcomes: dict[tuple[str, str], Job] = {}  # set by a test: how a Job ended
        self.logs: dict[tuple[str, str], str] = {}  # pod (namespace, name) -> its log
        self.driver_version_label: str | None = DRIVER_VERSION_LABEL
        self._versions = itertools.count(1)

    # --- nodes ---------------------------------------------------------------------

    def get_node(self, name: str) -> Node:
        if name not in self.nodes:
            raise KubernetesNotFound(f"nodes {name} not found", status=404)
        return self.nodes[name]

    def list_nodes(self, label_selector: str | None = None) -> list[Node]:
        return [node for node in self.nodes.values() if _matches(node.labels, label_selector)]

    def patch_node(self, name: str, patch: Mapping[str, Any], *,
                   strategic: bool = False) -> Node:
        node = self.get_node(name)
        spec = patch.get("spec") or {}
        metadata = patch.get("metadata") or {}
        taints = node.taints
        if "taints" in spec:
            taints = tuple(Taint(str(t["key"]), str(t["effect"]), str(t.get("value") or ""))
                           for t in spec["taints"] or [])
        node = replace(node, labels=_merged(dict(node.labels), metadata.get("labels") or {}),
                       annotations=_merged(dict(node.annotations),
                                           metadata.get("annotations") or {}),
                       unschedulable=bool(spec.get("unschedulable", node.unschedulable)),
                       taints=taints)
        self.nodes[name] = node
        return node

    def reboot(self, name: str, *, ready: bool = True) -> Node:
        """What a reboot agent does: a new bootID; ``ready`` False while still booting."""
        node = self.get_node(name)
        count = int(node.boot_id.rpartition("-")[2] or 0) + 1 if node.boot_id else 1
        self.nodes[name] = replace(node, boot_id=f"boot-{name}-{count}", ready=ready)
        return self.nodes[name]

    # --- pods ----------------------------------------------------------------------

    def pods_on_node(self, node: str) -> list[Pod]:
        return [pod for pod in self.pods if pod.node == node]

    def list_pods(self, namespace: str | None = None, label_selector: str | None = None,
                  field_selector: str | None = None) -> list[Pod]:
        node = None
        if field_selector:
            field, _, node = field_selector.partition("=")
            if field != "spec.nodeName":
                raise NotImplementedError(f"the fake reads only spec.nodeName: {field_selector}")
        return [pod for pod in self.pods
                if (namespace is None or pod.namespace == namespace)
                and (node is None or pod.node == node)
                and _matches(pod.labels, label_selector)]

    def evict(self, namespace: str, name: str, grace_seconds: int | None = None) -> Eviction:
        found = [p for p in self.pods if (p.namespace, p.name) == (namespace, name)]
        if not found:
            return Eviction("gone")
        self.pods = [p for p in self.pods if p not in found]
        return Eviction("evicted")

    # --- custom objects ------------------------------------------------------------

    def get_custom_object(self, group: str, version: str, plural: str, name: str,
                          namespace: str | None = None) -> dict[str, Any]:
        key = (group, version, plural, namespace, name)
        if key not in self.objects:
            raise KubernetesNotFound(f"{plural}.{group} {name} not found", status=404)
        return copy.deepcopy(self.objects[key])

    def patch_custom_object(self, group: str, version: str, plural: str, name: str,
                            patch: Mapping[str, Any],
                            namespace: str | None = None) -> dict[str, Any]:
        current = self.get_custom_object(group, version, plural, name, namespace)
        self.objects[(group, version, plural, namespace, name)] = _merged(current, patch)
        return self.get_custom_object(group, version, plural, name, namespace)

    def list_custom_objects(self, group: str, version: str,
                            plural: str) -> list[dict[str, Any]]:
        """404 unless ``served`` names the resource (its CRD) or an object of it exists."""
        found = [copy.deepcopy(obj) for (g, v, p, _, _), obj in sorted(self.objects.items())
                 if (g, v, p) == (group, version, plural)]
        if not found and (group, version, plural) not in self.served:
            raise KubernetesNotFound(f"the server could not find the requested resource "
                                     f"({plural}.{group})", status=404)
        return found

    def driver_versions(self, label_selector: str | None = None) -> dict[str, str | None]:
        label = self.driver_version_label
        return {node.name: node.labels.get(label) if label else None
                for node in self.list_nodes(label_selector)}

    # --- jobs ----------------------------------------------------------------------

    def create_job(self, namespace: str, body: Mapping[str, Any]) -> Job:
        name = str((body.get("metadata") or {}).get("name", ""))
        if (namespace, name) in self.jobs:
            raise KubernetesConflict(f"jobs.batch {name} already exists", status=409)
        self.jobs[(namespace, name)] = copy.deepcopy(dict(body))
        self.jobs_created.append((namespace, copy.deepcopy(dict(body))))
        return Job(namespace, name)

    def get_job(self, namespace: str, name: str) -> Job | None:
        if (namespace, name) not in self.jobs:
            return None
        return self.job_outcomes.get((namespace, name), Job(namespace, name))

    def delete_job(self, namespace: str, name: str) -> None:
        self.jobs.pop((namespace, name), None)
        self.pods = [p for p in self.pods if not (p.namespace == namespace
                                                   and p.labels.get("job-name") == name)]

    def pod_log(self, namespace: str, name: str, tail_lines: int = 200) -> str:
        if not any((p.namespace, p.name) == (namespace, name) for p in self.pods):
            raise KubernetesNotFound(f'pods "{name}" not found', status=404)
        return "\n".join(self.logs.get((namespace, name), "").splitlines()[-tail_lines:])

    # --- leases --------------------------------------------------------------------

    def get_lease(self, namespace: str, name: str) -> Lease | None:
        return self.leases.get((namespace, name))

    def create_lease(self, lease: Lease) -> Lease:
        if (lease.namespace, lease.name) in self.leases:
            raise KubernetesConflict(f"leases {lease.name} already exists", status=409)
        return self._store(lease)

    def replace_lease(self, lease: Lease) -> Lease:
        current = self.leases.get((lease.namespace, lease.name))
        if current is None:
            raise KubernetesNotFound(f"leases {lease.name} not found", status=404)
        if lease.resource_version != current.resource_version:
            raise KubernetesConflict(f"leases {lease.name}: the object has been modified",
                                     status=409)
        return self._store(lease)

    def _store(self, lease: Lease) -> Lease:
        stored = replace(lease, resource_version=str(next(self._versions)))
        self.leases[(lease.namespace, lease.name)] = stored
        return stored

    def delete_lease(self, namespace: str, name: str) -> None:
        self.leases.pop((namespace, name), None)

    def close(self) -> None:
        pass


if TYPE_CHECKING:
    _checked: KubernetesBackend = FakeKubernetes([])
