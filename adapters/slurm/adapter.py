"""The Slurm adapter's registry entry: the ``slurm.*`` actions over the configured backend."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.actions import Action
from adapters.prometheus.gate import configured_settle
from adapters.registry import Adapter, Built
from adapters.slurm.actions import ACTION_CLASSES, SlurmActions
from adapters.slurm.config import SlurmConfig
from adapters.slurm.fleet import FLEET_ACTIONS, DrainBatchesAction, ResumeBatchesAction
from adapters.slurm.gpureset import GpuResetAction
from adapters.slurm.health import HealthCheckAction
from adapters.slurm.mig import MIG_ACTIONS, CheckGresAction, MigApplyAction
from adapters.slurm.nccltest import NcclTestAction
from adapters.slurm.pools import POOL_ACTIONS
from adapters.slurm.release import ReservationReleaseAction
from adapters.slurm.rolling import DriverRolloutAction
from adapters.slurm.slurm_upgrade import UPGRADE_ACTIONS
from adapters.slurm.transports.choice import make_backend


def _build(config: SlurmConfig, backends: Mapping[str, Any]) -> Built:
    backend = make_backend(config)
    prometheus = backends.get("prometheus")  # the health check's GPU gate (DCGM)
    settle = configured_settle(prometheus)
    actions: list[Action] = [*SlurmActions(backend, config).all(),
                             HealthCheckAction(backend, config, prometheus=prometheus,
                                               gpu_settle=settle),
                             DriverRolloutAction(backend, config, prometheus=prometheus,
                                                 gpu_settle=settle),
                             GpuResetAction(backend, config, prometheus=prometheus,
                                            gpu_settle=settle),
                             *(cls(backend, config) for cls in POOL_ACTIONS),
                             MigApplyAction(backend, config),
                             CheckGresAction(backend, config, prometheus=prometheus,
                                             gpu_settle=settle),
                             *(cls(backend, config) for cls in UPGRADE_ACTIONS),
                             ReservationReleaseAction(backend, config, prometheus=prometheus,
                                                      gpu_settle=settle),
                             DrainBatchesAction(backend, config),
                             ResumeBatchesAction(backend, config, prometheus=prometheus,
                                                 gpu_settle=settle),
                             NcclTestAction(backend, config)]  # the bot hands it its baselines
    return Built(actions, backend)


ADAPTER = Adapter("slurm", "slurm", SlurmConfig,
                  (*ACTION_CLASSES, HealthCheckAction, DriverRolloutAction, GpuResetAction,
                   ReservationReleaseAction, NcclTestAction,
                   *POOL_ACTIONS, *MIG_ACTIONS, *UPGRADE_ACTIONS, *FLEET_ACTIONS),
                  _build, uses=("prometheus",))
