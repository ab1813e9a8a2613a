"""The action catalogue: every action a runbook step may name, built from the configuration.

It wires no adapter: the configured actions are passed in (tests hand over their own);
bot.execution.assembly is the one place that decides which adapters a configured bot offers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

from adapters.actions import Action, StrictArguments, takes_out
from adapters.host import HostRunAction
from adapters.notify import ConfirmAction, Confirmations, NotifyAction
from adapters.registry import registered
from bot.config import Config

if TYPE_CHECKING:
    from adapters.slurm.nccltest import NcclBaselines

# The bot's own actions, there whatever adapters are configured.
_STANDARD = (NotifyAction, ConfirmAction, HostRunAction)


@cache
def action_classes() -> dict[str, tuple[type[Any], str]]:
    """Every action class any adapter ships, with the configuration section that enables it
    (docs/actions.md is made from these). Made at first use: it imports every adapter."""
    return {**{cls.name: (cls, "always") for cls in _STANDARD},
            **{cls.name: (cls, adapter.section)
               for adapter in registered() for cls in adapter.action_classes}}


@cache
def known() -> dict[str, tuple[type[StrictArguments], str]]:
    """The arguments of every action a runbook may name, and the section enabling it."""
    return {name: (cls.Arguments, section) for name, (cls, section) in action_classes().items()}


@cache
def taking_out() -> dict[str, tuple[str, ...]]:
    """Every shipped action that takes GPUs out of service -> the arguments naming its nodes
    (adapters.actions.takes_out): a runbook step calling one needs a capacity guard. The
    bot's own actions (notify, confirm, host.run) take nothing out."""
    return {cls.name: takes_out(cls)
            for adapter in registered() for cls in adapter.action_classes if takes_out(cls)}


# ACTION_CLASSES, KNOWN and TAKES_OUT: the tables above, made when first read (PEP 562), so
# that a command which never checks or plans a runbook never imports the adapters' actions.
_TABLES: dict[str, Callable[[], Any]] = {
    "ACTION_CLASSES": action_classes, "KNOWN": known, "TAKES_OUT": taking_out}
if TYPE_CHECKING:
    ACTION_CLASSES: dict[str, tuple[type[Any], str]]
    KNOWN: dict[str, tuple[type[StrictArguments], str]]
    TAKES_OUT: dict[str, tuple[str, ...]]
else:
    def __getattr__(name: str) -> Any:
        if name in _TABLES:
            return _TABLES[name]()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class NotConfigured(KeyError):
    """A runbook names an action this installation has not configured."""

    def __str__(self) -> str:
        return str(self.args[0])


class Catalogue:
    """Two views: the actions this installation can *run* (``actions``: adapters configured),
    and the actions a runbook may *name* (``known``: every action any adapter ships).
    Runbooks are validated against the second, so a shipped runbook for MariaDB still loads
    on a site without MariaDB; planning it says which configuration section is missing.
    """

    def __init__(
        self,
        actions: Iterable[Action],
        known: Mapping[str, tuple[type[StrictArguments], str]]
        | Callable[[], Mapping[str, tuple[type[StrictArguments], str]]] | None = None,
    ) -> None:
        self._actions = {action.name: action for action in actions}
        self._known_given = known if known is not None else {}

    @property
    def _known(self) -> Mapping[str, tuple[type[StrictArguments], str]]:
        """Every action a runbook may name (a callable given: made when first needed)."""
        return self._known_given() if callable(self._known_given) else self._known_given

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

    def takes_out(self, name: str) -> tuple[str, ...]:
        """The arguments of action ``name`` that hold the nodes it takes out of service."""
        action = self._actions.get(name)
        return takes_out(action) if action is not None else taking_out().get(name, ())

    def names(self) -> list[str]:
        return sorted(self._actions)


def standard_actions(config: Config, confirmations: Confirmations) -> list[Action]:
    """The actions every installation has, whatever adapters it configures."""
    return [NotifyAction(), ConfirmAction(confirmations), HostRunAction(config.host_commands)]


def hand_stores(actions: Iterable[Action], baselines: NcclBaselines) -> None:
    """Give the actions that keep figures in the bot's database their store, as
    ``standard_actions`` gives chat.confirm its confirmations: slurm.nccl_test its baselines
    (``use_baselines``). An adapter never imports the bot; this is where the two meet."""
    for action in actions:
        use = getattr(action, "use_baselines", None)
        if callable(use):
            use(baselines)
