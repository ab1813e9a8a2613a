"""One inventory of GPU nodes across Slurm and Kubernetes, under the bot's own node names.

It only reads node lists, through the listers it is handed (``discovery_sources`` makes them
from the built backends), and never blocks a command on a system that cannot be asked
(``build``). A node registered in both systems serves the pools its marks say
(``serves_kubernetes``/``serves_slurm``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adapters.kubernetes import cordons
from adapters.slurm import reasons
from bot.config import InventoryConfig
from bot.config.remediation import PoolsConfig
from bot.runbooks.params import Inventory

if TYPE_CHECKING:
    from bot.config import Config


@dataclass(frozen=True)
class Seen:
    """A node as one system lists it, with the marks that say which pool it serves:
    Kubernetes, the value of the pool label; Slurm, the reason when DRAIN is set."""

    name: str
    pool_label: str | None = None
    drain_reason: str | None = None
    # the bot's executions that hold the node out of service: drained with their mark
    # (Slurm), cordoned with their annotation (Kubernetes). The breaker counts these.
    held_by: frozenset[int] = frozenset()


Lister = Callable[[], Iterable[str | Seen]]  # names as one system calls its nodes


def serves_kubernetes(pool_label: str | None) -> bool:
    """A Kubernetes node serves Kubernetes unless its pool label says slurm."""
    return pool_label != "slurm"


def serves_slurm(drain_reason: str | None, pools: PoolsConfig) -> bool:
    """A Slurm node serves Slurm unless it is drained with the pool reason."""
    return drain_reason is None or not drain_reason.startswith(pools.reason_prefix)


@dataclass
class InventorySources:
    slurm: Lister | None = None
    kubernetes: Lister | None = None
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PoolInventory(Inventory):
    """The inventory plus the pool hand-off's facts: the nodes each system knows (whatever
    pool they serve now) and ``pools`` (the marks, for templates)."""

    in_slurm: frozenset[str] = frozenset()
    in_kubernetes: frozenset[str] = frozenset()
    pools: PoolsConfig = field(default_factory=PoolsConfig)
    # the nodes the bot holds out of service now, as the systems show it (its drain marks
    # and cordon annotations), with the executions holding each; ``listed``: every system
    # the bot lists answered (else only the execution history knows)
    held_by_bot: Mapping[str, frozenset[int]] = field(default_factory=dict)
    listed: bool = False

    def facts(self) -> dict[str, Any]:
        marks = {"label": self.pools.label, "taint": self.pools.taint,
                 "reason": self.pools.reason_prefix, "feature": self.pools.slurm_feature or ""}
        return {**super().facts(), "pools": marks}

    def pool_of(self, node: str) -> list[str]:
        """The pools ``node`` serves now: ``["slurm"]``, ``["kubernetes"]``, both or none."""
        return [pool for pool, members in (("slurm", self.slurm),
                                           ("kubernetes", self.kubernetes)) if node in members]


def discovery_sources(config: Config, backends: Mapping[str, Any]) -> InventorySources:
    """Where the node inventory is discovered: the two pools, when asked to discover."""
    sources = InventorySources()
    if not config.inventory.discover:
        return sources
    slurm, kubernetes = backends.get("slurm"), backends.get("kubernetes")
    label = config.pools.label  # which pool a node serves: serves_kubernetes
    if slurm is not None:
        sources.slurm = lambda: [
            Seen(node.name, drain_reason=node.reason if "DRAIN" in node.flags else None,
                 held_by=reasons.held_by(node.reason) if "DRAIN" in node.flags
                 else frozenset())
            for node in slurm.nodes(None, with_jobs=False)]
    if kubernetes is not None:
        selector = config.inventory.kubernetes_selector
        sources.kubernetes = lambda: [
            Seen(node.name, pool_label=node.labels.get(label),
                 held_by=cordons.held_by(node.annotations) if node.unschedulable else frozenset())
            for node in kubernetes.list_nodes(selector)]
    return sources


def build(config: InventoryConfig, sources: InventorySources,
          pools: PoolsConfig | None = None,
          mig_layouts: Mapping[str, Mapping[str, int]] | None = None,
          driver_floors: Mapping[str, tuple[str, str]] | None = None) -> PoolInventory:
    """The inventory: discovered pools under the bot's names, plus the configured nodes.

    The bot names a node once (``gpu07``); ``inventory.names`` says what Slurm, Kubernetes
    and the DCGM exporter call it when that differs. With ``discover`` on, Slurm's and
    Kubernetes' own node lists decide which pool a node is in; a node in both pools gets the
    steps of both (runbooks choose with ``when: "{{ node in kubernetes }}"``). If a system
    cannot be asked, the inventory says so (``sources.problems``) and falls back to the
    configured node list rather than blocking every command. A node both systems know is in
    the pool it serves (``pools``: the Kubernetes pool label, the Slurm drain reason), yet
    stays in ``nodes`` and keeps its names, so that handoff-node can move it.
    """
    pools = pools or PoolsConfig()
    static = frozenset(config.nodes)
    slurm_seen = _discover("Slurm", sources.slurm, _reverse(config, "slurm"), sources.problems)
    k8s_seen = _discover("Kubernetes", sources.kubernetes, _reverse(config, "kubernetes"),
                         sources.problems)
    # every system the bot lists answered: what they show is the whole truth of its holds
    listed = (bool(sources.slurm or sources.kubernetes)
              and (sources.slurm is None or slurm_seen is not None)
              and (sources.kubernetes is None or k8s_seen is not None))
    if slurm_seen is None:
        slurm_seen = ({n: Seen(n) for n in static} if sources.kubernetes is None else {})
    k8s_seen = k8s_seen or {}
    slurm = frozenset(n for n, seen in slurm_seen.items()
                      if serves_slurm(seen.drain_reason, pools))
    kubernetes = frozenset(n for n, seen in k8s_seen.items()
                           if serves_kubernetes(seen.pool_label))
    held: dict[str, frozenset[int]] = {}
    for seen in (slurm_seen, k8s_seen):
        for name, node in seen.items():
            if node.held_by:
                held[name] = held.get(name, frozenset()) | node.held_by
    return PoolInventory(nodes=static | set(slurm_seen) | set(k8s_seen), slurm=slurm,
                         kubernetes=kubernetes, names=_names(config),
                         in_slurm=frozenset(slurm_seen), in_kubernetes=frozenset(k8s_seen),
                         held_by_bot=held, listed=listed,
                         pools=pools, mig_layouts=dict(mig_layouts or {}),
                         driver_floors=dict(driver_floors or {}))


def _discover(system: str, lister: Lister | None, to_bot: dict[str, str],
              problems: list[str]) -> dict[str, Seen] | None:
    """The nodes one system lists, by the bot's names."""
    if lister is None:
        return None
    try:
        listed = [item if isinstance(item, Seen) else Seen(item) for item in lister()]
    except Exception as exc:  # an unreachable system must not stop every command
        problems.append(f"could not list {system} nodes ({exc}); using the configured list")
        return None
    return {to_bot.get(seen.name, seen.name): seen for seen in listed}


