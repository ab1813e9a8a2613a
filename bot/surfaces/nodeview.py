"""``runbook node NAME...``: one node as Slurm, Kubernetes and the GPUs see it.

The pool it serves now and its MIG layout. Slurm: state, flags, reason, GPUs used, jobs,
Gres. Kubernetes: cordon, readiness, taints, pods. Per GPU: last XID, temperature, ECC DBE,
utilisation and driver version, with ONE Prometheus query for the four metrics of all
GPUs of all the nodes asked about. Then the node's open and recent executions (one query for all
nodes). A system that does not answer is shown as such; the rest of the view still comes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from adapters.actions import ActionError
from bot.runbooks.inventory import serves_kubernetes, serves_slurm
from bot.runbooks.params import Inventory
from bot.store.words import State

if TYPE_CHECKING:
    from bot.config import Config
    from bot.store.db import Engine
    from bot.store.recent import SqliteFile

MIG_CONFIG, MIG_STATE = "nvidia.com/mig.config", "nvidia.com/mig.config.state"
MIG_PROFILE = re.compile(r"\b[1-7]g\.[0-9]+gb\b")
GPU_METRICS = {
    "xid": "DCGM_FI_DEV_XID_ERRORS",
    "temp": "DCGM_FI_DEV_GPU_TEMP",
    "ecc_dbe": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "util": "DCGM_FI_DEV_GPU_UTIL",
}
RECENT = 10  # executions shown per node
BULK = 8  # more Kubernetes nodes than this: list nodes and pods once for all


class NodeSources(Protocol):
    """What the view reads: a ``bot.service.Service`` or ``bot.surfaces.nodeparts.NodeParts``
    (``runbook node``, which builds no more than this)."""

    @property
    def config(self) -> Config: ...

    @property
    def db(self) -> Engine | SqliteFile: ...

    @property
    def backends(self) -> dict[str, Any]: ...

    @property
    def inventory(self) -> Inventory: ...


@dataclass
class NodeView:
    name: str
    slurm: dict[str, Any] | None = None
    kubernetes: dict[str, Any] | None = None
    gpus: dict[str, dict[str, Any]] = field(default_factory=dict)  # gpu index -> values
    executions: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    pools: list[str] = field(default_factory=list)  # the pools it serves now
    # its MIG layout: Kubernetes' mig.config label and state, Slurm's Gres
    mig: dict[str, str] = field(default_factory=dict)


def build(service: NodeSources, names: list[str]) -> list[NodeView]:
    views = {name: NodeView(name) for name in names}
    _slurm(service, views)
    _kubernetes(service, views)
    _gpus(service, views)
    _executions(service, views)
    for view in views.values():
        _pools(service, view)
    return list(views.values())


def _registered(service: NodeSources, system: str) -> frozenset[str]:
    """The nodes ``system`` knows, whichever pool they serve now (a hand-off node is in both)."""
    inventory = service.inventory
    return frozenset(getattr(inventory, f"in_{system}", getattr(inventory, system)))


def _pools(service: NodeSources, view: NodeView) -> None:
    """Which pools the node serves, from what Slurm and Kubernetes said just now (the
    inventory's rule: the drain reason, the pool label); the inventory when they did not."""
    found = []
    if view.slurm is not None:
        if view.slurm.get("serves_slurm"):
            found.append("slurm")
    elif view.name in service.inventory.slurm:
        found.append("slurm")
    if view.kubernetes is not None:
        if view.kubernetes.get("serves_kubernetes"):
            found.append("kubernetes")
    elif view.name in service.inventory.kubernetes:
        found.append("kubernetes")
    view.pools = found


def _slurm(service: NodeSources, views: dict[str, NodeView]) -> None:
    backend = service.backends.get("slurm")
    names, registered = service.inventory.facts()["slurm_name"], _registered(service, "slurm")
    wanted = {names[n]: n for n in views if n in registered}
    if backend is None or not wanted:
        return
    try:
        for info in backend.nodes(sorted(wanted)):
            views[wanted[info.name]].slurm = {
                **info.as_dict(), "gres": info.gres, "features": sorted(info.features),
                "serves_slurm": serves_slurm(info.reason if "DRAIN" in info.flags else None,
                                             service.config.pools)}
            if MIG_PROFILE.search(info.gres):  # gpu:3g.40gb:16: MIG devices
                views[wanted[info.name]].mig["slurm_gres"] = info.gres
    except ActionError as exc:
        for name in wanted.values():
            views[name].problems.append(f"Slurm: {exc}")


def _kubernetes(service: NodeSources, views: dict[str, NodeView]) -> None:
    backend = service.backends.get("kubernetes")
    names = service.inventory.facts()["kubernetes_name"]
    registered = _registered(service, "kubernetes")
    wanted = {names[n]: n for n in views if n in registered}
    if backend is None or not wanted:
        return
    label = service.config.pools.label
    try:
        for k8s_name, node, pods in _k8s_nodes(backend, list(wanted)):
            name = wanted[k8s_name]
            views[name].kubernetes = {
                "cordoned": node.unschedulable, "ready": node.ready,
                "taints": [t.describe() for t in node.taints],
                "gpus_allocatable": node.gpus_allocatable,
                "pods": [p.describe() for p in pods],
                "pool_label": node.labels.get(label),
                "serves_kubernetes": serves_kubernetes(node.labels.get(label)),
            }
            views[name].mig.update({key: node.labels[label] for key, label in
                                    (("config", MIG_CONFIG), ("state", MIG_STATE))
                                    if label in node.labels})
    except ActionError as exc:
        for name in wanted.values():
            views[name].problems.append(f"Kubernetes: {exc}")


def _k8s_nodes(backend: Any, names: list[str]) -> Iterator[tuple[str, Any, list[Any]]]:
    """Each node and the pods bound to it, node by node: two requests per node for a few
    nodes; for more, two in all (every node, every pod): a large view stays quick."""
    if len(names) <= BULK:
        for name in names:
            yield name, backend.get_node(name), backend.pods_on_node(name)
        return
    listed = {node.name: node for node in backend.list_nodes()}
    pods: dict[str, list[Any]] = {}
    for pod in backend.list_pods():
        if pod.node:
            pods.setdefault(pod.node, []).append(pod)
    for name in names:  # one gone since the inventory listed it: get_node says so
        yield name, listed[name] if name in listed else backend.get_node(name), pods.get(name, [])


def _gpus(service: NodeSources, views: dict[str, NodeView]) -> None:
    backend = service.backends.get("prometheus")
    if backend is None:
        return
    from adapters.prometheus.template import build as build_query

    names = service.inventory.facts()["dcgm_name"]
    dcgm = {names[n]: n for n in views}
    key_of = {metric: key for key, metric in GPU_METRICS.items()}
    try:  # ONE query: the four metrics of every GPU of every node asked about
        samples = backend.query(build_query(
            '{__name__=~"$metrics",Hostname=~"$hosts"}', metrics="|".join(key_of),
            hosts="|".join(re.escape(h) for h in sorted(dcgm))))  # names as regexes: escaped
    except ActionError as exc:
        for view in views.values():
            view.problems.append(f"Prometheus: {exc}")
        return
    rank = {metric: i for i, metric in enumerate(key_of)}  # metric by metric, as before
    for sample in sorted(samples, key=lambda s: rank.get(s.labels.get("__name__", ""), 0)):
        name = dcgm.get(sample.labels.get("Hostname", ""))
        key = key_of.get(sample.labels.get("__name__", ""))
        if name is not None and key is not None:
            gpu = views[name].gpus.setdefault(sample.labels.get("gpu", "?"), {})
            gpu[key] = sample.value
            gpu["driver"] = sample.labels.get("DCGM_FI_DRIVER_VERSION", "?")


def _executions(service: NodeSources, views: dict[str, NodeView]) -> None:
    """The last ten executions that locked each node (inside a hostlist too), newest first:
    one query for all the nodes (bot.store.recent), the plans not read."""
    from bot.store import recent

    for row in recent.by_node(service.db, list(views), RECENT):
        views[row["node"]].executions.append({
            "id": row["id"], "runbook": row["runbook"], "state": State(row["state"]),
            "requested_at": row["requested_at"], "requested_by": row["requested_by"],
            "to": (json.loads(row["params"]) or {}).get("to")})  # handoff-node's move


def text(view: NodeView) -> str:
    lines = [f"node {view.name}: serves {' and '.join(view.pools) or 'no pool'}"]
    if view.mig:
        lines.append("  MIG: " + _mig(view.mig))
    if view.slurm is not None:
        s = view.slurm
        flags = "+".join(sorted(s.get("flags", [])))
        jobs = s.get("jobs") or "-"
        gres = f", gres {s['gres']}" if s.get("gres") else ""
        lines.append(f"  Slurm: {s.get('state')}{'+' + flags if flags else ''}, GPUs "
                     f"{s.get('gpus_used')}/{s.get('gpus_total')} used, jobs {jobs}{gres}")
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
        moved = f" to={ex['to']}" if ex.get("to") else ""
        lines.append(f"  execution {ex['id']}: {ex['runbook']}{moved} {ex['state']} "
                     f"({ex['requested_by']}, {ex['requested_at'][:19]})")
    lines += [f"  ! {p}" for p in view.problems]
    return "\n".join(lines)


def _mig(mig: dict[str, str]) -> str:
    """``layout all-3g.40gb (success), Slurm gres gpu:3g.40gb:16``."""
    parts = []
    if "config" in mig or "state" in mig:
        state = f" ({mig['state']})" if "state" in mig else ""
        parts.append(f"layout {mig.get('config', '?')}{state}")
    if "slurm_gres" in mig:
        parts.append(f"Slurm gres {mig['slurm_gres']}")
    return ", ".join(parts)


def _n(value: Any) -> str:
    return "-" if value is None else f"{value:g}"
