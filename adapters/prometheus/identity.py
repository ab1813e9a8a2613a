"""A GPU's identity (its UUID and board serial) as DCGM labels its series in Prometheus, and
``prom.gpu_identity``: swap-gpu's reading before the swap. After the swap the Slurm health
check (or, on a Kubernetes-only node, a Job) reads nvidia-smi on the node, which must agree
with DCGM and differ from this reading (parse_identities, swap_verdict). dcgm-exporter
labels every series with ``UUID``; the serial is a label (``DCGM_FI_DEV_SERIAL``) only where
its counters file lists that field as one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field

from adapters.actions import (
    ActionBase,
    ActionContext,
    ActionError,
    ActionResult,
    Seconds,
    StrictArguments,
)
from adapters.prometheus.backend import PrometheusBackend, PrometheusError
from adapters.prometheus.config import PrometheusConfig
from adapters.prometheus.gate import PRESENCE
from adapters.prometheus.soak import HOST_LABELS
from adapters.prometheus.template import build
from kit.durations import format_duration

SERIAL_LABEL = "DCGM_FI_DEV_SERIAL"


@dataclass(frozen=True)
class GpuIdentity:
    uuid: str
    serial: str = ""  # "" when unknown

    def as_dict(self) -> dict[str, str]:
        return {"uuid": self.uuid, "serial": self.serial}

    def show(self) -> str:
        return f"UUID {self.uuid}" + (f", serial {self.serial}" if self.serial else "")


def dcgm_identities(backend: PrometheusBackend, node: str, gpu: int,
                    lookback: float | None = None) -> list[GpuIdentity]:
    """The identities DCGM reports for GPU ``gpu`` of ``node`` now, or (``lookback``
    seconds) the last seen of each within that time: a GPU off the bus has no series now."""
    found: set[GpuIdentity] = set()
    for label in HOST_LABELS:
        selector = f'{PRESENCE}{{{label}="$node", gpu="$gpu"}}'
        query = build(f"last_over_time({selector}[$window])" if lookback else selector,
                      node=node, gpu=int(gpu), window=f"{int(lookback or 0)}s")
        for sample in backend.query(query, timeout=30):
            uuid = sample.labels.get("UUID", "")
            if uuid:
                found.add(GpuIdentity(uuid, sample.labels.get(SERIAL_LABEL, "")))
    # one GPU's series with and without the serial label (an exporter that began labelling
    # serials within the lookback): the one with it says more
    known = {i.uuid for i in found if i.serial}
    return sorted((i for i in found if i.serial or i.uuid not in known),
                  key=lambda i: (i.uuid, i.serial))


def parse_identities(out: str) -> dict[int, GpuIdentity]:
    """``nvidia-smi --query-gpu=index,serial,uuid --format=csv,noheader`` by GPU index."""
    found = {}
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 3 and fields[0].isdigit() and fields[2].startswith(("GPU-", "MIG-")):
            serial = "" if fields[1] in ("[N/A]", "N/A") else fields[1]
            found[int(fields[0])] = GpuIdentity(fields[2], serial)
    return found


def swap_verdict(gpu: int, before: list[GpuIdentity], after: GpuIdentity | None,
                 dcgm: list[GpuIdentity]) -> str | None:
    """Why the evidence does not show GPU ``gpu`` replaced; None when it does."""
    if after is None:
        return f"nvidia-smi lists no GPU {gpu} (off the bus?)"
    if not before:
        return f"no reading of GPU {gpu} from before the swap to compare {after.show()} with"
    if after.uuid not in {d.uuid for d in dcgm}:
        seen = "; ".join(d.show() for d in dcgm) or "no series"
        return f"nvidia-smi reads GPU {gpu} as {after.show()} but DCGM reports {seen}"
    if any(b.uuid == after.uuid for b in before) or (
            after.serial and any(b.serial == after.serial for b in before)):
        return (f"GPU {gpu} still reports {after.show()}, as before the swap: it was not "
                "replaced (or another GPU was)")
    return None


class IdentityArguments(StrictArguments):
    node: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # as DCGM names it
    gpu: int = Field(ge=0, le=15)
    lookback: Seconds = Field(default=86_400.0, ge=60, le=30 * 86_400)


class GpuIdentityAction(ActionBase[PrometheusBackend, PrometheusConfig]):
    """``prom.gpu_identity``: GPU ``gpu`` of ``node`` as DCGM reports it now (the last seen
    within ``lookback`` when it is off the bus); changes nothing. Fails when DCGM never saw
    it: there would be nothing to tell the new GPU from the old one by."""

    name: ClassVar[str] = "prom.gpu_identity"
    Arguments: ClassVar[type[StrictArguments]] = IdentityArguments

    def plan(self, args: IdentityArguments) -> list[str]:
        return [f"read GPU {args.gpu} of {args.node}'s UUID and serial as DCGM reports them "
                f"({self.config.url}; the last seen within {format_duration(args.lookback)} "
                "if it is off the bus now), to tell the replacement from it; changes nothing"]

    def run(self, args: IdentityArguments, ctx: ActionContext) -> ActionResult:
        try:
            seen, when = dcgm_identities(self.backend, args.node, args.gpu), "now"
            if not seen:
                seen = dcgm_identities(self.backend, args.node, args.gpu, args.lookback)
                when = f"last seen within {format_duration(args.lookback)}"
        except PrometheusError as exc:
            raise ActionError(f"cannot read GPU {args.gpu} of {args.node} from Prometheus: "
                              f"{exc}") from exc
        if not seen:
            raise ActionError(
                f"DCGM reported no GPU {args.gpu} of {args.node} within "
                f"{format_duration(args.lookback)}: nothing to tell a replacement from it by. "
                "Check the node and GPU, or ask again with gpu_identity=false (break-glass)")
        details: dict[str, Any] = {"node": args.node, "gpu": args.gpu, "when": when,
                                   "before": [i.as_dict() for i in seen]}
        return ActionResult(f"GPU {args.gpu} of {args.node} before the swap ({when}): "
                            + "; ".join(i.show() for i in seen), details, changed=False)