def _reverse(config: InventoryConfig, system: str) -> dict[str, str]:
    found = {}
    for bot_name, names in config.names.items():
        other = getattr(names, system)
        if other:
            found[other] = bot_name
    return found


def _names(config: InventoryConfig) -> dict[str, dict[str, str]]:
    """For templates: ``kubernetes_name[node]`` etc., defaulting to the bot's name."""
    table: dict[str, dict[str, str]] = {"slurm": {}, "kubernetes": {}, "dcgm": {}}
    for bot_name, names in config.names.items():
        for system in table:
            value: Any = getattr(names, system)
            if value:
                table[system][bot_name] = value
    return table


class LiveInventory:
    """The inventory of a bot: listed at first use, not at start (a command that needs no
    node list, like ``runbook cancel``, never waits on a Slurm or Kubernetes that does not
    answer), then listed again when older than ``max_age`` seconds
    (``inventory.refresh_seconds``) at the moment it is asked for, so a plan made after a
    node changed pools (handoff-node) sees its new pool. When a system cannot be asked, the
    previous listing of it is not kept: ``build`` falls back as it does at start, and
    ``on_problems`` (when set) hears why, at each listing that had a problem."""

    def __init__(self, config: InventoryConfig, sources: InventorySources,
                 pools: PoolsConfig | None, mig_layouts: Mapping[str, Mapping[str, int]],
                 max_age: float, clock: Callable[[], float] = time.monotonic,
                 driver_floors: Mapping[str, tuple[str, str]] | None = None) -> None:
        self._args = (config, sources, pools, mig_layouts)
        self._floors = dict(driver_floors or {})
        self._max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()
        self._current: PoolInventory | None = None
        self._built_at = 0.0
        self.on_problems: Callable[[list[str]], None] | None = None

    def _build(self) -> PoolInventory:
        config, sources, pools, layouts = self._args
        fresh = InventorySources(sources.slurm, sources.kubernetes)
        inventory = build(config, fresh, pools, layouts, self._floors)
        sources.problems[:] = fresh.problems
        if fresh.problems and self.on_problems is not None:
            self.on_problems(list(fresh.problems))
        return inventory

    def current(self) -> PoolInventory:
        with self._lock:
            if self._current is None or self._clock() - self._built_at >= self._max_age:
                self._current = self._build()
                self._built_at = self._clock()
            return self._current
