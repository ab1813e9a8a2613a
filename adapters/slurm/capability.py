"""What a configured Slurm backend can do, told from its configuration alone (``runbook config
check --offline``): the cli backend everything, pyslurm all but a reboot and job steps, the
rest backend what its pinned API version offers (no reboot, no job step across nodes ever).
An unpinned slurmrestd's version is known only by asking it (``RestBackend.unsupported``).
"""

from __future__ import annotations

from adapters.slurm.backend import OPERATIONS
from adapters.slurm.config import SlurmConfig

UNKNOWN = "unknown"  # the answer depends on the server's version, which was not asked


def refusal(config: SlurmConfig, operation: str) -> str | None:
    """Why the configured backend refuses ``operation``, None when it carries it out, or
    UNKNOWN when only slurmrestd itself can tell."""
    if operation not in OPERATIONS:
        raise ValueError(f"{operation!r} is not a SlurmBackend operation")
    if config.backend == "cli":
        return None
    if config.backend == "pyslurm":
        from adapters.slurm.transports.pyslurm.backend import UNSUPPORTED

        return UNSUPPORTED.get(operation)
    return _rest_refusal(config, operation)


def _rest_refusal(config: SlurmConfig, operation: str) -> str | None:
    from adapters.slurm.transports.rest.backend import NEEDS, RUN_ON_NODES
    from adapters.slurm.transports.rest.client import VERSIONS, release

    if operation == "run_on_nodes":
        return RUN_ON_NODES
    need = NEEDS.get(operation)
    if need is None:
        return None
    if need.since is None:
        return f"slurmrestd has no {need.what}: no API version offers it; use slurm.backend: cli"
    if operation == "run_on_node" and config.rest.job_output_dir is None:
        return ("a command on a node runs as a slurmrestd batch job, whose output the bot "
                "reads from slurm.rest.job_output_dir: set it, or use slurm.backend: cli")
    pinned = config.rest.api_version
    if pinned is None or pinned not in VERSIONS:
        return UNKNOWN
    if VERSIONS.index(pinned) <= VERSIONS.index(need.since):
        return None
    return (f"slurmrestd {pinned} ({release(pinned)}) has no {need.what}; it needs "
            f"{need.since} ({release(need.since)}) or later, or slurm.backend: cli")
