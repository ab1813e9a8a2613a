"""The Prometheus adapter's registry entry: ``prom.wait`` and the backend of promql checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.prometheus.actions import ACTION_CLASSES, PrometheusActions
from adapters.prometheus.backend import PrometheusApiBackend
from adapters.prometheus.config import PrometheusConfig
from adapters.registry import Adapter, Built


def _build(config: PrometheusConfig, backends: Mapping[str, Any]) -> Built:
    backend = PrometheusApiBackend(config)
    return Built(PrometheusActions(config, backend).all(), backend)


ADAPTER = Adapter("prometheus", "prometheus", PrometheusConfig, ACTION_CLASSES, _build)
