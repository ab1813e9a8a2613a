"""What the Kubernetes adapter knows of a cluster: records, errors and the backend Protocol.

Records are small frozen dataclasses built from the API's JSON, so the actions never touch
the client's models. ``KubernetesBackend`` has one method per API operation;
``adapters.kubernetes.client.ClientBackend`` implements it with the official client.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from adapters.actions import ActionError

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
_PDB_IN_CAUSE = re.compile(r"disruption budget (\S+?)[ :]")


class KubernetesError(ActionError):
    """The API refused or failed a request; carries the HTTP status and the Status message.

    ``status`` is 0 when no HTTP answer came (timeout, connection refused).
    """

    def __init__(self, message: str, *, status: int = 0, reason: str = "",
                 api_message: str = "", request: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.api_message = api_message
        self.request = request


class KubernetesNotFound(KubernetesError):
    """404: the object does not exist."""


class KubernetesConflict(KubernetesError):
    """409: a stale resourceVersion, or a create of an existing name."""


class KubernetesUnavailable(KubernetesError):
    """The API is not answering: a timeout, a refused connection, or a 5xx answer."""


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""

    def as_dict(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out

    def describe(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else \
            f"{self.key}:{self.effect}"


GPU_RESOURCE = "nvidia.com/gpu"


def _count(value: Any) -> int:
    try:
        return int(str(value)) if value is not None else 0
    except ValueError:
        return 0


def _gpu_requests(spec: Mapping[str, Any]) -> int:
    return sum(_count(((c.get("resources") or {}).get("requests") or {}).get(GPU_RESOURCE))
               for c in spec.get("containers") or [])


@dataclass(frozen=True)
class Node:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    ready: bool = True
    resource_version: str = ""
    gpus_allocatable: int = 0  # status.allocatable["nvidia.com/gpu"]
    # status.allocatable's nvidia.com/* resources (nvidia.com/gpu, nvidia.com/mig-3g.40gb)
    nvidia_allocatable: Mapping[str, int] = field(default_factory=dict)
    boot_id: str = ""  # status.nodeInfo.bootID: changes at every boot
    # the conditions that are True but Ready (node-problem-detector's, pressures): type ->
    # (reason, message, lastTransitionTime)
    problems: Mapping[str, tuple[str, str, str]] = field(default_factory=dict)

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> Node:
        metadata = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        conditions = (obj.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        return cls(
            name=str(metadata.get("name", "")),
            labels=dict(metadata.get("labels") or {}),
            annotations=dict(metadata.get("annotations") or {}),
            unschedulable=bool(spec.get("unschedulable")),
            taints=tuple(Taint(str(t.get("key", "")), str(t.get("effect", "")),
                               str(t.get("value") or "")) for t in spec.get("taints") or []),
            ready=ready,
            resource_version=str(metadata.get("resourceVersion", "")),
            gpus_allocatable=_count(((obj.get("status") or {}).get("allocatable") or {})
                                    .get(GPU_RESOURCE)),
            nvidia_allocatable={
                str(key): _count(value) for key, value in
                (((obj.get("status") or {}).get("allocatable") or {}).items())
                if str(key).startswith("nvidia.com/")},
            boot_id=str(((obj.get("status") or {}).get("nodeInfo") or {}).get("bootID") or ""),
            problems={str(c.get("type")): (str(c.get("reason") or ""),
                                           str(c.get("message") or ""),
                                           str(c.get("lastTransitionTime") or ""))
                      for c in conditions if c.get("status") == "True"
                      and c.get("type") not in ("Ready", None)},
        )


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    uid: str
    node: str | None = None
    phase: str = ""
    ready: bool = False
    owner_kind: str | None = None  # kind of the controller ownerReference
    owner_name: str | None = None
    mirror: bool = False  # a static pod's mirror: the kubelet owns it, eviction can't move it
    emptydir: bool = False
    deleting: bool = False  # deletionTimestamp set: terminating
    waiting_reason: str = ""  # first container's waiting reason (CrashLoopBackOff, ...)
    waiting_message: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    gpus_requested: int = 0  # sum of the containers' nvidia.com/gpu requests

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def daemonset(self) -> bool:
        return self.owner_kind == "DaemonSet"

    def describe(self) -> str:
        state = "terminating" if self.deleting else (
            "Ready" if self.ready else (self.waiting_reason or self.phase or "not Ready"))
        return f"{self.key} ({state})"

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> Pod:
        metadata = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        owner = next((r for r in metadata.get("ownerReferences") or [] if r.get("controller")),
                     None)
        waiting: Mapping[str, Any] = {}
        for container in [*(status.get("initContainerStatuses") or []),
                          *(status.get("containerStatuses") or [])]:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting:
                break
        return cls(
            namespace=str(metadata.get("namespace", "")),
            name=str(metadata.get("name", "")),
            uid=str(metadata.get("uid", "")),
            node=spec.get("nodeName"),
            phase=str(status.get("phase", "")),
            ready=any(c.get("type") == "Ready" and c.get("status") == "True"
                      for c in status.get("conditions") or []),
            owner_kind=owner.get("kind") if owner else None,
            owner_name=owner.get("name") if owner else None,
            mirror=MIRROR_ANNOTATION in (metadata.get("annotations") or {}),
            emptydir=any("emptyDir" in v for v in spec.get("volumes") or []),
            deleting=bool(metadata.get("deletionTimestamp")),
            waiting_reason=str(waiting.get("reason", "")),
            waiting_message=str(waiting.get("message", "")),
            labels=dict(metadata.get("labels") or {}),
            gpus_requested=_gpu_requests(spec),
        )


@dataclass(frozen=True)
class Eviction:
    """The answer to one eviction: ``evicted`` (201), ``gone`` (404) or ``blocked`` (429)."""

    outcome: Literal["evicted", "gone", "blocked"]
    pdb: str | None = None  # the PodDisruptionBudget that refused, when the API names it
    message: str = ""  # the API's own words for a refusal

    @classmethod
    def blocked_by(cls, status: Mapping[str, Any]) -> Eviction:
        """A 429 Status body: the budget's name is in the DisruptionBudget cause."""
        message = str(status.get("message", ""))
        pdb = None
        for cause in (status.get("details") or {}).get("causes") or []:
            text = str(cause.get("message", ""))
            found = _PDB_IN_CAUSE.search(text + " ")
            if cause.get("reason") == "DisruptionBudget" and found:
                pdb = found.group(1)
            if text and text not in message:
                message = f"{message} {text}".strip()
        return cls("blocked", pdb, message)


