"""Assembling a bot from its configuration: which adapters, actions and check sources it has.

The one place that turns configuration sections into adapter objects; everything
else receives them ready-made (tests hand over their own).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine

from adapters.actions import Action
from bot.catalogue import KNOWN, Catalogue, standard_actions
from bot.checks import Checks, CommandEvaluator, Evaluator, FileEvaluator
from bot.config import Config
from bot.confirming import DatabaseConfirmations


@dataclass(frozen=True)
class Assembly:
    catalogue: Catalogue
    checks: Checks


def assemble(config: Config, engine: Engine) -> Assembly:
    actions: list[Action] = standard_actions(config, DatabaseConfirmations(engine))
    evaluators: dict[str, Evaluator] = {
        "command": CommandEvaluator(config.host_commands),
        "file": FileEvaluator(),
    }
    if config.mariadb is not None:
        from adapters.mariadb import mariadb_actions

        actions.extend(mariadb_actions(config.mariadb))
    if config.slurm is not None:
        actions_, evaluator = _slurm(config)
        actions.extend(actions_)
        evaluators["slurm"] = evaluator
    return Assembly(Catalogue(actions, KNOWN), Checks(evaluators))


def _slurm(config: Config) -> tuple[list[Action], Evaluator]:
    from adapters.slurm.actions import SlurmActions
    from adapters.slurm.health import HealthCheckAction
    from adapters.slurm.pyslurm_backend import make_backend
    from adapters.slurm.rolling import DriverRolloutAction
    from bot.slurm_checks import SlurmEvaluator

    assert config.slurm is not None
    backend = make_backend(config.slurm)
    actions: list[Action] = [
        *SlurmActions(backend, config.slurm).all(),
        HealthCheckAction(backend, config.slurm),
        DriverRolloutAction(backend, config.slurm),
    ]
    return actions, SlurmEvaluator(backend)
