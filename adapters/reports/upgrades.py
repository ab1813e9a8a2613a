"""The driver upgrade's registry entry: ``slurm.driver_upgrade`` over the Slurm backend, with
Prometheus (when configured) for its soak; enabled by the Slurm section."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.prometheus.gate import build_actions
from adapters.registry import Adapter, Built
from adapters.slurm.config import SlurmConfig
from adapters.slurm.driver_upgrade import DriverUpgradeAction

ACTION_CLASSES: tuple[type[DriverUpgradeAction], ...] = (DriverUpgradeAction,)


def _build(config: SlurmConfig, backends: Mapping[str, Any]) -> Built:
    return Built(build_actions(ACTION_CLASSES, backends["slurm"], config,
                               backends.get("prometheus")))


ADAPTER = Adapter("upgrades", "slurm", SlurmConfig, ACTION_CLASSES, _build,
                  uses=("slurm", "prometheus"))