@dataclass(frozen=True)
class Lease:
    """A coordination.k8s.io/v1 Lease."""

    name: str
    namespace: str
    holder: str | None = None
    duration_seconds: int | None = None
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    transitions: int = 0
    resource_version: str = ""

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> Lease:
        metadata = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        duration = spec.get("leaseDurationSeconds")
        return cls(
            name=str(metadata.get("name", "")),
            namespace=str(metadata.get("namespace", "")),
            holder=spec.get("holderIdentity") or None,
            duration_seconds=int(duration) if duration is not None else None,
            acquire_time=_time(spec.get("acquireTime")),
            renew_time=_time(spec.get("renewTime")),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str(metadata.get("resourceVersion", "")),
        )

    def to_api(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if self.resource_version:
            metadata["resourceVersion"] = self.resource_version
        spec: dict[str, Any] = {"holderIdentity": self.holder,
                                "leaseDurationSeconds": self.duration_seconds,
                                "leaseTransitions": self.transitions}
        for key, value in (("acquireTime", self.acquire_time), ("renewTime", self.renew_time)):
            if value is not None:
                spec[key] = value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": metadata, "spec": spec}


@dataclass(frozen=True)
class Job:
    """A batch/v1 Job as its status tells it: ``outcome`` is ``running`` until the Job
    controller sets its Complete or Failed condition (``reason``, ``message`` its words)."""

    namespace: str
    name: str
    outcome: Literal["running", "complete", "failed"] = "running"
    reason: str = ""
    message: str = ""

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> Job:
        metadata, status = obj.get("metadata") or {}, obj.get("status") or {}
        outcome: Literal["running", "complete", "failed"] = "running"
        reason = message = ""
        for condition in status.get("conditions") or []:
            if condition.get("status") != "True":
                continue
            if condition.get("type") in ("Complete", "Failed"):
                outcome = "complete" if condition["type"] == "Complete" else "failed"
                reason = str(condition.get("reason") or "")
                message = str(condition.get("message") or "")
        return cls(str(metadata.get("namespace", "")), str(metadata.get("name", "")), outcome,
                   reason, message)


def _time(value: Any) -> datetime | None:
    if not value:
        return None
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


class KubernetesBackend(Protocol):
    """One method per Kubernetes API operation. Errors are ``KubernetesError`` subclasses."""

    url: str  # the API server, for messages

    def get_node(self, name: str) -> Node:
        """The node, or KubernetesNotFound."""
        ...

    def list_nodes(self, label_selector: str | None = None) -> list[Node]: ...

    def patch_node(self, name: str, patch: Mapping[str, Any], *,
                   strategic: bool = False) -> Node:
        """A merge patch (RFC 7386), or a strategic-merge patch when ``strategic``."""
        ...

    def pods_on_node(self, node: str) -> list[Pod]:
        """Every pod bound to the node, in all namespaces (fieldSelector=spec.nodeName)."""
        ...

    def list_pods(self, namespace: str | None = None, label_selector: str | None = None,
                  field_selector: str | None = None) -> list[Pod]: ...

    def evict(self, namespace: str, name: str, grace_seconds: int | None = None) -> Eviction:
        """POST pods/eviction (policy/v1): evicted, gone (404), or blocked (429)."""
        ...

    def get_custom_object(self, group: str, version: str, plural: str, name: str,
                          namespace: str | None = None) -> dict[str, Any]: ...

    def patch_custom_object(self, group: str, version: str, plural: str, name: str,
                            patch: Mapping[str, Any],
                            namespace: str | None = None) -> dict[str, Any]:
        """A merge patch (custom resources reject strategic merge)."""
        ...

    def list_custom_objects(self, group: str, version: str,
                            plural: str) -> list[dict[str, Any]]:
        """Every object of a cluster-scoped custom resource; KubernetesNotFound when the
        API server does not serve it (its CRD is not installed)."""
        ...

    def driver_versions(self, label_selector: str | None = None) -> dict[str, str | None]:
        """Node name -> the driver version its configured label reports (None: no label)."""
        ...

    def create_job(self, namespace: str, body: Mapping[str, Any]) -> Job:
        """POST a batch/v1 Job; KubernetesConflict when the name is taken."""
        ...

    def get_job(self, namespace: str, name: str) -> Job | None: ...

    def delete_job(self, namespace: str, name: str) -> None:
        """DELETE with its pods (propagationPolicy Background: the API's default for Jobs
        orphans them); one already gone is no error."""
        ...

    def pod_log(self, namespace: str, name: str, tail_lines: int = 200) -> str:
        """The last lines of the pod's (first container's) log."""
        ...

    def get_lease(self, namespace: str, name: str) -> Lease | None: ...

    def create_lease(self, lease: Lease) -> Lease:
        """Create; KubernetesConflict when it already exists."""
        ...

    def replace_lease(self, lease: Lease) -> Lease:
        """PUT with the lease's resourceVersion; KubernetesConflict when it is stale."""
        ...

    def delete_lease(self, namespace: str, name: str) -> None: ...

    def close(self) -> None: ...
