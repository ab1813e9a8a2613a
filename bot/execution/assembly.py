"""Assembling a bot from its configuration: which adapters, actions and check sources it has.

The one place that turns configuration sections into adapter objects; everything
else receives them ready-made (tests hand over their own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from adapters.actions import Action
from bot.config import Config
from bot.execution.checks.core import Checks, CommandEvaluator, Evaluator, FileEvaluator
from bot.execution.confirming import DatabaseConfirmations
from bot.runbooks.catalogue import KNOWN, Catalogue, standard_actions
from bot.runbooks.inventory import InventorySources, Lister, build
from bot.runbooks.params import Inventory


@dataclass(frozen=True)
class Assembly:
    catalogue: Catalogue
    checks: Checks
    inventory: Inventory
    warnings: list[str]
    backends: dict[str, Any]  # slurm, kubernetes, prometheus: for read-only views


def assemble(config: Config, engine: Engine) -> Assembly:
    actions: list[Action] = standard_actions(config, DatabaseConfirmations(engine))
    evaluators: dict[str, Evaluator] = {
        "command": CommandEvaluator(config.host_commands),
        "file": FileEvaluator(),
    }
    if config.mariadb is not None:
        from adapters.mariadb import mariadb_actions

        actions.extend(mariadb_actions(config.mariadb))
    sources = InventorySources()
    slurm_backend: Any = None
    k8s_backend: Any = None
    if config.slurm is not None:
        actions_, evaluator, lister, slurm_backend = _slurm(config)
        actions.extend(actions_)
        evaluators["slurm"] = evaluator
        if config.inventory.discover:
            sources.slurm = lister
    if config.kubernetes is not None:
        actions_k8s, lister, k8s_backend = _kubernetes(config)
        actions.extend(actions_k8s)
        if config.inventory.discover:
            sources.kubernetes = lister
    if config.etcd is not None:
        from adapters.etcd.actions import etcd_actions

        actions.extend(etcd_actions(config.etcd))
    prometheus = None
    if config.prometheus is not None:
        from adapters.prometheus import PrometheusActions, PrometheusApiBackend
        from bot.execution.checks.monitoring import PromqlEvaluator

        prometheus = PrometheusApiBackend(config.prometheus)
        actions.extend(PrometheusActions(config.prometheus, prometheus).all())
        evaluators["promql"] = PromqlEvaluator(prometheus)
    if config.alertmanager is not None:
        from adapters.alertmanager import AlertmanagerActions, HttpAlertmanagerBackend
        from bot.execution.checks.monitoring import AlertsEvaluator

        alertmanager = HttpAlertmanagerBackend(config.alertmanager)
        actions.extend(AlertmanagerActions(config.alertmanager, alertmanager).all())
        evaluators["alerts"] = AlertsEvaluator(alertmanager, prometheus)
    if slurm_backend is not None:
        from adapters.reports import GpuUsageReportAction

        actions.append(GpuUsageReportAction(slurm_backend, prometheus))
    inventory = build(config.inventory, sources)
    if slurm_backend is not None or k8s_backend is not None:
        from bot.execution.checks.capacity import CapacityEvaluator

        evaluators["capacity"] = CapacityEvaluator(inventory, slurm_backend, k8s_backend,
                                                   config.inventory.kubernetes_selector,
                                                   site_floors=config.guards.min_free_gpus)
    backends = {name: backend for name, backend in (
        ("slurm", slurm_backend), ("kubernetes", k8s_backend), ("prometheus", prometheus))
        if backend is not None}
    return Assembly(Catalogue(actions, KNOWN), Checks(evaluators), inventory, sources.problems,
                    backends)


def _slurm(config: Config) -> tuple[list[Action], Evaluator, Lister, Any]:
    from adapters.slurm.actions import SlurmActions
    from adapters.slurm.health import HealthCheckAction
    from adapters.slurm.pyslurm_backend import make_backend
    from adapters.slurm.rolling import DriverRolloutAction
    from bot.execution.checks.slurm import SlurmEvaluator

    assert config.slurm is not None
    backend = make_backend(config.slurm)
    actions: list[Action] = [
        *SlurmActions(backend, config.slurm).all(),
        HealthCheckAction(backend, config.slurm),
        DriverRolloutAction(backend, config.slurm),
    ]
    def names() -> list[str]:
        return [node.name for node in backend.nodes(None, with_jobs=False)]

    return actions, SlurmEvaluator(backend), names, backend


def _kubernetes(config: Config) -> tuple[list[Action], Lister, Any]:
    from adapters.kubernetes.actions import KubernetesActions
    from adapters.kubernetes.client import make_backend

    assert config.kubernetes is not None
    backend = make_backend(config.kubernetes)
    selector = config.inventory.kubernetes_selector

    def names() -> list[str]:
        return [node.name for node in backend.list_nodes(selector)]

    return KubernetesActions(backend, config.kubernetes).all(), names, backend
