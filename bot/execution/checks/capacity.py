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
from dataclasses import dataclass
from typing import Any

from adapters.actions import ActionError
from adapters.kubernetes.backend import KubernetesBackend
from adapters.slurm.backend import NodeInfo, SlurmBackend
from bot.config import PoolFloors
from bot.config.remediation import PoolsConfig
from bot.execution.checks.core import Outcome
from bot.execution.planning import PlannedCheck
from bot.runbooks.inventory import serves_kubernetes
from bot.runbooks.params import Inventory
from kit import hostlist


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
        try:
            ask = _Ask.read(spec, self._inventory_of())
            pools = self._pools(ask, check, deadline)
        except ValueError as exc:
            return Outcome(False, None, str(exc))
        except ActionError as exc:
            return Outcome(False, None, f"cannot count free GPUs: {exc}")
        if not pools:
            where = (f"the {ask.pool} pool: {ask.pool} is not configured" if ask.pool
                     else "no pool the bot can count GPUs of")
            return Outcome(False, None, f"{ask.shown} is in {where}")
        details, passed, below_site = [], True, False
        for count in pools:
            site = self._site[count.pool]
            pool_floor = max(ask.floor, site)
            # a set already wholly out takes nothing: repairing it is never blocked
            ok = not count.counted or count.after >= pool_floor
            passed = passed and ok
            below_site = below_site or not (not count.counted or count.after >= site)
            whose = (f", the site floor (guards.min_free_gpus.{count.pool.lower()}); the "
                     f"runbook asks for {ask.floor}" if site > ask.floor else "")
            details.append(count.describe(ask.at_once) + f" (floor {pool_floor}{whose})")
        return Outcome(passed, min(count.after for count in pools), "; ".join(details),
                       {"pools": {c.pool: {"now": c.now, "after": c.after,
                                           "site_floor": self._site[c.pool],
                                           "counted": c.counted, "already_out": c.out}
                                  for c in pools},
                        "floor": ask.floor, "below_site_floor": below_site})

    def _pools(self, ask: _Ask, check: PlannedCheck, deadline: float) -> list[_PoolCount]:
        """The count of each pool ``ask.nodes`` serve, or of ``ask.pool`` alone
        (handoff-node names the pool that gives the node)."""
        pools = []
        inventory = self._inventory_of()
        names = inventory.names
        in_slurm = [n for n in ask.nodes if (n in inventory.slurm if not ask.pool else
                                             ask.pool == "slurm")]
        in_k8s = [n for n in ask.nodes if (n in inventory.kubernetes if not ask.pool else
                                           ask.pool == "kubernetes")]
        if in_slurm and self._slurm is not None:
            mapped = {n: names.get("slurm", {}).get(n, n) for n in in_slurm}
            pools.append(_PoolCount.of("Slurm", self._slurm_free(), mapped, ask.at_once))
        if in_k8s and self._kubernetes is not None:
            # an API server that does not answer fails the check within its timeout
            until = min(deadline, time.monotonic() + check.timeout_seconds)
            mapped = {n: names.get("kubernetes", {}).get(n, n) for n in in_k8s}
            with _within(self._kubernetes, until):
                pools.append(_PoolCount.of("Kubernetes", self._k8s_free(), mapped,
                                           ask.at_once))
        return pools

    def _slurm_free(self) -> tuple[dict[str, int], dict[str, str]]:
        """Free GPUs of each node in service; why each other node is out."""
        assert self._slurm is not None
        free: dict[str, int] = {}
        out: dict[str, str] = {}
        for info in self._slurm.nodes(None, with_jobs=False):
            why = _slurm_out(info)
            if why:
                out[info.name] = why
            else:
                free[info.name] = max(0, info.gpus_total - info.gpus_used)
        return free, out

    def _k8s_free(self) -> tuple[dict[str, int], dict[str, str]]:
        assert self._kubernetes is not None
        requested: dict[str, int] = defaultdict(int)
        for pod in self._kubernetes.list_pods():
            if pod.node and not pod.deleting and pod.phase not in ("Succeeded", "Failed"):
                requested[pod.node] += pod.gpus_requested
        free: dict[str, int] = {}
        out: dict[str, str] = {}
        for node in self._kubernetes.list_nodes(self._selector):
            why = ("not ready" if not node.ready else "cordoned" if node.unschedulable
                   else "" if serves_kubernetes(node.labels.get(self._label))
                   else "serving Slurm")
            if why:
                out[node.name] = why
            else:
                free[node.name] = max(0, node.gpus_allocatable - requested[node.name])
        return free, out


