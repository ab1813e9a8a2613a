"""One inventory of GPU nodes across Slurm and Kubernetes, under the bot's own node names.

It only reads node lists, through the listers it is handed (bot.execution.assembly makes
them), and never blocks a command on a system that cannot be asked (``build``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from bot.config import InventoryConfig
from bot.runbooks.params import Inventory

Lister = Callable[[], Iterable[str]]  # names as one system calls its nodes


@dataclass
class InventorySources:
    slurm: Lister | None = None
    kubernetes: Lister | None = None
    problems: list[str] = field(default_factory=list)


def build(config: InventoryConfig, sources: InventorySources) -> Inventory:
    """The inventory: discovered pools under the bot's names, plus the configured nodes.

    The bot names a node once (``gpu07``); ``inventory.names`` says what Slurm, Kubernetes
    and the DCGM exporter call it when that differs. With ``discover`` on, Slurm's and
    Kubernetes' own node lists decide which pool a node is in; a node in both pools gets the
    steps of both (runbooks choose with ``when: "{{ node in kubernetes }}"``). If a system
    cannot be asked, the inventory says so (``sources.problems``) and falls back to the
    configured node list rather than blocking every command.
    """
    slurm_to_bot = _reverse(config, "slurm")
    k8s_to_bot = _reverse(config, "kubernetes")
    static = frozenset(config.nodes)
    slurm = _discover("Slurm", sources.slurm, slurm_to_bot, sources.problems)
    kubernetes = _discover("Kubernetes", sources.kubernetes, k8s_to_bot, sources.problems)
    if slurm is None:
        slurm = static if sources.kubernetes is None else frozenset()
    if kubernetes is None:
        kubernetes = frozenset()
    return Inventory(nodes=static | slurm | kubernetes, slurm=slurm, kubernetes=kubernetes,
                     names=_names(config))


def _discover(system: str, lister: Lister | None, to_bot: dict[str, str],
              problems: list[str]) -> frozenset[str] | None:
    if lister is None:
        return None
    try:
        return frozenset(to_bot.get(name, name) for name in lister())
    except Exception as exc:  # an unreachable system must not stop every command
        problems.append(f"could not list {system} nodes ({exc}); using the configured list")
        return None


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
