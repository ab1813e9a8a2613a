"""The external systems a bot may talk to: one ``Adapter`` entry per system, declared as
``ADAPTER`` in the system's ``adapter`` module (or its single module), in ``adapters`` or its
reports wing ``adapters.reports``, and found here by looking.

The bot reads the entries to know which actions runbooks may name, which configuration
section enables them and how to build them. Nothing here imports ``bot``.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from adapters.actions import Action


@dataclass(frozen=True)
class Built:
    """What an adapter built from its configuration section."""

    actions: list[Action]
    backend: Any = None  # for the bot's checks and read-only views


@dataclass(frozen=True)
class Adapter:
    name: str  # also the name of its backend for the bot's checks and views
    section: str  # the key in the bot's configuration that enables it
    config_class: type[Any]  # the model of that section
    action_classes: tuple[type[Any], ...]  # what runbooks may name, configured or not
    # (its section, the backends built so far by adapter name) -> its actions and backend
    build: Callable[[Any, Mapping[str, Any]], Built]
    uses: tuple[str, ...] = field(default=())  # adapters built first when configured


WINGS = ("adapters", "adapters.reports")  # the packages whose modules and packages are entries


@cache
def registered() -> tuple[Adapter, ...]:
    """Every adapter in the wings, those another uses first."""
    found: dict[str, Adapter] = {}
    for name in _entry_modules():
        entry = getattr(importlib.import_module(name), "ADAPTER", None)
        if isinstance(entry, Adapter):
            if entry.name in found:
                raise RuntimeError(f"two adapters are called {entry.name!r}")
            found[entry.name] = entry
    return tuple(_used_first(found))


def _entry_modules() -> list[str]:
    """Each module directly in a wing, and each package's ``adapter`` module (a package
    without one, as syslog, declares no entry)."""
    names = []
    for wing in WINGS:
        path = importlib.import_module(wing).__path__
        for module in pkgutil.iter_modules(path, f"{wing}."):
            if not module.ispkg:
                names.append(module.name)
            elif importlib.util.find_spec(f"{module.name}.adapter") is not None:
                names.append(f"{module.name}.adapter")
    return names


def _used_first(found: Mapping[str, Adapter]) -> list[Adapter]:
    ordered: list[Adapter] = []

    def visit(entry: Adapter, path: tuple[str, ...]) -> None:
        if entry in ordered:
            return
        if entry.name in path:
            raise RuntimeError(f"adapters use each other: {' -> '.join(path)}")
        for name in entry.uses:
            if name in found:
                visit(found[name], (*path, entry.name))
        ordered.append(entry)

    for name in sorted(found):
        visit(found[name], ())
    return ordered
