"""The drift report's registry entry (``report.drift``).

Enabled by the prometheus section (DCGM's labels are its main source); reads Kubernetes and
Slurm too where they are configured.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.prometheus.config import PrometheusConfig
from adapters.registry import Adapter, Built
from adapters.reports.drift.report import DriftReportAction
from adapters.reports.drift.sources import DaemonVersions

ACTION_CLASSES: tuple[type[DriftReportAction], ...] = (DriftReportAction,)


def _build(config: PrometheusConfig, backends: Mapping[str, Any]) -> Built:
    from adapters.slurm.daemons import CliDaemonReads  # the Slurm clients: only when used

    slurm = getattr(backends.get("slurm"), "config", None)  # its SlurmConfig, either backend
    kubernetes = backends.get("kubernetes")
    operator = getattr(getattr(kubernetes, "config", None), "gpu_operator", None)
    return Built([DriftReportAction(
        backends.get("prometheus"), kubernetes,
        DaemonVersions(CliDaemonReads(slurm)) if slurm is not None else None,
        getattr(operator, "clusterpolicy", "cluster-policy"))])


ADAPTER = Adapter("drift", "prometheus", PrometheusConfig, ACTION_CLASSES, _build,
                  uses=("slurm", "kubernetes", "prometheus"))
