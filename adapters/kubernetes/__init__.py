"""Kubernetes and the NVIDIA GPU Operator: the backend Protocol, its implementation over the
official ``kubernetes`` client, the ``k8s.*``/``gpu_operator.*`` actions and a Lease-based
leader election helper.

    config = KubernetesConfig(kubeconfig="~/.kube/config")
    actions = KubernetesActions(ClientBackend(config), config).all()
"""

from typing import TYPE_CHECKING, Any

from adapters.kubernetes.actions import (
    ACTION_CLASSES,
    CordonAction,
    DrainAction,
    DriverVersionsAction,
    KubernetesActions,
    LabelAction,
    SetDriverVersionAction,
    TaintAction,
    UncordonAction,
    WaitLabelsAction,
    WaitUpgradeStateAction,
    WaitValidatorAction,
)
from adapters.kubernetes.backend import (
    Eviction,
    KubernetesBackend,
    KubernetesConflict,
    KubernetesError,
    KubernetesNotFound,
    KubernetesUnavailable,
    Lease,
    Node,
    Pod,
    Taint,
)
from adapters.kubernetes.config import GpuOperatorConfig, KubernetesConfig
from adapters.kubernetes.leader import LeaseElector

if TYPE_CHECKING:
    from adapters.kubernetes.client import ClientBackend, make_api_client, make_backend

_CLIENT_NAMES = frozenset({"ClientBackend", "make_api_client", "make_backend"})


def __getattr__(name: str) -> Any:
    """The client half imports the official ``kubernetes`` package (a second of start-up):
    only when it is used, so commands that never talk to Kubernetes start fast."""
    if name in _CLIENT_NAMES:
        from adapters.kubernetes import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

from adapters.kubernetes.adapter import ADAPTER  # noqa: E402 (after what it registers)

__all__ = [
    "ACTION_CLASSES",
    "ADAPTER",
    "ClientBackend",
    "CordonAction",
    "DrainAction",
    "DriverVersionsAction",
    "Eviction",
    "GpuOperatorConfig",
    "KubernetesActions",
    "KubernetesBackend",
    "KubernetesConfig",
    "KubernetesConflict",
    "KubernetesError",
    "KubernetesNotFound",
    "KubernetesUnavailable",
    "LabelAction",
    "Lease",
    "LeaseElector",
    "Node",
    "Pod",
    "SetDriverVersionAction",
    "Taint",
    "TaintAction",
    "UncordonAction",
    "WaitLabelsAction",
    "WaitUpgradeStateAction",
    "WaitValidatorAction",
    "make_api_client",
    "make_backend",
]
