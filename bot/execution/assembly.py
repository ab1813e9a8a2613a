"""Assembling a bot from its configuration: its adapters, actions, inventory and check kinds.

The one place that turns configuration sections into adapter objects (through the
adapters' registry); everything else receives them ready-made (tests hand over their own).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from adapters.actions import Action
from adapters.registry import registered
from bot.config import Config
from bot.execution.baselines import DatabaseBaselines
from bot.execution.checks.capacity import CapacityEvaluator
from bot.execution.checks.core import Checks, CommandEvaluator, Evaluator, FileEvaluator
from bot.execution.checks.monitoring import AlertsEvaluator, PromqlEvaluator
from bot.execution.checks.slurm import SlurmEvaluator
from bot.execution.confirming import DatabaseConfirmations
from bot.runbooks.catalogue import Catalogue, hand_stores, known, standard_actions
from bot.runbooks.inventory import LiveInventory, discovery_sources
from bot.runbooks.params import Inventory


@dataclass(frozen=True)
class Assembly:
    catalogue: Catalogue
    checks: Checks
    warnings: list[str]  # why a pool could not be listed, as of the last listing
    backends: dict[str, Any]  # by adapter name (slurm, kubernetes, prometheus...): for views
    live: LiveInventory  # lists the pools at first use, then again as they change

    @property
    def inventory(self) -> Inventory:
        return self.live.current()


# Check kinds that read a system: the kind, and how to make its evaluator from the built
# backends (None when what it reads is not configured). Add a check kind here.
_CheckMaker = Callable[[Config, Mapping[str, Any], Callable[[], Inventory]], Evaluator | None]
CHECK_KINDS: dict[str, _CheckMaker] = {
    "slurm": lambda config, b, inventory: (
        SlurmEvaluator(b["slurm"]) if "slurm" in b else None),
    "promql": lambda config, b, inventory: (
        PromqlEvaluator(b["prometheus"]) if "prometheus" in b else None),
    "alerts": lambda config, b, inventory: (
        AlertsEvaluator(b["alertmanager"], b.get("prometheus")) if "alertmanager" in b else None),
    "capacity": lambda config, b, inventory: (
        CapacityEvaluator(inventory, b.get("slurm"), b.get("kubernetes"),
                          config.inventory.kubernetes_selector,
                          site_floors=config.guards.min_free_gpus, pools=config.pools)
        if "slurm" in b or "kubernetes" in b else None),
}


def assemble(config: Config, db: Engine) -> Assembly:
    actions: list[Action] = standard_actions(config, DatabaseConfirmations(db))
    backends: dict[str, Any] = {}
    for adapter in registered():
        section = getattr(config, adapter.section, None)
        if section is None:
            continue
        built = adapter.build(section, backends)
        actions.extend(built.actions)
        if built.backend is not None:
            backends[adapter.name] = built.backend
    hand_stores(actions, DatabaseBaselines(db))
    sources = discovery_sources(config, backends)
    live = LiveInventory(config.inventory, sources, config.pools, config.mig.layouts,
                         config.inventory.refresh_seconds,
                         driver_floors=config.drivers.floors())
    evaluators: dict[str, Evaluator] = {
        "command": CommandEvaluator(config.host_commands),
        "file": FileEvaluator(),
    }
    for kind, make in CHECK_KINDS.items():
        evaluator = make(config, backends, live.current)
        if evaluator is not None:
            evaluators[kind] = evaluator
    return Assembly(Catalogue(actions, known), Checks(evaluators), sources.problems, backends,
                    live)

