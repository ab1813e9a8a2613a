"""``report.drift``: which nodes run other versions than their pool should, as one text for
people, each node out of line with the request that would put it back.

It only reads (Prometheus, Kubernetes, Slurm); a source that does not answer is said in the
text rather than failing the whole report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

from pydantic import Field

from adapters.actions import ActionContext, ActionError, ActionResult, StrictArguments
from adapters.kubernetes.backend import KubernetesBackend
from adapters.reports.drift.judging import (
    Finding,
    Gpu,
    NodeVersions,
    Pin,
    counts,
    driver_fix,
    judge,
)
from adapters.reports.drift.sources import (
    Operator,
    Querier,
    SlurmVersions,
    dcgm_gpus,
    labels_query,
    operator,
)

POOLS = ("slurm", "kubernetes")


class PoolDrivers(StrictArguments):
    pinned: str | None = None
    floor: str | None = None
    cuda: str | None = None


class DriftArguments(StrictArguments):
    drivers: dict[str, PoolDrivers] = Field(
        default_factory=dict, description="per pool: pinned, floor, cuda (the drivers fact)")
    slurm_nodes: list[str] = Field(default_factory=list, description="the Slurm pool's nodes")
    kubernetes_nodes: list[str] = Field(default_factory=list,
                                        description="the Kubernetes pool's nodes")
    slurm_names: dict[str, str] = Field(default_factory=dict, description="where they differ")
    kubernetes_names: dict[str, str] = Field(default_factory=dict)
    dcgm_names: dict[str, str] = Field(default_factory=dict)
    metric: str = Field(default="DCGM_FI_DEV_GPU_TEMP", pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$",
                        description="a DCGM series every GPU has, read for its labels")
    top: int = Field(default=50, ge=1, le=1000, description="nodes listed per pool at most")


class Readings:
    """What the sources said, and which of them did not answer."""

    def __init__(self) -> None:
        self.gpus: dict[str, list[Gpu]] | None = None  # DCGM host -> GPUs
        self.labels: dict[str, str | None] | None = None  # Kubernetes node -> driver label
        self.operator: Operator | None = None
        self.slurmctld: str | None = None
        self.slurmd: dict[str, str | None] | None = None
        self.problems: dict[str, str] = {}  # source -> why it is unknown


class DriftReportAction:
    """Each pool's nodes against what the pool should run:

    - the driver (DCGM's DCGM_FI_DRIVER_VERSION label; a Kubernetes node without telemetry:
      the GPU Operator's node label) against the pool's pinned driver and the lowest driver
      its CUDA versions allow (``drivers:`` in the configuration, rendered by the runbook);
    - VBIOS and InfoROM (DCGM_FI_DEV_VBIOS_VERSION, DCGM_FI_DEV_INFOROM_IMAGE_VER) against
      the most common among the pool's GPUs of the same model;
    - each Slurm node's slurmd against slurmctld's release;
    - and the GPU Operator's release and the driver its ClusterPolicy installs.

    The step fails only when no source answered. The summary is the whole report (the chat
    channel gets it, the audit log keeps it); the details carry the counts /metrics shows.
    """

    name: ClassVar[str] = "report.drift"
    Arguments: ClassVar[type[StrictArguments]] = DriftArguments

    def __init__(self, prometheus: Querier | None = None,
                 kubernetes: KubernetesBackend | None = None,
                 slurm: SlurmVersions | None = None, clusterpolicy: str = "cluster-policy",
                 clock: Callable[[], float] = time.time) -> None:
        self.prometheus = prometheus
        self.kubernetes = kubernetes
        self.slurm = slurm
        self.clusterpolicy = clusterpolicy
        self._clock = clock

    def plan(self, args: DriftArguments) -> list[str]:
        lines = []
        for pool in POOLS:
            pin = args.drivers.get(pool) or PoolDrivers()
            floor = f", floor {pin.floor} (CUDA {pin.cuda})" if pin.floor else ""
            lines.append(f"{pool} pool: pinned driver {pin.pinned or 'none'}{floor}")
        lines.append(self._source_line("prometheus", f"PromQL {labels_query(args.metric)}: "
                                       "driver, VBIOS and InfoROM labels of every GPU "
                                       "(dcgm-exporter), its newest series"))
        lines.append(self._source_line("kubernetes", "the GPU Operator's driver label on "
                                       f"nodes; ClusterPolicy {self.clusterpolicy}"))
        lines.append(self._source_line("slurm", "scontrol show config (SLURM_VERSION); "
                                       "scontrol show node -o (each slurmd's Version)"))
        return [*lines, "reads only; changes nothing"]

    def _source_line(self, source: str, text: str) -> str:
        if getattr(self, source) is None:
            return f"{source}: skipped (not configured)"
        return text

    def run(self, args: DriftArguments, ctx: ActionContext) -> ActionResult:
        now = self._clock()
        readings = self._read(args, ctx)
        if all(readings.problems.get(s) for s in ("prometheus", "kubernetes", "slurm")):
            raise ActionError("the drift report could not read anything: " + "; ".join(
                f"{source}: {why}" for source, why in sorted(readings.problems.items())))
        pools = {pool: _pool_nodes(pool, args, readings) for pool in POOLS}
        pins = {pool: Pin(**(args.drivers.get(pool) or PoolDrivers()).model_dump())
                for pool in POOLS}
        findings = {pool: judge(pools[pool], pins[pool], readings.slurmctld) for pool in POOLS}
        text = _render(args, now, readings, pools, pins, findings)
        return ActionResult(summary="\n".join(text), changed=False,
                            details=_details(now, readings, pools, findings))

    def _read(self, args: DriftArguments, ctx: ActionContext) -> Readings:
        readings = Readings()
        for source, read in (("prometheus", self._read_dcgm), ("kubernetes", self._read_k8s),
                             ("slurm", self._read_slurm)):
            ctx.checkpoint(f"reading {source}")
            if getattr(self, source) is None:
                readings.problems[source] = "not configured"
                continue
            try:
                read(args, readings)
            except ActionError as exc:
                readings.problems[source] = f"did not answer ({exc})"
        return readings

    def _read_dcgm(self, args: DriftArguments, readings: Readings) -> None:
        assert self.prometheus is not None
        readings.gpus = dcgm_gpus(self.prometheus.query(labels_query(args.metric)))

    def _read_k8s(self, args: DriftArguments, readings: Readings) -> None:
        assert self.kubernetes is not None
        readings.labels = self.kubernetes.driver_versions(None)
        readings.operator = operator(self.kubernetes, self.clusterpolicy)

    def _read_slurm(self, args: DriftArguments, readings: Readings) -> None:
        assert self.slurm is not None
        readings.slurmctld, readings.slurmd = self.slurm.slurm_versions()


def _pool_nodes(pool: str, args: DriftArguments, readings: Readings) -> list[NodeVersions]:
    """The pool's nodes with what each source said of them, under the bot's names."""
    names = args.slurm_nodes if pool == "slurm" else args.kubernetes_nodes
    found = []
    for node in sorted(set(names)):
        gpus = (readings.gpus or {}).get(args.dcgm_names.get(node, node), [])
        label = (readings.labels or {}).get(args.kubernetes_names.get(node, node)) \
            if pool == "kubernetes" else None
        slurmd = (readings.slurmd or {}).get(args.slurm_names.get(node, node)) \
            if pool == "slurm" else None
        found.append(NodeVersions(node, pool, list(gpus), label, slurmd))
    return found


def _details(now: float, readings: Readings, pools: dict[str, list[NodeVersions]],
             findings: dict[str, list[Finding]]) -> dict[str, Any]:
    op = readings.operator
    return {
        "at": datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
        "nodes_checked": {pool: len(nodes) for pool, nodes in pools.items()},
        "drift": {pool: counts(found) for pool, found in findings.items()},
        "findings": [{"pool": f.pool, "node": f.node, "kind": f.kind, "text": f.text,
                      "fix": f.fix} for found in findings.values() for f in found],
        "sources": {source: source not in readings.problems
                    for source in ("prometheus", "kubernetes", "slurm")},
        "problems": dict(readings.problems),
        "versions": {"slurmctld": readings.slurmctld,
                     "gpu_operator": op.version if op else None,
                     "clusterpolicy_driver": op.driver if op else None},
    }


def _render(args: DriftArguments, now: float, readings: Readings,
            pools: dict[str, list[NodeVersions]], pins: dict[str, Pin],
            findings: dict[str, list[Finding]]) -> list[str]:
    lines = [f"Drift report, {datetime.fromtimestamp(now, UTC):%Y-%m-%d %H:%M} UTC"]
    lines += _versions(readings, pins)
    for pool in POOLS:
        lines += _pool_text(pool, args, readings, pools[pool], pins[pool], findings[pool])
    return lines


def _versions(readings: Readings, pins: dict[str, Pin]) -> list[str]:
    lines = []
    for pool in POOLS:
        pin = pins[pool]
        floor = f"; CUDA {pin.cuda} needs {pin.floor} or newer" if pin.floor else ""
        pinned = pin.pinned or f"none (drivers.pools.{pool}.pinned)"
        lines.append(f"{pool} pool: pinned driver {pinned}{floor}")
    for source, why in sorted(readings.problems.items()):
        lines.append(f"unknown: {source} {why}")
    op = readings.operator
    if "kubernetes" not in readings.problems:
        lines.append("GPU Operator: " + (
            f"{op.version or 'release unknown (no app.kubernetes.io/version label)'}, "
            f"ClusterPolicy driver {op.driver or 'unset'}, state {op.state or 'unknown'}"
            if op else "no ClusterPolicy found"))
    if "slurm" not in readings.problems:
        lines.append(f"Slurm: slurmctld {readings.slurmctld or 'unknown'}")
    return lines


def _pool_text(pool: str, args: DriftArguments, readings: Readings, nodes: list[NodeVersions],
               pin: Pin, found: list[Finding]) -> list[str]:
    lines = ["", f"{pool.capitalize()} pool ({_many(len(nodes), 'node')}):"]
    if not nodes:
        return [*lines, "  no nodes"]
    lines += _tallies(nodes)
    lines += _operator_line(pool, readings, pin)
    drift = [f for f in found if f.kind != "unknown"]
    unknown = sorted(f.node for f in found if f.kind == "unknown")
    if not drift:
        lines.append("  out of line: none")
    else:
        lines.append(f"  out of line ({_many(len({f.node for f in drift}), 'node')}):")
    for finding in drift[: args.top]:
        lines += [f"    {finding.node}: {finding.text}", f"      fix: {finding.fix}"]
    if len(drift) > args.top:
        lines.append(f"    ... and {len(drift) - args.top} more (runbook show ID: details)")
    wrong = sorted({f.node for f in drift if f.kind.startswith("driver")})
    if pool == "slurm" and len(wrong) > 1:
        lines.append(f"  all Slurm drivers at once: {driver_fix(pool, wrong, pin)}")
    if unknown:
        lines.append(f"  unknown (no driver reading): {', '.join(unknown[:50])}")
    return lines


def _tallies(nodes: list[NodeVersions]) -> list[str]:
    """How many nodes run each driver, GPUs each VBIOS; slurmd releases."""
    drivers: dict[str, int] = {}
    vbios: dict[str, int] = {}
    slurmd: dict[str, int] = {}
    for node in nodes:
        for driver in node.drivers:
            drivers[driver] = drivers.get(driver, 0) + 1
        for gpu in node.gpus:
            if gpu.vbios:
                vbios[gpu.vbios] = vbios.get(gpu.vbios, 0) + 1
        if node.slurmd:
            slurmd[node.slurmd] = slurmd.get(node.slurmd, 0) + 1
    lines = []
    for title, table, unit in (("drivers", drivers, "node"), ("VBIOS", vbios, "GPU"),
                               ("slurmd", slurmd, "node")):
        if table:
            shown = ", ".join(f"{value} on {_many(count, unit)}" for value, count in
                              sorted(table.items(), key=lambda item: -item[1]))
            lines.append(f"  {title}: {shown}")
    return lines


def _operator_line(pool: str, readings: Readings, pin: Pin) -> list[str]:
    """The Kubernetes pool: the driver the ClusterPolicy installs against the pinned one."""
    op = readings.operator
    if pool != "kubernetes" or op is None or not op.driver or not pin.pinned \
            or op.driver == pin.pinned:
        return []
    return [f"  the ClusterPolicy installs driver {op.driver}, not the pinned {pin.pinned}",
            f"    fix: {driver_fix(pool, [], pin)}"]


def _many(count: int, unit: str) -> str:
    return f"{count} {unit}" if count == 1 else f"{count} {unit}s"
