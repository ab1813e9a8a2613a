"""Where the drift report reads versions, touching no node: the DCGM exporter's label fields
in Prometheus (driver, VBIOS, InfoROM per GPU), the GPU Operator (its node label and its
ClusterPolicy), and Slurm (slurmctld's release, each node's slurmd, through scontrol).

Each reader raises ActionError when its system does not answer; the report says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from adapters.kubernetes.backend import KubernetesBackend, KubernetesNotFound
from adapters.prometheus.promql import selector
from adapters.reports.drift.judging import Gpu

if TYPE_CHECKING:
    from adapters.slurm.daemons import DaemonReads

# dcgm-exporter adds the fields its counters CSV lists with type `label` to every series,
# under the field's name (etc/default-counters.csv lists them, commented out).
DRIVER_LABEL = "DCGM_FI_DRIVER_VERSION"
VBIOS_LABEL = "DCGM_FI_DEV_VBIOS_VERSION"
INFOROM_LABEL = "DCGM_FI_DEV_INFOROM_IMAGE_VER"
HOST_LABELS = ("Hostname", "hostname")  # older and newer releases
CLUSTERPOLICY = ("nvidia.com", "v1", "clusterpolicies")
# The GPU Operator's Helm chart labels what it installs with its release (appVersion).
VERSION_LABEL = "app.kubernetes.io/version"


class Querier(Protocol):
    """The part of the Prometheus backend the report uses (an instant query)."""

    def query(self, promql: str, at: Any = None, *,
              timeout: float | None = None) -> list[Any]: ...


def labels_query(metric: str) -> str:
    """Each GPU's series with the time of its last sample as the value: when a label changed
    (a new driver), the old series stays visible for Prometheus' lookback unless a scrape
    marked it stale (not across a Prometheus restart), so the newest one is the GPU's."""
    return f"timestamp({selector(metric)})"  # selector refuses what is not a metric name


def dcgm_gpus(samples: list[Any]) -> dict[str, list[Gpu]]:
    """DCGM host -> its GPUs with their label fields, one per GPU index: the series sampled
    last (``labels_query``)."""
    found: dict[str, dict[str, tuple[float, Gpu]]] = {}
    for sample in samples:
        labels: Mapping[str, str] = sample.labels
        host = next((labels[k] for k in HOST_LABELS if labels.get(k)), None)
        if host is None:
            continue
        index = str(labels.get("gpu", "?"))
        seen = found.setdefault(host, {}).get(index)
        if seen is None or float(sample.value) > seen[0]:
            found[host][index] = (float(sample.value), Gpu(
                index, str(labels.get("modelName", "")), labels.get(DRIVER_LABEL) or None,
                labels.get(VBIOS_LABEL) or None, labels.get(INFOROM_LABEL) or None))
    return {host: [gpus[i][1] for i in sorted(gpus, key=_gpu_order)]
            for host, gpus in found.items()}


def _gpu_order(index: str) -> tuple[int, str]:
    return (int(index), "") if index.isdigit() else (1 << 30, index)


@dataclass(frozen=True)
class Operator:
    """The GPU Operator as its ClusterPolicy tells it."""

    version: str | None  # the release (the chart's app.kubernetes.io/version label)
    driver: str | None  # spec.driver.version: what it installs on the pool's nodes
    state: str | None  # status.state (ready, notReady)


def operator(kubernetes: KubernetesBackend, name: str) -> Operator | None:
    """None when there is no such ClusterPolicy (the operator is not installed)."""
    try:
        obj = kubernetes.get_custom_object(*CLUSTERPOLICY, name)
    except KubernetesNotFound:
        return None
    labels = (obj.get("metadata") or {}).get("labels") or {}
    driver = ((obj.get("spec") or {}).get("driver") or {}).get("version")
    return Operator(labels.get(VERSION_LABEL), str(driver) if driver else None,
                    (obj.get("status") or {}).get("state"))


class SlurmVersions(Protocol):
    def slurm_versions(self) -> tuple[str | None, dict[str, str | None]]:
        """slurmctld's release and each node's slurmd (None: the node did not say)."""
        ...


class DaemonVersions:
    """``SlurmVersions`` over upgrade-slurm's reads of the daemons (adapters.slurm.daemons:
    ``scontrol show config`` SLURM_VERSION, ``scontrol show node -o`` Version=)."""

    def __init__(self, reads: DaemonReads) -> None:
        self._reads = reads

    def slurm_versions(self) -> tuple[str | None, dict[str, str | None]]:
        controller = self._reads.controller().get("SLURM_VERSION") or None
        return controller, {d.name: d.version or None for d in self._reads.node_daemons()}
