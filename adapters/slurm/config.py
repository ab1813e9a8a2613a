"""The ``slurm:`` section of the bot configuration."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from adapters.host import HostCommand


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