@dataclass(frozen=True)
class _Ask:
    """What a capacity check asks, read from its rendered spec."""

    nodes: list[str]
    shown: str
    floor: int
    pool: str  # "", slurm or kubernetes
    at_once: int | None  # at most this many of the nodes out at one time (a rollout)

    @classmethod
    def read(cls, spec: dict[str, Any], inventory: Inventory) -> _Ask:
        pool = str(spec.get("pool") or "")
        if pool not in ("", "slurm", "kubernetes"):
            raise ValueError(f"pool must be slurm or kubernetes, not {pool!r}")
        if spec.get("whole_pool"):
            if not pool:
                raise ValueError("whole_pool needs pool: slurm or kubernetes")
            nodes = sorted(inventory.slurm if pool == "slurm" else inventory.kubernetes)
            shown = f"every node of the {pool} pool"
        else:
            text = str(spec.get("pool_of", ""))
            try:
                nodes = hostlist.expand(text) if text else []
            except ValueError as exc:
                raise ValueError(f"pool_of: {exc}") from exc
            shown = text
        try:
            floor = int(spec.get("min_free_gpus_after", 0))
        except (TypeError, ValueError):
            raise ValueError("min_free_gpus_after must be a whole number") from None
        at_once = spec.get("at_once")
        try:
            at_once = None if at_once in (None, "") else int(at_once)
        except (TypeError, ValueError):
            raise ValueError("at_once must be a whole number") from None
        if at_once is not None and at_once < 1:
            raise ValueError("at_once must be at least 1")
        return cls(nodes, shown, floor, pool, at_once)


@dataclass(frozen=True)
class _PoolCount:
    """One pool's free GPUs now and once the asked nodes are out. ``counted``: the nodes
    in service that are taken (with ``at_once``, the worst moment: the ``at_once`` of them
    with the most free GPUs); ``out``: the nodes already out, with why (they cost nothing)."""

    pool: str
    now: int
    after: int
    asked: list[str]
    counted: list[str]
    out: dict[str, str]

    @classmethod
    def of(cls, pool: str, listing: tuple[dict[str, int], dict[str, str]],
           mapped: dict[str, str], at_once: int | None) -> _PoolCount:
        free, why_out = listing
        now = sum(free.values())
        serving = [n for n in mapped if mapped[n] in free]
        out = {n: why_out.get(mapped[n], "not in service") for n in mapped if n not in serving}
        if at_once is not None:  # the worst batch: the most free GPUs out at one time
            serving = sorted(serving, key=lambda n: (-free[mapped[n]], n))[:at_once]
        cost = sum(free[mapped[n]] for n in set(serving))
        return cls(pool, now, now - cost, list(mapped), sorted(serving), out)

    def describe(self, at_once: int | None) -> str:
        text = f"{self.pool} pool: {self.now} free GPUs now"
        if self.counted:
            taking = _shown(self.counted)
            if at_once is not None and len(self.asked) - len(self.out) > at_once:
                taking = (f"{at_once} of {_shown([n for n in self.asked if n not in self.out])}"
                          f" at once (the worst case: {hostlist.compress(self.counted)})")
            text += f", {self.after} after taking {taking} out"
        else:
            text += ", taking nothing more"
        if self.out:
            text += "; already out, costing nothing: " + ", ".join(
                f"{hostlist.compress(sorted(n for n in self.out if self.out[n] == why))} "
                f"({why})" for why in sorted(set(self.out.values())))
        return text


def _slurm_out(info: NodeInfo) -> str:
    """Why a Slurm node gives no free GPUs ("" when it is in service)."""
    if info.state == "down":
        return "down"
    if "DRAIN" in info.flags:
        return "drained"
    if not info.responding:
        return "not responding"
    if info.flags & {"MAINTENANCE", "RESERVED"}:
        return "reserved"
    return ""


def _shown(nodes: list[str]) -> str:
    """One node by its name, a set as a hostlist with its size."""
    return nodes[0] if len(nodes) == 1 else f"{hostlist.compress(nodes)} ({len(nodes)} nodes)"


def _within(backend: Any, until: float) -> AbstractContextManager[None]:
    """The backend's requests end by ``until`` where it can bound them (``deadline``)."""
    deadline = getattr(backend, "deadline", None)
    return deadline(until) if deadline is not None else nullcontext()
