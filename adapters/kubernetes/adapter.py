"""The Kubernetes adapter's registry entry: the ``k8s.*`` and ``gpu_operator.*`` actions,
listed once (``ACTION_CLASSES``) and built in one place."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.kubernetes.actions import BACKEND_ACTIONS
from adapters.kubernetes.config import KubernetesConfig
from adapters.kubernetes.gpu_gate import GpuGateAction, GpuGateNodesAction
from adapters.kubernetes.gpu_identity import GpuIdentityAction
from adapters.prometheus.gate import build_actions
from adapters.registry import Adapter, Built

# the last three read DCGM through Prometheus (None when it is not configured: they refuse)
ACTION_CLASSES: tuple[type[Any], ...] = (
    *BACKEND_ACTIONS, GpuGateAction, GpuGateNodesAction, GpuIdentityAction)


def _build(config: KubernetesConfig, backends: Mapping[str, Any]) -> Built:
    from adapters.kubernetes.client import make_backend  # the official client: only when used

    backend = make_backend(config)
    return Built(build_actions(ACTION_CLASSES, backend, config, backends.get("prometheus")),
                 backend)


ADAPTER = Adapter("kubernetes", "kubernetes", KubernetesConfig, ACTION_CLASSES, _build,
                  uses=("prometheus",))
