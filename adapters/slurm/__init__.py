"""Slurm: the backend Protocol, its CLI and pyslurm implementations, and the ``slurm.*`` actions.

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
    from adapters.slurm.cli import CliBackend
    from adapters.slurm.config import SlurmConfig
    from adapters.slurm.pyslurm_backend import (
        PyslurmBackend,
        make_backend,
    )

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
    "adapters.slurm.cli": ("CliBackend",),
    "adapters.slurm.config": ("SlurmConfig",),
    "adapters.slurm.pyslurm_backend": ("PyslurmBackend", "make_backend"),
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
