"""The driver upgrade's registry entry: ``slurm.driver_upgrade`` over the Slurm backend, with
Prometheus (when configured) for its soak; enabled by the Slurm section."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.prometheus.gate import configured_settle
from adapters.registry import Adapter, Built
from adapters.slurm.config import SlurmConfig
from adapters.slurm.driver_upgrade import DriverUpgradeAction


def _build(config: SlurmConfig, backends: Mapping[str, Any]) -> Built:
    prometheus = backends.get("prometheus")
    settle = configured_settle(prometheus)
    return Built([DriverUpgradeAction(backends["slurm"], config, prometheus=prometheus,
                                      gpu_settle=settle)])


ADAPTER = Adapter("upgrades", "slurm", SlurmConfig, (DriverUpgradeAction,), _build,
                  uses=("slurm", "prometheus"))
