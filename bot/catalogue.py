"""The action catalogue: every action a runbook step may name, built from the configuration.

Implementations are passed in (tests hand over their own); ``from_config`` is the
one place that decides which adapters a configured bot offers.
"""

from __future__ import annotations

from collections.abc import Iterable

from adapters.actions import Action, StrictArguments
from adapters.host import HostRunAction
from adapters.notify import ConfirmAction, Confirmations, NotifyAction
from bot.config import Config


class Catalogue:
    def __init__(self, actions: Iterable[Action]) -> None:
        self._actions = {action.name: action for action in actions}

    def get(self, name: str) -> Action:
        return self._actions[name]

    def arguments(self) -> dict[str, type[StrictArguments]]:
        return {name: action.Arguments for name, action in self._actions.items()}

    def names(self) -> list[str]:
        return sorted(self._actions)


def from_config(config: Config, confirmations: Confirmations) -> Catalogue:
    return Catalogue(standard_actions(config, confirmations))


def standard_actions(config: Config, confirmations: Confirmations) -> list[Action]:
    """The actions every installation has, whatever adapters it configures."""
    return [NotifyAction(), ConfirmAction(confirmations), HostRunAction(config.host_commands)]
