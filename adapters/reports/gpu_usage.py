"""``report.gpu_usage``: what the GPUs did over the last period, as one text for people.

It only reads (Slurm and Prometheus); a part whose source does not answer says so in the
text rather than failing the whole report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Protocol

from pydantic import Field

from adapters.actions import ActionContext, ActionError, ActionResult, Seconds, StrictArguments
from adapters.prometheus.template import build
from adapters.registry import Adapter, Built
from adapters.slurm.backend import SlurmBackend
from adapters.slurm.config import SlurmConfig
from kit.durations import format_duration

UTIL_METRIC = "DCGM_FI_DEV_GPU_UTIL"
HOST_LABELS = ("Hostname", "hostname")  # dcgm-exporter: older and newer releases


class Querier(Protocol):
    """The part of the Prometheus backend the report uses (an instant query)."""

    def query(self, promql: str, at: datetime | float | None = None, *,
              timeout: float | None = None) -> list[Any]: ...


class GpuUsageArguments(StrictArguments):
    period: Seconds = Field(default=7 * 86400.0, description="how far back, e.g. 7d")
    idle_below: float = Field(default=5.0, ge=0, le=100, description="utilisation %, idle under")
    idle_for: Seconds = Field(default=3600.0, description="idle for all of this, e.g. 1h")
    drained_for: Seconds = Field(default=86400.0, description="report nodes drained longer")
    top: int = Field(default=20, ge=1, le=1000, description="lines per part at most")
    dcgm_names: dict[str, str] = Field(
        default_factory=dict, description="Slurm node name -> DCGM Hostname, where they differ")


def _promql_duration(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


class GpuUsageReportAction:
    """Three parts, each read from the system that knows it:

    - GPU-hours, jobs and mean queue wait per account for jobs in the period (Slurm
      accounting, ``sacct``, through the Slurm backend);
    - allocated-but-idle GPUs: nodes where Slurm has GPUs allocated while DCGM reports
      utilisation under ``idle_below`` percent on some of them for all of ``idle_for``
      (``max_over_time(DCGM_FI_DEV_GPU_UTIL[idle_for])`` per GPU). Slurm counts allocated
      GPUs per node, not which ones, so a node is reported when fewer of its GPUs are busy
      than Slurm has allocated, with the idle GPUs' indices as candidates;
    - nodes drained (or draining) for longer than ``drained_for``, with their reasons.

    The step fails only when Slurm answered nothing at all. The summary is the whole
    report, so it reaches the chat channel and the audit log keeps it.
    """

    name: ClassVar[str] = "report.gpu_usage"
    Arguments: ClassVar[type[StrictArguments]] = GpuUsageArguments

    def __init__(self, slurm: SlurmBackend, prometheus: Querier | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.slurm = slurm
        self.prometheus = prometheus
        self._clock = clock

    def _query(self, args: GpuUsageArguments) -> str:
        return build(f"max_over_time({UTIL_METRIC}[$window])",
                     window=_promql_duration(args.idle_for))

    def plan(self, args: GpuUsageArguments) -> list[str]:
        lines = [
            f"sacct --json --allusers -X for the last {format_duration(args.period)}: GPU-hours, "
            "jobs and mean queue wait per account",
            "sinfo --json: GPUs allocated per node; nodes drained longer than "
            f"{format_duration(args.drained_for)} with their reasons",
        ]
        if self.prometheus is not None:
            lines.append(f"PromQL {self._query(args)}: GPUs under {args.idle_below:g}% on "
                         "nodes with allocated GPUs")
        else:
            lines.append("allocated-but-idle GPUs: skipped (no prometheus section configured)")
        return [*lines, "reads only; changes nothing"]

    def run(self, args: GpuUsageArguments, ctx: ActionContext) -> ActionResult:
        now = self._clock()
        end = datetime.fromtimestamp(now, UTC)
        start = end - timedelta(seconds=args.period)
        details: dict[str, Any] = {"period_start": start.isoformat(timespec="seconds"),
                                   "period_end": end.isoformat(timespec="seconds")}
        problems: list[str] = []
        sections = [
            f"GPU usage report, {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC "
            f"({format_duration(args.period)})",
        ]
        sections += self._accounts(args, start, end, details, problems)
        nodes = self._nodes(problems)
        ctx.checkpoint("reading Slurm")
        sections += self._idle(args, nodes, details, problems)
        sections += self._drained(args, nodes, now, details, problems)
        details["problems"] = problems
        if nodes is None and any(p.startswith("accounting:") for p in problems):
            raise ActionError("the GPU usage report could not read anything: "
                              + "; ".join(problems))
        return ActionResult(summary="\n".join(sections), details=details, changed=False)

    # --- parts ------------------------------------------------------------------------

    def _accounts(self, args: GpuUsageArguments, start: datetime, end: datetime,
                  details: dict[str, Any], problems: list[str]) -> list[str]:
        lines = ["", "GPU-hours and queue wait per account (sacct):"]
        try:
            usage = self.slurm.accounting(start, end)  # aware: the backend converts
        except ActionError as exc:
            problems.append(f"accounting: {exc}")
            return [*lines, f"  unknown: Slurm accounting did not answer ({exc})"]
        usage = sorted(usage, key=lambda u: (-u.gpu_hours, u.account))
        details["accounts"] = [
            {"account": u.account, "gpu_hours": round(u.gpu_hours, 3), "jobs": u.jobs,
             "mean_queue_wait_seconds": round(u.mean_queue_wait_seconds, 1)} for u in usage]
        if not usage:
            return [*lines, "  no jobs in the period"]
        width = max(7, *(len(u.account or "(none)") for u in usage))
        lines.append(f"  {'account':<{width}}  {'GPU-hours':>10}  {'jobs':>6}  mean queue wait")
        for u in usage[: args.top]:
            lines.append(f"  {u.account or '(none)':<{width}}  {u.gpu_hours:>10.1f}  "
                         f"{u.jobs:>6}  {format_duration(u.mean_queue_wait_seconds)}")
        total = sum(u.gpu_hours for u in usage)
        lines.append(f"  {'total':<{width}}  {total:>10.1f}  {sum(u.jobs for u in usage):>6}")
        if len(usage) > args.top:
            lines.append(f"  ... and {len(usage) - args.top} more accounts")
        return lines

    def _nodes(self, problems: list[str]) -> list[Any] | None:
        try:
            return list(self.slurm.nodes(None, with_jobs=True))
        except ActionError as exc:
            problems.append(f"nodes: {exc}")
            return None

    def _idle(self, args: GpuUsageArguments, nodes: list[Any] | None, details: dict[str, Any],
              problems: list[str]) -> list[str]:
        title = (f"Allocated but idle GPUs (under {args.idle_below:g}% for "
                 f"{format_duration(args.idle_for)}):")
        lines = ["", title]
        if nodes is None:
            return [*lines, "  unknown: Slurm did not answer"]
        if self.prometheus is None:
            details["idle"] = None
            return [*lines, "  unknown: no prometheus section is configured"]
        query = self._query(args)
        try:
            samples = self.prometheus.query(query)
        except ActionError as exc:
            problems.append(f"utilisation: {exc}")
            return [*lines, f"  unknown: Prometheus did not answer ({exc})"]
        found, unknown = _idle_allocated(args, nodes, _utilisation(samples))
        details["idle"] = found
        details["no_telemetry"] = unknown
        details["idle_query"] = query
        if not found:
            lines.append("  none")
        for item in found[: args.top]:
            jobs = f", jobs {','.join(map(str, item['jobs']))}" if item["jobs"] else ""
            lines.append(f"  {item['node']}: {item['idle_allocated']} of {item['allocated']} "
                         f"allocated GPUs idle (GPUs under {args.idle_below:g}%: "
                         f"{','.join(item['idle_gpus'])}{jobs})")
        if len(found) > args.top:
            lines.append(f"  ... and {len(found) - args.top} more nodes")
        total = sum(item["idle_allocated"] for item in found)
        if found:
            lines.append(f"  total: {total} allocated GPUs idle on {len(found)} node(s)")
        if unknown:
            lines.append(f"  no DCGM telemetry (unknown, not idle): {', '.join(unknown[:20])}")
        return lines

    def _drained(self, args: GpuUsageArguments, nodes: list[Any] | None, now: float,
                 details: dict[str, Any], problems: list[str]) -> list[str]:
        lines = ["", f"Nodes drained for more than {format_duration(args.drained_for)}:"]
        if nodes is None:
            return [*lines, "  unknown: Slurm did not answer"]
        found = []
        for node in sorted(nodes, key=lambda n: n.reason_time or 0):
            if "DRAIN" not in node.flags:
                continue
            since = node.reason_time
            if since is None or now - since < args.drained_for:
                continue
            found.append({"node": node.name, "since": since, "for_seconds": now - since,
                          "reason": node.reason, "by": node.reason_user,
                          "state": "drained" if node.drained else "draining"})
        details["drained"] = found
        if not found:
            lines.append("  none")
        for item in found[: args.top]:
            by = f" by {item['by']}" if item["by"] else ""
            moment = datetime.fromtimestamp(item["since"], UTC)
            lasted = format_duration(item["for_seconds"])
            lines.append(f"  {item['node']}: {item['state']} for {lasted} "
                         f"(since {moment:%Y-%m-%d %H:%M} UTC{by}): "
                         f"\"{item['reason'] or 'no reason given'}\"")
        if len(found) > args.top:
            lines.append(f"  ... and {len(found) - args.top} more nodes")
        return lines


def _utilisation(samples: list[Any]) -> dict[str, dict[str, float]]:
    """DCGM host -> GPU index -> utilisation, from the samples of the idle query."""
    util: dict[str, dict[str, float]] = {}
    for sample in samples:
        labels: Mapping[str, str] = sample.labels
        host = next((labels[k] for k in HOST_LABELS if labels.get(k)), None)
        if host is not None:
            util.setdefault(host, {})[str(labels.get("gpu", "?"))] = float(sample.value)
    return util


def _idle_allocated(args: GpuUsageArguments, nodes: list[Any],
                    util: dict[str, dict[str, float]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Nodes with fewer busy GPUs than Slurm allocated there, and nodes without telemetry."""
    found: list[dict[str, Any]] = []
    unknown: list[str] = []
    for node in sorted(nodes, key=lambda n: n.name):
        if node.gpus_used <= 0:
            continue
        gpus = util.get(args.dcgm_names.get(node.name, node.name))
        if not gpus:
            unknown.append(node.name)
            continue
        idle = sorted((g for g, v in gpus.items() if v < args.idle_below), key=_gpu_order)
        busy = len(gpus) - len(idle)
        idle_allocated = min(len(idle), max(0, node.gpus_used - busy))
        if idle_allocated:
            found.append({"node": node.name, "allocated": node.gpus_used,
                          "idle_allocated": idle_allocated, "idle_gpus": idle,
                          "jobs": list(node.jobs)})
    return found, unknown


def _gpu_order(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)


ACTION_CLASSES: tuple[type[GpuUsageReportAction], ...] = (GpuUsageReportAction,)

__all__ = ["ACTION_CLASSES", "GpuUsageArguments", "GpuUsageReportAction", "Querier"]


def _build(config: Any, backends: Mapping[str, Any]) -> Built:
    return Built([GpuUsageReportAction(backends["slurm"], backends.get("prometheus"))])


# Enabled by the Slurm section; uses Prometheus for the idle-GPU part when configured.
ADAPTER = Adapter("reports", "slurm", SlurmConfig, ACTION_CLASSES, _build,
                  uses=("slurm", "prometheus"))
