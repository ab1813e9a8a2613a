"""The Slurm adapter's registry entry: every ``slurm.*`` action over the configured backend,
listed once (``ACTION_CLASSES``) and built in one place."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.prometheus.gate import build_actions
from adapters.registry import Adapter, Built
from adapters.slurm.actions import NODE_ACTIONS
from adapters.slurm.config import SlurmConfig
from adapters.slurm.fleet import FLEET_ACTIONS
from adapters.slurm.gpureset import GpuResetAction
from adapters.slurm.health import HealthCheckAction
from adapters.slurm.mig import MIG_ACTIONS
from adapters.slurm.nccltest import NcclTestAction
from adapters.slurm.pools import POOL_ACTIONS
from adapters.slurm.release import ReservationReleaseAction
from adapters.slurm.rolling import DriverRolloutAction
from adapters.slurm.slurm_upgrade import UPGRADE_ACTIONS
from adapters.slurm.transports.choice import make_backend

# The GPU-gated ones (health_check, gpu_reset, check_gres, resume_batches...) are built
# with Prometheus for their gate (DCGM); nccl_test gets its baselines from the bot.
ACTION_CLASSES: tuple[type[Any], ...] = (
    *NODE_ACTIONS, HealthCheckAction, DriverRolloutAction, GpuResetAction,
    ReservationReleaseAction, NcclTestAction,
    *POOL_ACTIONS, *MIG_ACTIONS, *UPGRADE_ACTIONS, *FLEET_ACTIONS,
)


def _build(config: SlurmConfig, backends: Mapping[str, Any]) -> Built:
    backend = make_backend(config)
    return Built(build_actions(ACTION_CLASSES, backend, config, backends.get("prometheus")),
                 backend)


ADAPTER = Adapter("slurm", "slurm", SlurmConfig, ACTION_CLASSES, _build, uses=("prometheus",))
