"""The capacity guard (``capacity:`` checks): taking a node out must leave enough free GPUs
in its pool.

It only reads Slurm and Kubernetes, never changes them, and fails closed: a pool it cannot
count fails the check. Break-glass is decided by its callers, not here.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from adapters.actions import ActionError
from adapters.kubernetes.backend import KubernetesBackend
from adapters.slurm import hostlist
from adapters.slurm.backend import SlurmBackend
from bot.config import PoolFloors
from bot.config_remediation import PoolsConfig
from bot.execution.checks.core import Outcome
from bot.execution.planning import PlannedCheck
from bot.runbooks.inventory import serves_kubernetes
from bot.runbooks.params import Inventory


class CapacityEvaluator:
    """Evaluates ``capacity: {pool_of: "{{ node }}", min_free_gpus_after: 16}`` (``pool_of``
    may be a hostlist: every pool the set touches must keep its floor once all the set's
    nodes in it are out, their free GPUs summed), optionally
    with ``pool: slurm|kubernetes`` (only that pool, whichever the inventory says the node
    serves: handoff-node names the pool that gives the node away).

    Free GPUs now: Slurm, GRES total minus used on nodes in service (responding, not
    drained, not down); Kubernetes, allocatable ``nvidia.com/gpu`` minus the requests of
    the pods on schedulable Ready nodes. After: minus what the node itself has free. A node
    in both pools must keep both above the floor. The guard runs when the plan is made (a
    request that breaks it is refused with the numbers, unless the requester asks for
    break-glass, which costs one extra approval) and again as a pre-check.

    The site floor (``guards.min_free_gpus`` in the configuration, per pool) is under every
    capacity check: the floor checked is max(the runbook's, the site's). Break-glass
    overrides the runbook's floor, never the site's: an outcome under the site floor says
    so (``below_site_floor`` in its extra) and is not overridden.
    """

    def __init__(self, inventory: Inventory | Callable[[], Inventory],
                 slurm: SlurmBackend | None = None,
                 kubernetes: KubernetesBackend | None = None,
                 kubernetes_selector: str | None = None,
                 site_floors: PoolFloors | None = None,
                 pools: PoolsConfig | None = None) -> None:
        # a long-running bot's inventory is listed again as pools change (LiveInventory)
        self._inventory_of = inventory if callable(inventory) else (lambda: inventory)
        self._slurm = slurm
        self._kubernetes = kubernetes
        self._selector = kubernetes_selector
        self._label = (pools or PoolsConfig()).label  # a node labelled slurm serves Slurm
        floors = site_floors or PoolFloors()
        self._site = {"Slurm": floors.slurm, "Kubernetes": floors.kubernetes}

    def __call__(self, check: PlannedCheck, deadline: float) -> Outcome:
        spec: dict[str, Any] = dict(check.spec["capacity"])
        node = str(spec.get("pool_of", ""))
        try:
            members = hostlist.expand(node) if node else []
        except ValueError as exc:
            return Outcome(False, None, f"pool_of: {exc}")
        try:
            floor = int(spec.get("min_free_gpus_after", 0))
        except (TypeError, ValueError):
            return Outcome(False, None, "min_free_gpus_after must be a whole number")
        wanted = str(spec.get("pool") or "")
        if wanted not in ("", "slurm", "kubernetes"):
            return Outcome(False, None, f"pool must be slurm or kubernetes, not {wanted!r}")
        try:
            pools = self._pools(members, wanted, check, deadline)
        except ActionError as exc:
            return Outcome(False, None, f"cannot count free GPUs: {exc}")
        if not pools:
            where = (f"the {wanted} pool: {wanted} is not configured" if wanted
                     else "no pool the bot can count GPUs of")
            return Outcome(False, None, f"{node} is in {where}")
        lowest = min(after for _, _, after, _ in pools)
        details, passed, below_site = [], True, False
        for name, now, after, out in pools:
            site = self._site[name]
            pool_floor = max(floor, site)
            passed = passed and after >= pool_floor
            below_site = below_site or after < site
            whose = (f", the site floor (guards.min_free_gpus.{name.lower()}); the runbook "
                     f"asks for {floor}" if site > floor else "")
            details.append(f"{name} pool: {now} free GPUs now, {after} after taking {out} "
                           f"out (floor {pool_floor}{whose})")
        return Outcome(passed, lowest, "; ".join(details),
                       {"pools": {name: {"now": now, "after": after, "site_floor": self._site[name]}
                                  for name, now, after, _ in pools}, "floor": floor,
                        "below_site_floor": below_site})

    def _pools(self, nodes: list[str], wanted: str, check: PlannedCheck,
               deadline: float) -> list[tuple[str, int, int, str]]:
        """(pool, free now, free after, the nodes taken out) for each pool ``nodes``
        serve, or for ``wanted`` alone (handoff-node names the pool that gives the node)."""
        pools = []
        inventory = self._inventory_of()
        names = inventory.names
        in_slurm = [n for n in nodes if (n in inventory.slurm if not wanted else
                                         wanted == "slurm")]
        in_k8s = [n for n in nodes if (n in inventory.kubernetes if not wanted else
                                       wanted == "kubernetes")]
        if in_slurm and self._slurm is not None:
            mapped = [names.get("slurm", {}).get(n, n) for n in in_slurm]
            pools.append(("Slurm", *self._slurm_free(mapped), _shown(in_slurm)))
        if in_k8s and self._kubernetes is not None:
            # an API server that does not answer fails the check within its timeout
            until = min(deadline, time.monotonic() + check.timeout_seconds)
            mapped = [names.get("kubernetes", {}).get(n, n) for n in in_k8s]
            with _within(self._kubernetes, until):
                pools.append(("Kubernetes", *self._k8s_free(mapped), _shown(in_k8s)))
        return pools

    def _slurm_free(self, out: list[str]) -> tuple[int, int]:
        assert self._slurm is not None
        free: dict[str, int] = {}
        for info in self._slurm.nodes(None, with_jobs=False):
            if info.responding and "DRAIN" not in info.flags and info.state != "down":
                free[info.name] = max(0, info.gpus_total - info.gpus_used)
        now = sum(free.values())
        return now, now - sum(free.get(name, 0) for name in set(out))

    def _k8s_free(self, out: list[str]) -> tuple[int, int]:
        assert self._kubernetes is not None
        requested: dict[str, int] = defaultdict(int)
        for pod in self._kubernetes.list_pods():
            if pod.node and not pod.deleting and pod.phase not in ("Succeeded", "Failed"):
                requested[pod.node] += pod.gpus_requested
        free = {n.name: max(0, n.gpus_allocatable - requested[n.name])
                for n in self._kubernetes.list_nodes(self._selector)
                if n.ready and not n.unschedulable and serves_kubernetes(n.labels.get(self._label))}
        now = sum(free.values())
        return now, now - sum(free.get(name, 0) for name in set(out))


def _shown(nodes: list[str]) -> str:
    """One node by its name, a set as a hostlist with its size."""
    return nodes[0] if len(nodes) == 1 else f"{hostlist.compress(nodes)} ({len(nodes)} nodes)"


def _within(backend: Any, until: float) -> AbstractContextManager[None]:
    """The backend's requests end by ``until`` where it can bound them (``deadline``)."""
    deadline = getattr(backend, "deadline", None)
    return deadline(until) if deadline is not None else nullcontext()
