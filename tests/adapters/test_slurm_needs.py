"""Every Slurm action declares the backend operations it changes the cluster with.

A plan is refused before approval when the configured backend cannot carry out one of its
steps' operations (``NeedsOperations.refusal``: slurmrestd 22.05 cannot drain, pyslurm cannot
reboot). That holds only if each action's ``needs`` lists what it really calls, and the lists
are kept by hand: this test reads each action's code (its class and the classes it inherits
from in adapters/slurm) for calls ``self.backend.<write>(...)``, from ``run`` and the methods
it calls on ``self``, and checks each one is declared. Reads (nodes, jobs, reservations,
accounting, ...) work on every backend.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap
from types import SimpleNamespace
from typing import Any

import pytest

import adapters.slurm
from adapters.actions import ActionBase
from adapters.slurm.backend import NeedsOperations

# The operations that change the cluster, and those a backend may refuse.
WRITES = {"update_nodes", "update_features", "requeue", "create_reservation",
          "delete_reservation", "reboot", "run_on_node", "run_on_nodes"}


ActionClass = type[ActionBase[Any, Any]]


def slurm_actions() -> list[ActionClass]:
    found: dict[str, ActionClass] = {}
    for module in pkgutil.iter_modules(adapters.slurm.__path__):
        loaded = importlib.import_module(f"adapters.slurm.{module.name}")
        for _, value in inspect.getmembers(loaded, inspect.isclass):
            name = getattr(value, "name", None)
            if (issubclass(value, ActionBase) and isinstance(name, str)
                    and name.startswith("slurm.") and not inspect.isabstract(value)):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return sorted(found.values(), key=lambda cls: cls.name)


def _self_call(node: ast.AST, via: str | None = None) -> str | None:
    """``X`` of a call ``self.X(...)`` (``via="backend"``: of ``self.backend.X(...)``)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    owner = node.func.value
    if via is not None:
        if not (isinstance(owner, ast.Attribute) and owner.attr == via):
            return None
        owner = owner.value
    return node.func.attr if isinstance(owner, ast.Name) and owner.id == "self" else None


def backend_calls(cls: type) -> set[str]:
    """The ``self.backend.X(...)`` calls ``run`` makes, itself or through the methods it
    calls as ``self.m(...)``, in the code of ``cls`` and its bases in adapters/slurm."""
    methods: dict[str, ast.AST] = {}
    for klass in reversed(cls.__mro__):  # a subclass's method replaces its base's
        if klass.__module__.startswith("adapters.slurm"):
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
            for item in tree.body[0].body:  # type: ignore[attr-defined]
                if isinstance(item, ast.FunctionDef):
                    methods[item.name] = item
    called: set[str] = set()
    todo, seen = ["run"], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in methods:
            continue
        seen.add(name)
        for node in ast.walk(methods[name]):
            if (write := _self_call(node, via="backend")) is not None:
                called.add(write)
            elif (method := _self_call(node)) is not None:
                todo.append(method)
    return called


def declared(cls: ActionClass) -> set[str]:
    """What the action says it may ask, for arguments that ask the most (requeue=true, no
    gpus= so that check_gres counts them on the node)."""
    assert issubclass(cls, NeedsOperations)
    action = cls.__new__(cls)  # operations() reads the class and the arguments only
    return set(action.operations(SimpleNamespace(requeue=True)))


ACTIONS = slurm_actions()


def test_the_scan_finds_the_slurm_actions() -> None:
    names = {cls.name for cls in ACTIONS}
    assert {"slurm.drain", "slurm.drain_batches", "slurm.wait_idle", "slurm.gpu_reset",
            "slurm.driver_rollout", "slurm.health_check"} <= names
    # and the scan sees calls: drain's scontrol update
    drain = next(cls for cls in ACTIONS if cls.name == "slurm.drain")
    assert "update_nodes" in backend_calls(drain)


@pytest.mark.parametrize("cls", ACTIONS, ids=lambda cls: cls.name)
def test_every_write_an_action_calls_is_declared(cls: ActionClass) -> None:
    writes = backend_calls(cls) & WRITES
    if not writes:
        return  # reads only: nothing a backend refuses
    assert issubclass(cls, NeedsOperations), (
        f"{cls.name} calls {sorted(writes)} but declares no needs: a plan "
        "would not be refused on a backend that cannot do them")
    missing = writes - declared(cls)
    assert not missing, f"{cls.name} calls {sorted(missing)} without declaring them"
