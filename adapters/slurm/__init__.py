"""Slurm: the backend Protocol, its CLI, slurmrestd and pyslurm implementations, and the
``slurm.*`` actions.

    config = SlurmConfig(slurm_conf="/etc/slurm/slurm.conf")
    actions = SlurmActions(make_backend(config), config).all()
"""

from typing import TYPE_CHECKING

from adapters.lazy import exports

if TYPE_CHECKING:
    from adapters.slurm.actions import (
        ACTION_CLASSES,
        DrainAction,
        NodeInfoAction,
        RebootAction,
        ReservationCreateAction,
        ReservationDeleteAction,
        ResumeAction,
        RunOnNodeAction,
        SlurmActions,
        WaitIdleAction,
    )
    from adapters.slurm.adapter import ADAPTER
    from adapters.slurm.backend import (
        AccountUsage,
        Job,
        NodeInfo,
        Reservation,
        SlurmBackend,
        SlurmctldUnreachable,
        SlurmError,
    )
    from adapters.slurm.backends import make_backend
    from adapters.slurm.cli import CliBackend
    from adapters.slurm.config import RestConfig, SlurmConfig
    from adapters.slurm.pyslurm_backend import PyslurmBackend
    from adapters.slurm.rest import RestBackend

__getattr__ = exports(__name__, {
    "adapters.slurm.actions": (
        "ACTION_CLASSES", "DrainAction", "NodeInfoAction", "RebootAction",
        "ReservationCreateAction", "ReservationDeleteAction", "ResumeAction", "RunOnNodeAction",
        "SlurmActions", "WaitIdleAction",
    ),
    "adapters.slurm.adapter": ("ADAPTER",),
    "adapters.slurm.backend": (
        "AccountUsage", "Job", "NodeInfo", "Reservation", "SlurmBackend",
        "SlurmctldUnreachable", "SlurmError",
    ),
    "adapters.slurm.backends": ("make_backend",),
    "adapters.slurm.cli": ("CliBackend",),
    "adapters.slurm.config": ("RestConfig", "SlurmConfig"),
    "adapters.slurm.pyslurm_backend": ("PyslurmBackend",),
    "adapters.slurm.rest": ("RestBackend",),
})

__all__ = [
    "ACTION_CLASSES",
    "ADAPTER",
    "AccountUsage",
    "CliBackend",
    "DrainAction",
    "Job",
    "NodeInfo",
    "NodeInfoAction",
    "PyslurmBackend",
    "RebootAction",
    "Reservation",
    "ReservationCreateAction",
    "ReservationDeleteAction",
    "RestBackend",
    "RestConfig",
    "ResumeAction",
    "RunOnNodeAction",
    "SlurmActions",
    "SlurmBackend",
    "SlurmConfig",
    "SlurmError",
    "SlurmctldUnreachable",
    "WaitIdleAction",
    "make_backend",
]
