"""The ``slurm:`` section of the bot configuration."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from adapters.host import HostCommand

# The slurmrestd API versions the rest backend speaks (v0.0.38 is Slurm 22.05's, v0.0.45
# 26.05's).
REST_API_VERSION = r"^v0\.0\.(3[89]|4[0-5])$"


class UpgradeConfig(BaseModel):
    """``slurm.upgrade``: the site's install commands upgrade-slurm runs on the bot host
    (``slurmdbd-install``/``slurmctld-install`` get VERSION, ``slurmd-install`` VERSION
    NODE; each installs and restarts its daemon) and the release window it allows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    commands: dict[str, HostCommand] = Field(default_factory=dict)
    # releases slurmdbd/slurmctld may be ahead of slurmd; default Slurm's rule (2, from 24.11 3)
    max_releases_apart: int | None = Field(default=None, ge=1, le=3)


class NcclConfig(BaseModel):
    """``slurm.nccl``: how ``slurm.nccl_test`` starts its node command (``nccl-test``,
    nccl-tests' all_reduce_perf) across nodes: srun's MPI plugin (``--mpi=pmix``; unset:
    slurm.conf's MpiDefault) and the tasks per node, which go with the command's ``-g``
    (1 task driving ``-g 8`` GPUs, or 8 tasks of ``-g 1``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mpi: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_]{0,31}$")
    tasks_per_node: int = Field(default=1, ge=1, le=64)


class RestConfig(BaseModel):
    """``slurm.rest``: slurmrestd's URL, the Slurm user the bot acts as, and one source of
    its JWT: ``token_file`` (re-read before the token expires), ``token_env`` (a variable
    holding the token) or ``key_file`` (the site's HS256 jwt key: the bot mints its own
    tokens of ``token_lifespan`` seconds, as ``scontrol token`` does)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str | None = Field(default=None, pattern=r"^https?://[^/\s]+(/\S*)?$")
    user: str | None = Field(default=None, min_length=1)
    token_file: str | None = None
    token_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    key_file: str | None = None
    token_lifespan: int = Field(default=3600, ge=60)  # seconds, of the tokens the bot mints
    renew_before: float | None = Field(default=None, ge=0)  # default: 10% of life, <= 60 s
    api_version: str | None = Field(default=None, pattern=REST_API_VERSION)  # pin one
    verify: bool | str = True  # TLS: verify (True), a CA bundle file, or not (False)
    # run_on_node over slurmrestd: a folder the nodes write and the bot reads (shared
    # filesystem) where a command's batch job leaves its output; unset: run_on_node refused
    job_output_dir: str | None = Field(default=None, pattern=r"^/")

    def token_sources(self) -> list[str]:
        return [name for name in ("token_file", "token_env", "key_file")
                if getattr(self, name) is not None]


class SlurmConfig(BaseModel):
    """How the bot reaches Slurm.

    ``commands`` are the only programs ``slurm.run_on_node`` may start on a node
    (``health-check: {argv: [dcgmi, diag, -r, "2"]}``); runbooks name them, never paths.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["cli", "pyslurm", "rest"] = "cli"
    slurm_conf: str | None = None  # exported as SLURM_CONF to every Slurm client
    bin_dir: str | None = None  # folder of sinfo/scontrol/srun/...; default: PATH
    commands: dict[str, HostCommand] = Field(default_factory=dict)
    timeout: float = Field(default=30.0, gt=0)  # seconds per CLI call or HTTP request
    upgrade: UpgradeConfig = Field(default_factory=UpgradeConfig)  # upgrade-slurm
    rest: RestConfig = Field(default_factory=RestConfig)  # backend: rest (slurmrestd)
    nccl: NcclConfig = Field(default_factory=NcclConfig)  # nccl-test across nodes
    # reason prefixes of the drains a node health check makes for the GPUs (NHC): the bot's
    # own health check of the node (slurm.health_check) answers them, so it lifts them
    # inside its reservation as it lifts its own; () never. Name only GPU checks here: a
    # GPU check does not answer an NHC drain for a missing mount or a slow link.
    health_check_drains: tuple[Annotated[str, Field(min_length=4, max_length=100)], ...] = (
        "NHC: gpu-health-check:",)

    @model_validator(mode="after")
    def _rest_is_complete(self) -> SlurmConfig:
        if self.backend != "rest":
            return self
        missing = [f"slurm.rest.{name}" for name in ("url", "user")
                   if getattr(self.rest, name) is None]
        if missing:
            raise ValueError(f"slurm.backend rest needs {' and '.join(missing)}")
        sources = self.rest.token_sources()
        if len(sources) != 1:
            raise ValueError(
                "slurm.backend rest needs exactly one of slurm.rest.token_file, token_env "
                f"or key_file (found {len(sources)}: {', '.join(sources) or 'none'})")
        return self
