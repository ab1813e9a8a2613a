"""Judging versions against what each pool should run: its pinned driver, the lowest driver
its CUDA versions allow, the pool's most common VBIOS and InfoROM per GPU model, slurmctld's
Slurm release; and, for every node out of line, the request that would put it back.

It reads nothing and changes nothing: the readings come in, findings go out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from kit.hostlist import compress
from kit.versions import version_key

# What a node can be out of line on, worst first (the gauge's `kind` label).
KINDS = ("driver_floor", "driver_pinned", "vbios", "inforom", "slurmd", "unknown")
FIRMWARE_FIX = "firmware update: by the vendor's tool (no runbook changes firmware)"


@dataclass(frozen=True)
class Gpu:
    """One GPU as DCGM labels it."""

    index: str
    model: str = ""
    driver: str | None = None
    vbios: str | None = None
    inforom: str | None = None


@dataclass
class NodeVersions:
    """What one node of one pool runs, under the bot's node name."""

    node: str
    pool: str  # slurm | kubernetes
    gpus: list[Gpu] = field(default_factory=list)
    label_driver: str | None = None  # the GPU Operator's node label (Kubernetes nodes)
    slurmd: str | None = None  # the node's slurmd (scontrol show node: Version=)

    @property
    def drivers(self) -> list[str]:
        """The drivers the node's GPUs report (one, unless caught mid-change), else the
        label's; lowest first."""
        found = {gpu.driver for gpu in self.gpus if gpu.driver}
        if not found and self.label_driver:
            found = {self.label_driver}
        return sorted(found, key=lambda v: version_key(v) or (-1,))


@dataclass(frozen=True)
class Pin:
    """What a pool should run: its pinned driver, and its floor for the CUDA version."""

    pinned: str | None = None
    floor: str | None = None
    cuda: str | None = None


@dataclass(frozen=True)
class Finding:
    pool: str
    node: str
    kind: str  # one of KINDS
    text: str
    fix: str


def driver_fix(pool: str, nodes: Iterable[str], pin: Pin) -> str:
    """The request that puts nodes back on the pool's pinned driver. Kubernetes: the GPU
    Operator changes every node of the pool at once."""
    target = f"nodes={_hostlist(nodes)} " if pool == "slurm" else ""
    if pin.pinned:
        return f"runbook run rollback-driver pool={pool} {target}version={pin.pinned}"
    return (f"pin a driver for the pool (drivers.pools.{pool}.pinned, at or above "
            f"{pin.floor}), then runbook run rollback-driver pool={pool} {target}"
            "version=THAT_VERSION")


def _hostlist(nodes: Iterable[str]) -> str:
    text = compress(sorted(nodes))
    return f'"{text}"' if "[" in text or "," in text else text


def judge_driver(node: NodeVersions, pin: Pin) -> Finding | None:
    drivers = node.drivers
    if not drivers:
        return Finding(node.pool, node.node, "unknown", "no driver version known (no DCGM "
                       "telemetry with DCGM_FI_DRIVER_VERSION, no driver label)",
                       "check dcgm-exporter on the node and its Prometheus target")
    lowest, shown = drivers[0], "/".join(drivers)
    fix = driver_fix(node.pool, [node.node], pin)
    low, floor = version_key(lowest), version_key(pin.floor or "")
    pinned = f", pinned {pin.pinned}" if pin.pinned else ""
    if low is not None and floor is not None and low < floor:
        return Finding(node.pool, node.node, "driver_floor",
                       f"driver {shown} is below {pin.floor}, the lowest driver for CUDA "
                       f"{pin.cuda}{pinned}", fix)
    if pin.pinned and set(drivers) != {pin.pinned}:
        want = version_key(pin.pinned)
        how = ("not" if low is None or want is None else
               "newer than" if low > want else "older than")
        return Finding(node.pool, node.node, "driver_pinned",
                       f"driver {shown}, {how} the pinned {pin.pinned}", fix)
    return None


def majority(values: Iterable[str]) -> tuple[str, int, int] | None:
    """The most common value with its count and the total; a tie goes to the higher
    version (the one the others more likely lack)."""
    counts = Counter(values)
    if not counts:
        return None
    best = max(counts, key=lambda v: (counts[v], version_key(v) or (), v))
    return best, counts[best], sum(counts.values())


def judge_firmware(nodes: list[NodeVersions], what: str, kind: str) -> list[Finding]:
    """Nodes with a GPU whose VBIOS (``what="vbios"``) or InfoROM differs from the most
    common one among the pool's GPUs of the same model."""
    by_model: dict[str, list[str]] = {}
    for node in nodes:
        for gpu in node.gpus:
            value = getattr(gpu, what)
            if value:
                by_model.setdefault(gpu.model, []).append(value)
    common = {model: majority(values) for model, values in by_model.items()}
    label = "VBIOS" if what == "vbios" else "InfoROM image"
    findings = []
    for node in nodes:
        odd: dict[tuple[str, str], list[str]] = {}
        for gpu in node.gpus:
            value, usual = getattr(gpu, what), common.get(gpu.model)
            if value and usual and value != usual[0]:
                odd.setdefault((gpu.model, value), []).append(gpu.index)
        for (model, value), indices in sorted(odd.items()):
            best, count, total = common[model] or ("?", 0, 0)
            findings.append(Finding(
                node.pool, node.node, kind,
                f"{label} {value} on GPU {','.join(indices)}; {count} of the pool's {total} "
                f"{model or 'GPUs'} run {best}", FIRMWARE_FIX))
    return findings


def judge_slurmd(node: NodeVersions, slurmctld: str | None) -> Finding | None:
    if not slurmctld or not node.slurmd or node.slurmd == slurmctld:
        return None
    return Finding(node.pool, node.node, "slurmd", f"slurmd {node.slurmd}, slurmctld "
                   f"{slurmctld}", f"install Slurm {slurmctld} on {node.node} and restart its "
                   "slurmd (no shipped runbook does this)")


def judge(nodes: list[NodeVersions], pin: Pin, slurmctld: str | None = None) -> list[Finding]:
    """Every finding for one pool's nodes, by node, worst first."""
    findings: list[Finding] = []
    for node in nodes:
        found = judge_driver(node, pin)
        if found is not None:
            findings.append(found)
        found = judge_slurmd(node, slurmctld) if node.pool == "slurm" else None
        if found is not None:
            findings.append(found)
    findings += judge_firmware(nodes, "vbios", "vbios")
    findings += judge_firmware(nodes, "inforom", "inforom")
    return sorted(findings, key=lambda f: (KINDS.index(f.kind), f.node))


def counts(pool_findings: list[Finding]) -> dict[str, int]:
    """Nodes out of line per kind (a node counts once per kind)."""
    return {kind: len({f.node for f in pool_findings if f.kind == kind}) for kind in KINDS}
