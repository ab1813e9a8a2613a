"""The action catalogue: every action a runbook step may name, built from the configuration.

Two views: the actions this installation can *run* (adapters configured), and
the actions a runbook may *name* (every action any adapter ships). Runbooks are
validated against the second, so a shipped runbook for MariaDB still loads on a
site without MariaDB; planning it says which configuration section is missing.

Implementations are passed in (tests hand over their own); bot.execution.assembly is the
one place that decides which adapters a configured bot offers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from adapters.actions import Action, StrictArguments
from adapters.alertmanager import ACTION_CLASSES as ALERTMANAGER_ACTIONS
from adapters.etcd.actions import ACTION_CLASSES as ETCD_ACTIONS
from adapters.host import HostRunAction
from adapters.kubernetes.actions import ACTION_CLASSES as KUBERNETES_ACTIONS
from adapters.mariadb import DumpAction, RestoreAction
from adapters.notify import ConfirmAction, Confirmations, NotifyAction
from adapters.prometheus.actions import ACTION_CLASSES as PROMETHEUS_ACTIONS
from adapters.reports import GpuUsageReportAction
from adapters.slurm.actions import ACTION_CLASSES as SLURM_ACTIONS
from adapters.slurm.health import HealthCheckAction
from adapters.slurm.rolling import DriverRolloutAction
from bot.config import Config

# Every action class any adapter ships, with the configuration section that enables it.
_SHIPPED: list[tuple[Any, str]] = [
    (NotifyAction, "always"),
    (ConfirmAction, "always"),
    (HostRunAction, "always"),
    (DumpAction, "mariadb"),
    (RestoreAction, "mariadb"),
    *((cls, "slurm") for cls in (*SLURM_ACTIONS, HealthCheckAction, DriverRolloutAction)),
    (GpuUsageReportAction, "slurm"),  # and prometheus for its idle-GPU part
    *((cls, "kubernetes") for cls in KUBERNETES_ACTIONS),
    *((cls, "etcd") for cls in ETCD_ACTIONS),
    *((cls, "prometheus") for cls in PROMETHEUS_ACTIONS),
    *((cls, "alertmanager") for cls in ALERTMANAGER_ACTIONS),
]
KNOWN: dict[str, tuple[type[StrictArguments], str]] = {
    cls.name: (cls.Arguments, section) for cls, section in _SHIPPED
}


class NotConfigured(KeyError):
    """A runbook names an action this installation has not configured."""

    def __str__(self) -> str:
        return str(self.args[0])


class Catalogue:
    def __init__(
        self,
        actions: Iterable[Action],
        known: Mapping[str, tuple[type[StrictArguments], str]] | None = None,
    ) -> None:
        self._actions = {action.name: action for action in actions}
        self._known = dict(known if known is not None else {})

    def get(self, name: str) -> Action:
        try:
            return self._actions[name]
        except KeyError:
            section = self._known.get(name, (None, "?"))[1]
            raise NotConfigured(
                f'action "{name}" is not available here: configure the "{section}" section'
            ) from None

    def arguments(self) -> dict[str, type[StrictArguments]]:
        """What runbooks may name: configured actions plus every known one."""
        names = {name: known[0] for name, known in self._known.items()}
        names.update({name: action.Arguments for name, action in self._actions.items()})
        return names

    def names(self) -> list[str]:
        return sorted(self._actions)


def standard_actions(config: Config, confirmations: Confirmations) -> list[Action]:
    """The actions every installation has, whatever adapters it configures."""
    return [NotifyAction(), ConfirmAction(confirmations), HostRunAction(config.host_commands)]
