"""The Kubernetes adapter's registry entry: the ``k8s.*`` and ``gpu_operator.*`` actions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.kubernetes.actions import ACTION_CLASSES, KubernetesActions
from adapters.kubernetes.config import KubernetesConfig
from adapters.registry import Adapter, Built


def _build(config: KubernetesConfig, backends: Mapping[str, Any]) -> Built:
    from adapters.kubernetes.client import make_backend  # the official client: only when used

    backend = make_backend(config)
    return Built(KubernetesActions(backend, config).all(), backend)


ADAPTER = Adapter("kubernetes", "kubernetes", KubernetesConfig, ACTION_CLASSES, _build)
