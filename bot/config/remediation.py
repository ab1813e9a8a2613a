"""Configuration of the remediation runbooks: MIG layouts, the pool hand-off, the XID table,
repeat offenders and the breaker on automation (docs/configuration.md, "Remediation").
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# What a GPU that reported an XID needs: a GPU reset (reset-gpu), a node reboot (reset-gpu
# method=reboot), a new GPU (swap-gpu), or nothing from the bot (an application's error).
XidAction = Literal["reset", "reboot", "swap", "none"]

# Defaults from NVIDIA's XID catalogue (its "resolution" for each error): RESET_GPU is
# reset, RESTART_BM (a node reboot) is reboot, a GPU gone from the bus or a failed row
# remap is swap, and errors the catalogue puts on the application (13, 31, 43, 45) are none.
DEFAULT_XID_ACTIONS: dict[int, XidAction] = {
    13: "none",    # graphics engine exception: the application
    31: "none",    # GPU memory page fault: the application
    43: "none",    # GPU stopped processing: the application
    45: "none",    # preemptive cleanup after another error
    48: "reset",   # double-bit ECC error
    61: "reset",   # internal micro-controller breakpoint
    62: "reset",   # internal micro-controller halt
    63: "reset",   # ECC page retirement or row remap recorded: applied at the next reset
    64: "swap",    # ECC page retirement or row remapping failed
    74: "reset",   # NVLink error
    79: "swap",    # GPU has fallen off the bus
    92: "none",    # high single-bit ECC rate: watch it
    94: "reset",   # contained ECC error
    95: "reboot",  # uncontained ECC error
    119: "reboot",  # GSP RPC timeout
    120: "reboot",  # GSP error
    140: "reset",  # unrecovered ECC error
}

MIG_PROFILE = re.compile(r"^[1-7]g\.[0-9]{1,3}gb$")
LAYOUT_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


class MigConfig(BaseModel):
    """The MIG layouts mig-reconfigure may apply: the name the MIG Manager and
    nvidia-mig-parted know, with the MIG devices each GPU gets (``all-3g.40gb: {3g.40gb: 2}``;
    ``all-disabled: {}`` turns MIG off). A layout this does not list is refused."""

    model_config = ConfigDict(extra="forbid")
    layouts: dict[str, dict[str, int]] = Field(default_factory=dict)

    @field_validator("layouts")
    @classmethod
    def _layouts(cls, value: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        for name, devices in value.items():
            if not LAYOUT_NAME.match(name):
                raise ValueError(f"{name!r} is not a layout name like all-3g.40gb")
            for profile, count in devices.items():
                if not MIG_PROFILE.match(profile):
                    raise ValueError(f"{name}: {profile!r} is not a MIG profile like 3g.40gb")
                if not 1 <= count <= 7:
                    raise ValueError(f"{name}: {profile}: 1 to 7 devices per GPU")
        return value


class PoolsConfig(BaseModel):
    """How a node shows which pool it serves (handoff-node). In Kubernetes: the pool label
    (value ``slurm`` or ``kubernetes``) and a NoSchedule taint of the same key while the node
    serves Slurm. In Slurm: a node serving Kubernetes is drained with a reason starting
    ``reason_prefix``, and loses ``slurm_feature`` (a feature jobs ask for with
    --constraint) when one is set."""

    model_config = ConfigDict(extra="forbid")
    label: str = "gpu-runbook-bot/pool"
    taint: str = "gpu-runbook-bot/pool"
    reason_prefix: str = Field(default="pool: kubernetes", min_length=1, max_length=64)
    slurm_feature: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")


class RepeatConfig(BaseModel):
    """A node that needed ``remediations`` remediations (drain-node, reset-gpu, swap-gpu,
    resume-node that ran) within ``days`` is a repeat offender: an alert about it proposes
    swap-gpu marked as repeat, and resume-node warns in its plan."""

    model_config = ConfigDict(extra="forbid")
    remediations: int = Field(default=3, ge=2, le=100)
    days: float = Field(default=30.0, gt=0, le=365)


class BreakerConfig(BaseModel):
    """Stops alert proposals and auto_run when automation has taken out more than
    ``max_pool_share`` of a pool's nodes, or more than ``max_nodes_per_hour`` nodes in an hour,
    until a person resets it (``runbook breaker reset``). Requests by people still work."""

    model_config = ConfigDict(extra="forbid")
    max_pool_share: float = Field(default=0.10, gt=0, le=1)
    max_nodes_per_hour: int = Field(default=5, ge=1, le=10_000)


class QuarantineConfig(BaseModel):
    """XIDs whose node is taken out of both schedulers at once, without a person: an alert
    that the XID table answers (an ``xid:`` rule) with one of ``xids`` first runs
    ``runbook`` (risk low: drain without waiting, cordon), then proposes the table's repair
    for a person. The breaker bounds it as every automatic run."""

    model_config = ConfigDict(extra="forbid")
    xids: list[int] = Field(default_factory=list)
    runbook: str = Field(default="quarantine-node", pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")

    @field_validator("xids")
    @classmethod
    def _xids(cls, value: list[int]) -> list[int]:
        bad = [x for x in value if not 1 <= x <= 999]
        if bad:
            raise ValueError(f"{bad[0]} is not an XID (1 to 999)")
        return sorted(set(value))


class IntakeConfig(BaseModel):
    """Faults the bot did not raise, taken in as alerts (bot/alerts/intake.py): every
    ``every`` seconds the leader reads the Slurm nodes drained by someone else (NHC, a
    person, Slurm: alert ``SlurmNodeDrained``) when ``slurm_drains``, and the Kubernetes
    nodes whose condition of a listed type is True (node-problem-detector's: alert
    ``KubernetesNodeCondition``). ``alert_rules`` say what each proposes; 0 turns it off."""

    model_config = ConfigDict(extra="forbid")
    every: float = Field(default=60.0, ge=0)
    slurm_drains: bool = True
    kubernetes_conditions: list[str] = Field(default_factory=list)

    @field_validator("kubernetes_conditions")
    @classmethod
    def _types(cls, value: list[str]) -> list[str]:
        for kind in value:
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]{0,62}", kind) or kind == "Ready":
                raise ValueError(f"{kind!r} is not a node condition type like GpuXidError "
                                 "(Ready is not a problem)")
        return value


class RemediationConfig(BaseModel):
    """The XID table, repeat offenders, the breaker, quarantine and the intake."""

    model_config = ConfigDict(extra="forbid")
    xid: dict[int, XidAction] = Field(default_factory=lambda: dict(DEFAULT_XID_ACTIONS))
    repeat: RepeatConfig = Field(default_factory=RepeatConfig)
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)
    quarantine: QuarantineConfig = Field(default_factory=QuarantineConfig)
    intake: IntakeConfig = Field(default_factory=IntakeConfig)

    @field_validator("xid")
    @classmethod
    def _merged(cls, value: dict[int, XidAction]) -> dict[int, XidAction]:
        # the file names the XIDs it changes; the rest keep the catalogue's defaults
        for xid in value:
            if not 1 <= xid <= 999:
                raise ValueError(f"{xid} is not an XID (1 to 999)")
        return {**DEFAULT_XID_ACTIONS, **value}

    def action_for(self, xid: int) -> XidAction | None:
        return self.xid.get(xid)
