"""Kubernetes and the NVIDIA GPU Operator: the backend Protocol, its implementation over the
official ``kubernetes`` client, the ``k8s.*``/``gpu_operator.*`` actions and a Lease-based
leader election helper.

    config = KubernetesConfig(kubeconfig="~/.kube/config")
    actions = KubernetesActions(ClientBackend(config), config).all()
"""

from typing import TYPE_CHECKING

from adapters.lazy import exports

if TYPE_CHECKING:
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
    from adapters.kubernetes.adapter import ADAPTER
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
    from adapters.kubernetes.client import (
        ClientBackend,
        make_api_client,
        make_backend,
    )
    from adapters.kubernetes.config import (
        GpuOperatorConfig,
        KubernetesConfig,
    )
    from adapters.kubernetes.leader import LeaseElector

__getattr__ = exports(__name__, {
    "adapters.kubernetes.actions": (
        "ACTION_CLASSES", "CordonAction", "DrainAction", "DriverVersionsAction",
        "KubernetesActions", "LabelAction", "SetDriverVersionAction", "TaintAction",
        "UncordonAction", "WaitLabelsAction", "WaitUpgradeStateAction", "WaitValidatorAction",
    ),
    "adapters.kubernetes.backend": (
        "Eviction", "KubernetesBackend", "KubernetesConflict", "KubernetesError",
        "KubernetesNotFound", "KubernetesUnavailable", "Lease", "Node", "Pod", "Taint",
    ),
    "adapters.kubernetes.config": ("GpuOperatorConfig", "KubernetesConfig"),
    "adapters.kubernetes.leader": ("LeaseElector",),
    "adapters.kubernetes.client": ("ClientBackend", "make_api_client", "make_backend"),
    "adapters.kubernetes.adapter": ("ADAPTER",),
})

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
