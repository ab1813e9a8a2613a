"""The Kubernetes adapter's registry entry: the ``k8s.*`` and ``gpu_operator.*`` actions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.kubernetes.actions import ACTION_CLASSES, KubernetesActions
from adapters.kubernetes.config import KubernetesConfig
from adapters.kubernetes.gpu_gate import GpuGateAction, GpuGateNodesAction
from adapters.kubernetes.gpu_identity import GpuIdentityAction
from adapters.prometheus.gate import configured_settle
from adapters.registry import Adapter, Built

# they read DCGM through Prometheus (None when it is not configured: they refuse then)
PROMETHEUS_ACTIONS = (GpuGateAction, GpuGateNodesAction, GpuIdentityAction)


def _build(config: KubernetesConfig, backends: Mapping[str, Any]) -> Built:
    from adapters.kubernetes.client import make_backend  # the official client: only when used

    backend = make_backend(config)
    prometheus = backends.get("prometheus")  # the GPU gate before a node returns (DCGM)
    settle = configured_settle(prometheus)
    gates = [cls(backend, config, prometheus=prometheus, gpu_settle=settle)
             for cls in PROMETHEUS_ACTIONS]
    return Built([*KubernetesActions(backend, config).all(), *gates], backend)


ADAPTER = Adapter("kubernetes", "kubernetes", KubernetesConfig,
                  (*ACTION_CLASSES, *PROMETHEUS_ACTIONS), _build,
                  uses=("prometheus",))
