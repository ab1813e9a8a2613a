"""``make_backend``: the Slurm backend ``slurm.backend`` names (cli, pyslurm or rest)."""

from __future__ import annotations

from adapters.slurm.backend import SlurmBackend
from adapters.slurm.cli import CliBackend
from adapters.slurm.config import SlurmConfig


def make_backend(config: SlurmConfig) -> SlurmBackend:
    """The backend the configuration asks for (``cli`` by default); pyslurm and the rest
    backend's HTTP stack are imported only when asked for."""
    if config.backend == "pyslurm":
        from adapters.slurm.pyslurm_backend import PyslurmBackend

        return PyslurmBackend(config)
    if config.backend == "rest":
        from adapters.slurm.rest import RestBackend

        return RestBackend(config)
    return CliBackend(config)
