"""``report.fairshare``: GPU-hours, jobs and queue wait per account and QOS against the limits.

Reads only: Slurm (sacct, sshare, sacctmgr, ``adapters.slurm.fairshare``) and, when Kueue is
installed, its ClusterQueues. A part whose source does not answer says so in the text; the
chart (a PNG, this period against the one before) is written under ``chart_dir``.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from adapters.actions import ActionContext, ActionError, ActionResult, Seconds, StrictArguments
from adapters.kubernetes.backend import KubernetesBackend, KubernetesNotFound
from adapters.registry import Adapter, Built
from adapters.slurm import fairshare as slurm
from adapters.slurm.config import SlurmConfig
from adapters.slurm.transports.cli import CliBackend
from kit.durations import format_duration

KUEUE = ("kueue.x-k8s.io", "v1beta1", "clusterqueues")
CHART_DIR_ENV = "RUNBOOK_REPORT_DIR"  # where charts go when chart_dir is not given
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class FairshareArguments(StrictArguments):
    period: Seconds = Field(default=30 * 86400.0, description="how far back, e.g. 30d")
    top: int = Field(default=5, ge=1, le=100, description="accounts that wait most, at most")
    chart_dir: str = Field(default="", description="where the PNG goes ($RUNBOOK_REPORT_DIR "
                                                   "or the temporary directory when empty)")


def chart_dir(args: FairshareArguments) -> Path:
    given = args.chart_dir or os.environ.get(CHART_DIR_ENV, "")
    return Path(given) if given else Path(tempfile.gettempdir()) / "gpu-runbook-bot-reports"


def draw_chart(now: Mapping[str, float], before: Mapping[str, float], title: str) -> bytes:
    """A bar chart of GPU-hours per account, this period beside the one before (PNG bytes)."""
    import matplotlib  # lazily: the CLI's cold start never pays for it

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    accounts = sorted(set(now) | set(before), key=lambda a: (-now.get(a, 0.0), a))
    figure = Figure(figsize=(max(4.0, 1.2 * len(accounts) + 2), 3.5), dpi=100)
    axes = figure.subplots()
    places = list(range(len(accounts)))
    axes.bar([p - 0.2 for p in places], [before.get(a, 0.0) for a in accounts], 0.4,
             label="period before", color="#b0b0b0")
    axes.bar([p + 0.2 for p in places], [now.get(a, 0.0) for a in accounts], 0.4,
             label="this period", color="#2f6db5")
    axes.set_xticks(places, [a or "(none)" for a in accounts])
    axes.set_ylabel("GPU-hours")
    axes.set_title(title)
    axes.legend()
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png")
    return out.getvalue()


def _wait(seconds: float) -> str:
    return format_duration(round(seconds)) if seconds >= 1 else f"{seconds:.1f}s"


def _percent(value: float | None) -> str:
    return "?" if value is None else f"{value * 100:.1f}%"


def _quantity(value: Any) -> float:
    """A Kubernetes quantity (8, "8", "500m", "16Gi", "1k") as a number."""
    text = str(value).strip()
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2.0**10,
             "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * units[suffix]
    return float(text) if text else 0.0


def _amounts(entries: Any) -> dict[tuple[str, str], str]:
    """status.flavorsUsage / flavorsReservation: (flavor, resource) -> total, as written."""
    found = {}
    for flavor in entries or []:
        for res in flavor.get("resources") or []:
            found[(str(flavor.get("name")), str(res.get("name")))] = str(res.get("total", 0))
    return found


def kueue_lines(queue: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """One ClusterQueue: quota, usage and reservation per flavor and resource."""
    name = str((queue.get("metadata") or {}).get("name", "?"))
    spec, status = queue.get("spec") or {}, queue.get("status") or {}
    used, reserved = _amounts(status.get("flavorsUsage")), _amounts(
        status.get("flavorsReservation"))
    head = f"  {name}" + (f" (cohort {spec['cohort']})" if spec.get("cohort") else "")
    head += (f": {status.get('admittedWorkloads', 0)} admitted, "
             f"{status.get('pendingWorkloads', 0)} pending workloads")
    lines, rows = [head], []
    for group in spec.get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for res in flavor.get("resources") or []:
                key = (str(flavor.get("name")), str(res.get("name")))
                quota_text = str(res.get("nominalQuota", 0))
                quota, taken = _quantity(quota_text), _quantity(used.get(key, "0"))
                share = f" ({taken / quota * 100:.0f}%)" if quota else ""
                lines.append(f"    {key[1]} in flavor {key[0]}: quota {quota_text}, used "
                             f"{used.get(key, '0')}{share}, reserved {reserved.get(key, '0')}")
                rows.append({"flavor": key[0], "resource": key[1], "quota": quota, "used": taken,
                             "reserved": _quantity(reserved.get(key, "0"))})
    return lines, {"name": name, "cohort": spec.get("cohort"), "resources": rows,
                   "pending": status.get("pendingWorkloads", 0),
                   "admitted": status.get("admittedWorkloads", 0)}


class FairshareReviewAction:
    """GPU-hours, jobs and queue wait per account and QOS for the period, with the trend
    against the period before (one sacct over both); the accounts that wait most; each QOS
    with a GrpTRES gres/gpu limit against its peak and its GPU-hours; shares against usage
    (sshare); Kueue's ClusterQueues (quota, usage, reservation) when Kueue is installed.
    The summary is the whole report; the step fails only when Slurm answered nothing at all.
    """

    name: ClassVar[str] = "report.fairshare"
    Arguments: ClassVar[type[StrictArguments]] = FairshareArguments

    def __init__(self, source: slurm.FairshareSource, kubernetes: KubernetesBackend | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.source = source
        self.kubernetes = kubernetes
        self._clock = clock

    def plan(self, args: FairshareArguments) -> list[str]:
        period = format_duration(args.period)
        lines = [
            f"sacct --parsable2 --allusers -X over the last {period} and the {period} before: "
            "GPU-hours (AllocTRES gres/gpu x run time), jobs and queue wait per account and QOS",
            "sacctmgr show qos: GrpTRES gres/gpu limits; sshare --all: shares and usage",
        ]
        if self.kubernetes is not None:
            lines.append("GET /apis/kueue.x-k8s.io/v1beta1/clusterqueues: quota and usage "
                         "(when Kueue is installed)")
        else:
            lines.append("Kueue: skipped (no kubernetes section configured)")
        lines.append(f"chart: a PNG of GPU-hours per account under {chart_dir(args)}")
        return [*lines, "reads only; changes nothing"]

    def run(self, args: FairshareArguments, ctx: ActionContext) -> ActionResult:
        end = self._clock()
        start, before = end - args.period, end - 2 * args.period
        details: dict[str, Any] = {"period_start": _iso(start), "period_end": _iso(end),
                                   "previous_start": _iso(before)}
        problems: list[str] = []
        title = (f"Fair-share review, {_day(start)} to {_day(end)} UTC "
                 f"({format_duration(args.period)}), against the {format_duration(args.period)} "
                 "before")
        jobs = self._read("accounting", lambda: slurm.parse_sacct(self.source.sacct(
            datetime.fromtimestamp(before, UTC), datetime.fromtimestamp(end, UTC))), problems)
        ctx.checkpoint("reading Slurm")
        qos = self._read("qos", lambda: slurm.parse_qos(self.source.qos()), problems)
        shares = self._read("shares", lambda: slurm.parse_sshare(self.source.sshare()), problems)
        if jobs is None and qos is None and shares is None:
            raise ActionError("the fair-share review could not read anything from Slurm: "
                              + "; ".join(problems))
        sections = [title]
        sections += self._accounts(jobs, start, end, before, details, problems)
        sections += self._waiters(jobs, start, end, args.top, details)
        sections += self._limits(qos, jobs, start, end, details, problems)
        sections += self._shares(shares, details, problems)
        ctx.checkpoint("reading Kueue")
        sections += self._kueue(details, problems)
        sections += self._chart(args, ctx, jobs, start, end, before, title, details, problems)
        details["problems"] = problems
        return ActionResult(summary="\n".join(sections), details=details, changed=False)

    @staticmethod
    def _read(part: str, read: Callable[[], Any], problems: list[str]) -> Any:
        try:
            return read()
        except ActionError as exc:
            problems.append(f"{part}: {exc}")
            return None

    # --- parts ----------------------------------------------------------------------------

    def _accounts(self, jobs: list[slurm.JobRecord] | None, start: float, end: float,
                  before: float, details: dict[str, Any], problems: list[str]) -> list[str]:
        lines = ["", "GPU-hours, jobs and queue wait per account and QOS (sacct):"]
        if jobs is None:
            why = _why(problems, "accounting")
            return [*lines, f"  unknown: Slurm accounting did not answer ({why})"]
        now = slurm.usage(jobs, start, end, by_qos=True)
        then = slurm.usage(jobs, before, start, by_qos=True)
        rows = sorted(set(now) | set(then),
                      key=lambda k: (-now.get(k, slurm.Usage(*k)).gpu_hours, k))
        details["accounts"] = [_usage_row(now.get(k, slurm.Usage(*k)),
                                          then.get(k, slurm.Usage(*k))) for k in rows]
        if not rows:
            return [*lines, "  no jobs in either period"]
        width = max(7, *(len(k[0] or "(none)") for k in rows))
        qwidth = max(3, *(len(k[1]) for k in rows))
        lines.append(f"  {'account':<{width}}  {'QOS':<{qwidth}}  {'GPU-hours':>9}  "
                     f"{'before':>8}  {'trend':>6}  {'jobs':>5}  {'mean wait':>9}  "
                     f"{'max wait':>9}  pending")
        for key in rows:
            u, p = now.get(key, slurm.Usage(*key)), then.get(key, slurm.Usage(*key))
            lines.append(f"  {key[0] or '(none)':<{width}}  {key[1]:<{qwidth}}  "
                         f"{u.gpu_hours:>9.2f}  {p.gpu_hours:>8.2f}  "
                         f"{slurm.trend(u.gpu_hours, p.gpu_hours):>6}  {u.jobs:>5}  "
                         f"{_wait(u.mean_wait):>9}  {_wait(u.max_wait):>9}  {u.pending}")
        total, previous = sum(u.gpu_hours for u in now.values()), sum(
            u.gpu_hours for u in then.values())
        details["total_gpu_hours"], details["previous_gpu_hours"] = (round(total, 6),
                                                                     round(previous, 6))
        lines.append(f"  total: {total:.2f} GPU-hours, {previous:.2f} the period before "
                     f"({slurm.trend(total, previous)})")
        return lines

    def _waiters(self, jobs: list[slurm.JobRecord] | None, start: float, end: float,
                 top: int, details: dict[str, Any]) -> list[str]:
        lines = ["", "Accounts that wait most (mean queue wait of jobs started in the period):"]
        if jobs is None:
            return [*lines, "  unknown: Slurm accounting did not answer"]
        accounts = [u for u in slurm.usage(jobs, start, end).values() if u.waits or u.pending]
        accounts.sort(key=lambda u: (-u.mean_wait, -u.max_wait, u.account))
        details["waiters"] = [{"account": u.account, "mean_wait_seconds": round(u.mean_wait, 1),
                               "max_wait_seconds": round(u.max_wait, 1), "started": len(u.waits),
                               "pending": u.pending} for u in accounts[:top]]
        if not accounts:
            return [*lines, "  none: no job started or waited in the period"]
        for rank, u in enumerate(accounts[:top], 1):
            pending = f", {u.pending} still pending" if u.pending else ""
            lines.append(f"  {rank}. {u.account or '(none)'}: mean {_wait(u.mean_wait)}, max "
                         f"{_wait(u.max_wait)} over {len(u.waits)} started jobs{pending}")
        return lines

    def _limits(self, qos: list[slurm.Qos] | None, jobs: list[slurm.JobRecord] | None,
                start: float, end: float, details: dict[str, Any],
                problems: list[str]) -> list[str]:
        lines = ["", "QOS GPU limits (sacctmgr show qos, GrpTRES gres/gpu):"]
        if qos is None:
            return [*lines, f"  unknown: sacctmgr did not answer ({_why(problems, 'qos')})"]
        peaks = slurm.peak_gpus(jobs or [], start, end)
        used = slurm.usage(jobs or [], start, end, by_qos=True)
        hours = (end - start) / 3600
        details["qos"] = []
        for item in sorted(qos, key=lambda q: q.name):
            limit = item.gpu_limit
            spent = sum(u.gpu_hours for (_, name), u in used.items() if name == item.name)
            peak = peaks.get(item.name, 0)
            details["qos"].append({"qos": item.name, "gpu_limit": limit, "peak_gpus": peak,
                                   "gpu_hours": round(spent, 6), "grp_tres": item.grp_tres})
            if limit is None:
                lines.append(f"  {item.name}: no GPU limit (peak {peak} GPUs at once, "
                             f"{spent:.2f} GPU-hours)")
                continue
            at = "AT THE LIMIT" if peak >= limit else f"{peak / limit * 100:.0f}% of it"
            lines.append(f"  {item.name}: GrpTRES gres/gpu={limit}: peak {peak} GPUs at once "
                         f"({at}), {spent:.2f} of {limit * hours:.0f} possible GPU-hours "
                         f"({spent / (limit * hours) * 100:.1f}%)")
        if jobs is None:
            lines.append("  (peaks and GPU-hours unknown: Slurm accounting did not answer)")
        return lines

    def _shares(self, shares: list[slurm.Share] | None, details: dict[str, Any],
                problems: list[str]) -> list[str]:
        lines = ["", "Shares against usage (sshare):"]
        if shares is None:
            return [*lines, f"  unknown: sshare did not answer ({_why(problems, 'shares')})"]
        rows = [s for s in shares if s.account != "root"]
        details["shares"] = [{"account": s.account, "raw_shares": s.raw_shares,
                              "norm_shares": s.norm_shares, "effective_usage": s.effective_usage,
                              "fairshare": s.fairshare} for s in rows]
        if not rows:
            return [*lines, "  no accounts"]
        for s in rows:
            verdict = ""
            if s.norm_shares is not None and s.effective_usage is not None:
                verdict = ("over its share" if s.effective_usage > s.norm_shares
                           else "within its share")
            factor = "" if s.fairshare is None else f", fair-share factor {s.fairshare:.3f}"
            lines.append(f"  {s.account}: share {_percent(s.norm_shares)} (raw {s.raw_shares}), "
                         f"usage {_percent(s.effective_usage)}{factor}"
                         + (f": {verdict}" if verdict else ""))
        return lines

    def _kueue(self, details: dict[str, Any], problems: list[str]) -> list[str]:
        lines = ["", "Kubernetes pool (Kueue ClusterQueues):"]
        if self.kubernetes is None:
            details["kueue"] = None
            return [*lines, "  unknown: no kubernetes section is configured"]
        try:
            queues = self.kubernetes.list_custom_objects(*KUEUE)
        except KubernetesNotFound:
            details["kueue"] = "not installed"
            return [*lines, "  Kueue is not installed (the API server serves no "
                            "clusterqueues.kueue.x-k8s.io)"]
        except ActionError as exc:
            problems.append(f"kueue: {exc}")
            return [*lines, f"  unknown: the Kubernetes API did not answer ({exc})"]
        details["kueue"] = []
        if not queues:
            return [*lines, "  no ClusterQueue"]
        for queue in sorted(queues, key=lambda q: str((q.get("metadata") or {}).get("name"))):
            text, row = kueue_lines(queue)
            lines += text
            details["kueue"].append(row)
        return lines

    def _chart(self, args: FairshareArguments, ctx: ActionContext,
               jobs: list[slurm.JobRecord] | None, start: float, end: float, before: float,
               title: str, details: dict[str, Any], problems: list[str]) -> list[str]:
        if jobs is None:
            return ["", "Chart: none (Slurm accounting did not answer)"]
        now = {k[0]: u.gpu_hours for k, u in slurm.usage(jobs, start, end).items()}
        then = {k[0]: u.gpu_hours for k, u in slurm.usage(jobs, before, start).items()}
        path = chart_dir(args) / f"fairshare-review-{ctx.execution_id}.png"
        try:
            png = draw_chart(now, then, title.split(",")[0] + ": GPU-hours per account")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(png)
        except (ImportError, OSError, ValueError) as exc:
            problems.append(f"chart: {exc}")
            return ["", f"Chart: not written ({type(exc).__name__}: {exc})"]
        details["chart"] = {"path": str(path), "sha256": hashlib.sha256(png).hexdigest(),
                            "bytes": len(png), "media_type": "image/png"}
        return ["", f"Chart (GPU-hours per account, this period and the one before): {path}"]


def _usage_row(now: slurm.Usage, before: slurm.Usage) -> dict[str, Any]:
    return {"account": now.account, "qos": now.qos, "gpu_hours": round(now.gpu_hours, 6),
            "previous_gpu_hours": round(before.gpu_hours, 6), "jobs": now.jobs,
            "previous_jobs": before.jobs, "mean_wait_seconds": round(now.mean_wait, 1),
            "max_wait_seconds": round(now.max_wait, 1), "pending": now.pending,
            "trend": slurm.trend(now.gpu_hours, before.gpu_hours)}


def _why(problems: list[str], part: str) -> str:
    return next((p.split(": ", 1)[1] for p in problems if p.startswith(f"{part}: ")),
                "no answer")


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


def _day(epoch: float) -> str:
    return f"{datetime.fromtimestamp(epoch, UTC):%Y-%m-%d %H:%M}"


ACTION_CLASSES: tuple[type[FairshareReviewAction], ...] = (FairshareReviewAction,)


def _build(config: SlurmConfig, backends: Mapping[str, Any]) -> Built:
    source = slurm.CliFairshareSource(CliBackend(config))
    return Built([FairshareReviewAction(source, backends.get("kubernetes"))])


# Enabled by the Slurm section; reads Kueue through the Kubernetes backend when configured.
ADAPTER = Adapter("fairshare", "slurm", SlurmConfig, ACTION_CLASSES, _build,
                  uses=("slurm", "kubernetes"))

__all__ = [
    "ACTION_CLASSES",
    "PNG_SIGNATURE",
    "FairshareArguments",
    "FairshareReviewAction",
    "draw_chart",
    "kueue_lines",
]
