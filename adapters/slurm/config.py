"""The ``slurm:`` section of the bot configuration."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from adapters.host import HostCommand


class UpgradeConfig(BaseModel):
    """``slurm.upgrade``: the site's install commands upgrade-slurm runs on the bot host
    (``slurmdbd-install``/``slurmctld-install`` get VERSION, ``slurmd-install`` VERSION
    NODE; each installs and restarts its daemon) and the release window it allows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    commands: dict[str, HostCommand] = Field(default_factory=dict)
    # releases slurmdbd/slurmctld may be ahead of slurmd; default Slurm's rule (2, from 24.11 3)
    max_releases_apart: int | None = Field(default=None, ge=1, le=3)


class SlurmConfig(BaseModel):
    """How the bot reaches Slurm.

    ``commands`` are the only programs ``slurm.run_on_node`` may start on a node
    (``health-check: {argv: [dcgmi, diag, -r, "2"]}``); runbooks name them, never paths.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["cli", "pyslurm"] = "cli"
    slurm_conf: str | None = None  # exported as SLURM_CONF to every Slurm client
    bin_dir: str | None = None  # folder of sinfo/scontrol/srun/...; default: PATH
    commands: dict[str, HostCommand] = Field(default_factory=dict)
    timeout: float = Field(default=30.0, gt=0)  # seconds per CLI call
    upgrade: UpgradeConfig = Field(default_factory=UpgradeConfig)  # upgrade-slurm
