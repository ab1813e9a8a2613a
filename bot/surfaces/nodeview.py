"""``runbook node NAME...``: one node as Slurm, Kubernetes and the GPUs see it.

Slurm: state, flags, reason (who, when), GPUs used, jobs. Kubernetes: cordon,
readiness, taints, pods. Per GPU: last XID, temperature, ECC double-bit errors,
utilisation and driver version, with ONE Prometheus query per metric for all GPUs
of all the nodes asked about. Then the node's open and recent executions. A
system that does not answer is shown as such; the rest of the view still comes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from adapters.actions import ActionError
from bot.execution import executions
from bot.service import Service

GPU_METRICS = {
    "xid": "DCGM_FI_DEV_XID_ERRORS",
    "temp": "DCGM_FI_DEV_GPU_TEMP",
    "ecc_dbe": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "util": "DCGM_FI_DEV_GPU_UTIL",
}


@dataclass
class NodeView:
    name: str
    slurm: dict[str, Any] | None = None
    kubernetes: dict[str, Any] | None = None
    gpus: dict[str, dict[str, Any]] = field(default_factory=dict)  # gpu index -> values
    executions: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def build(bot: Service, names: list[str]) -> list[NodeView]:
    views = {name: NodeView(name) for name in names}
    _slurm(bot, views)
    _kubernetes(bot, views)
    _gpus(bot, views)
    _executions(bot, views)
    return list(views.values())


def _slurm(bot: Service, views: dict[str, NodeView]) -> None:
    backend = bot.backends.get("slurm")
    wanted = {bot.inventory.facts()["slurm_name"][n]: n for n in views
              if n in bot.inventory.slurm}
    if backend is None or not wanted:
        return
    try:
        for info in backend.nodes(sorted(wanted)):
            views[wanted[info.name]].slurm = info.as_dict()
    except ActionError as exc:
        for name in wanted.values():
            views[name].problems.append(f"Slurm: {exc}")


def _kubernetes(bot: Service, views: dict[str, NodeView]) -> None:
    backend = bot.backends.get("kubernetes")
    wanted = {bot.inventory.facts()["kubernetes_name"][n]: n for n in views
              if n in bot.inventory.kubernetes}
    if backend is None or not wanted:
        return
    try:
        for k8s_name, name in wanted.items():
            node = backend.get_node(k8s_name)
            pods = backend.pods_on_node(k8s_name)
            views[name].kubernetes = {
                "cordoned": node.unschedulable, "ready": node.ready,
                "taints": [t.describe() for t in node.taints],
                "gpus_allocatable": node.gpus_allocatable,
                "pods": [p.describe() for p in pods],
            }
    except ActionError as exc:
        for name in wanted.values():
            views[name].problems.append(f"Kubernetes: {exc}")


def _gpus(bot: Service, views: dict[str, NodeView]) -> None:
    backend = bot.backends.get("prometheus")
    if backend is None:
        return
    from adapters.prometheus import escape_label_value

    dcgm = {bot.inventory.facts()["dcgm_name"][n]: n for n in views}
    pattern = "|".join(escape_label_value(h) for h in sorted(dcgm))
    for key, metric in GPU_METRICS.items():
        try:  # one query per metric for every GPU of every node asked about
            samples = backend.query(f'{metric}{{Hostname=~"{pattern}"}}')
        except ActionError as exc:
            for view in views.values():
                view.problems.append(f"Prometheus: {exc}")
            return
        for sample in samples:
            name = dcgm.get(sample.labels.get("Hostname", ""))
            if name is not None:
                gpu = views[name].gpus.setdefault(sample.labels.get("gpu", "?"), {})
                gpu[key] = sample.value
                gpu["driver"] = sample.labels.get("DCGM_FI_DRIVER_VERSION", "?")


def _executions(bot: Service, views: dict[str, NodeView]) -> None:
    """The last ten executions that locked each node (inside a hostlist too)."""
    with bot.db.connect() as conn:
        for name, view in views.items():
            view.executions = [{"id": ex.id, "runbook": ex.runbook, "state": ex.state,
                                "requested_at": ex.requested_at,
                                "requested_by": ex.requested_by}
                               for ex in executions.find(conn, node=name, limit=10)]


def text(view: NodeView) -> str:
    lines = [f"node {view.name}"]
    if view.slurm is not None:
        s = view.slurm
        flags = "+".join(sorted(s.get("flags", [])))
        jobs = s.get("jobs") or "-"
        lines.append(f"  Slurm: {s.get('state')}{'+' + flags if flags else ''}, GPUs "
                     f"{s.get('gpus_used')}/{s.get('gpus_total')} used, jobs {jobs}")
        if s.get("reason"):
            lines.append(f"    reason: {s['reason']} ({s.get('reason_user') or '?'}, "
                         f"{s.get('reason_time') or '?'})")
    if view.kubernetes is not None:
        k = view.kubernetes
        lines.append(f"  Kubernetes: {'cordoned' if k['cordoned'] else 'schedulable'}, "
                     f"{'Ready' if k['ready'] else 'NOT Ready'}, "
                     f"taints {', '.join(k['taints']) or '-'}, {len(k['pods'])} pods")
        lines += [f"    pod {p}" for p in k["pods"][:20]]
    if view.gpus:
        lines.append("  GPU  XID  temp  ECC-DBE  util  driver")
        for gpu in sorted(view.gpus, key=lambda g: (len(g), g)):
            v = view.gpus[gpu]
            lines.append(f"  {gpu:>3}  {_n(v.get('xid')):>3}  {_n(v.get('temp')):>4}  "
                         f"{_n(v.get('ecc_dbe')):>7}  {_n(v.get('util')):>4}  {v.get('driver')}")
    for ex in view.executions:
        lines.append(f"  execution {ex['id']}: {ex['runbook']} {ex['state']} "
                     f"({ex['requested_by']}, {ex['requested_at'][:19]})")
    lines += [f"  ! {p}" for p in view.problems]
    return "\n".join(lines)


def _n(value: Any) -> str:
    return "-" if value is None else f"{value:g}"
