"""Whose cordon a Kubernetes node's is: the annotations the bot writes, as Slurm's drain
reasons carry its mark (adapters/slurm/reasons.py).

``gpu-runbook-bot/cordoned-by`` names the owner (``execution-N``, ``window-N``); a node the
bot left cordoned because a check failed also carries ``gpu-runbook-bot/failed-check`` with
the verdict. A cordon without the bot's annotation is somebody else's (a person, the GPU
Operator's upgrade controller): a routine return to service leaves it, as it leaves a
failed check's, unless the request says ``override_drains=true`` (break-glass)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from adapters.kubernetes.backend import Node

CORDONED_BY = "gpu-runbook-bot/cordoned-by"  # who cordoned a node: execution-N, window-N
FAILED_CHECK = "gpu-runbook-bot/failed-check"  # why the bot keeps it cordoned: the verdict
MAX_VERDICT = 200  # what the bot writes at most (people read less)


def owner_of(ctx_execution_id: int) -> str:
    return f"execution-{ctx_execution_id}"


def cordon_patch(execution_id: int) -> dict[str, Any]:
    """Cordon, annotated with the execution: whose cordon it is, for the breaker and people."""
    return {"spec": {"unschedulable": True},
            "metadata": {"annotations": {CORDONED_BY: owner_of(execution_id)}}}


def uncordon_patch() -> dict[str, Any]:
    """Uncordon and drop the bot's annotations: nothing of the old cordon stays behind."""
    return {"spec": {"unschedulable": None},
            "metadata": {"annotations": {CORDONED_BY: None, FAILED_CHECK: None}}}


def failed_check_patch(execution_id: int, verdict: str) -> dict[str, Any]:
    """Keep a cordoned node out for a failed check, with the verdict people will read."""
    tail = f" ({owner_of(execution_id)})"
    text = verdict[:MAX_VERDICT - len(tail)].rstrip() + tail
    return {"metadata": {"annotations": {FAILED_CHECK: text}}}


def whose(node: Node) -> str:
    """Whose cordon it is, in words (for plans and refusals)."""
    owner = node.annotations.get(CORDONED_BY, "")
    verdict = node.annotations.get(FAILED_CHECK)
    if verdict:
        return f'cordoned by the bot for a failed check: "{verdict}"'
    if owner.startswith("execution-"):
        return f"cordoned by the bot ({owner.replace('-', ' ')})"
    if owner:
        return f"cordoned by {owner.replace('-', ' ')} (its owner lifts it)"
    return "cordoned by someone else (no gpu-runbook-bot annotation)"


def liftable(node: Node) -> bool:
    """A cordon a routine return to service may lift: one the bot made to work on the node,
    not for a failed check (a window's is lifted by the window)."""
    return (not node.unschedulable or (
        node.annotations.get(CORDONED_BY, "").startswith("execution-")
        and FAILED_CHECK not in node.annotations))


def not_liftable(nodes: Iterable[Node]) -> dict[str, str]:
    """Cordoned nodes a routine return to service must leave, with whose cordon it is."""
    return {node.name: whose(node) for node in nodes if not liftable(node)}


def made_by(node: Node, execution_id: int) -> bool:
    """This execution's own cordon, not kept for a failed check: what its undo lifts."""
    return (node.annotations.get(CORDONED_BY) == owner_of(execution_id)
            and FAILED_CHECK not in node.annotations)


def held_by(annotations: Mapping[str, str]) -> frozenset[int]:
    """The execution whose cordon it is (``gpu-runbook-bot/cordoned-by=execution-N``)."""
    owner = str(annotations.get(CORDONED_BY, ""))
    number = owner.removeprefix("execution-")
    return frozenset({int(number)}) if owner != number and number.isdigit() else frozenset()
