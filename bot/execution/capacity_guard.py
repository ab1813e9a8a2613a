"""Where the capacity guard applies: over every node a planned step takes out of service
(``uncovered``, when the plan is made) and before each batch a rollout takes out
(``batch_guard``, at run time, with the numbers of that moment).

A runbook with no ``capacity:`` pre-check at all is refused at load (bot.runbooks.loading);
here each step whose action declares ``takes_out`` (adapters.actions) must name only nodes
that a capacity pre-check, not skipped, counts: a ``when:`` that skips the guard but not
the step, or a guard over other nodes, is refused before approval."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from adapters.actions import WHOLE_POOL, ActionError
from bot.runbooks.params import Inventory
from kit import hostlist


def uncovered(steps: Iterable[Any], pre_checks: Iterable[Any], inventory: Inventory,
              takes_out: Callable[[str], tuple[str, ...]]) -> list[str]:
    """One sentence per planned step that takes nodes out with no guard over them."""
    guards = [c.spec["capacity"] for c in pre_checks if c.kind == "capacity" and not c.skipped]
    covered = _covered(guards, inventory)
    whole = {str(g.get("pool")) for g in guards if g.get("whole_pool")}
    back = _own_names(inventory)
    problems = []
    for step in steps:
        fields = takes_out(step.action)
        if step.skipped or not fields:
            continue
        if WHOLE_POOL in fields:
            if not whole:
                problems.append(f"step {step.id} ({step.action}) takes nodes of a whole pool "
                                "out of service: it needs a capacity pre-check with "
                                "whole_pool: true")
            continue
        nodes = {back.get(name, name) for field in fields
                 for name in _names(step.args.get(field))}
        missing = sorted(nodes - covered)
        if missing:
            problems.append(f"step {step.id} ({step.action}) takes "
                            f"{hostlist.compress(missing)} out of service and no capacity "
                            "pre-check of this plan counts "
                            f"{'it' if len(missing) == 1 else 'them'}")
    return problems


def batch_guard(plan: Any, evaluate: Callable[[Any], Any]) -> Callable[[Sequence[str]], str] | None:
    """The engine's ``ActionContext.capacity_guard`` for ``plan``: every capacity pre-check
    that is not skipped, asked again over the batch alone (its floor and pool as planned),
    now. A refusal raises ActionError with the verdict; break-glass passes the runbook's
    floor, never the site's (as the pre-check). None when the plan has no guard."""
    guards = [c for c in plan.pre_checks if c.kind == "capacity" and not c.skipped]
    if not guards:
        return None

    def guard(nodes: Sequence[str]) -> str:
        batch = hostlist.compress(list(nodes))
        verdicts = []
        for check in guards:
            spec = {k: v for k, v in check.spec["capacity"].items()
                    if k not in ("at_once", "whole_pool")}
            try:
                outcome = evaluate(dataclasses.replace(
                    check, spec={**check.spec, "capacity": {**spec, "pool_of": batch}}))
            except Exception as exc:  # an evaluator bug fails the guard, never passes it
                raise ActionError(f"capacity guard before taking {batch} out: {check.name}: "
                                  f"{type(exc).__name__}: {exc}") from exc
            overridden = plan.break_glass and not outcome.extra.get("below_site_floor")
            if not outcome.passed and not overridden:
                raise ActionError(f"capacity guard before taking {batch} out: {check.name}: "
                                  f"{outcome.detail}; {batch} was not touched")
            said = "passed" if outcome.passed else "overridden by break-glass"
            verdicts.append(f"{check.name}: {said} ({outcome.detail})")
        return "; ".join(verdicts)

    return guard


def _covered(guards: list[Mapping[str, Any]], inventory: Inventory) -> set[str]:
    nodes: set[str] = set()
    for guard in guards:
        if guard.get("whole_pool"):
            nodes |= inventory.slurm if guard.get("pool") == "slurm" else inventory.kubernetes
        else:
            nodes |= set(_names(guard.get("pool_of")))
    return nodes


def _names(value: Any) -> list[str]:
    """Node names from an argument: a hostlist, a comma list, or a list of either."""
    if value is None or value == "":
        return []
    if isinstance(value, (list, tuple)):
        return [name for item in value for name in _names(item)]
    try:
        return hostlist.expand(str(value))
    except ValueError:
        return [str(value)]  # not a hostlist: as it is (never covered by accident)


def _own_names(inventory: Inventory) -> dict[str, str]:
    """A node's name in Slurm or Kubernetes -> the bot's name for it."""
    back: dict[str, str] = {}
    for system in ("slurm", "kubernetes"):
        for own, other in inventory.names.get(system, {}).items():
            back.setdefault(other, own)
    return back
