"""A node a run found faulty stays out in both pools: as a failed or cancelled run ends, a node
Slurm holds for this execution's failed check (``(execution N: failed check)``) that is
cordoned in Kubernetes (by this run, an earlier drain-node, anyone) gets that cordon marked
as a failed check too, so no routine return (resume-nodes, an undo) lifts the Kubernetes
side of a node Slurm keeps out. A schedulable node is not taken out here (that is a plan's).

Bounded like the ending's other reads (a hung API delays the end by READ_SECONDS at most);
what it could not mark is said, never raised: the ending stands."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from adapters.kubernetes import cordons
from adapters.slurm import reasons
from bot.runbooks.params import Inventory

READ_SECONDS = 5.0


def carry_over(backends: Mapping[str, Any], inventory: Inventory, nodes: Sequence[str],
               execution_id: int) -> str:
    """Mark the Kubernetes cordons of nodes Slurm keeps for this run's failed check; returns
    what it did, for the ending's message ("" when nothing was to do)."""
    both = [n for n in nodes if n in inventory.slurm and n in inventory.kubernetes]
    slurm, kubernetes = backends.get("slurm"), backends.get("kubernetes")
    if not both or slurm is None or kubernetes is None:
        return ""
    box: dict[str, str] = {}
    worker = threading.Thread(target=lambda: box.update(said=_mark(
        slurm, kubernetes, inventory, both, execution_id)), daemon=True, name="fault-holds")
    worker.start()
    worker.join(READ_SECONDS)
    return box.get("said", f"the Kubernetes cordons of {', '.join(both)} could not be checked "
                           f"in {READ_SECONDS:g} s: look at them before uncordoning")


def _mark(slurm: Any, kubernetes: Any, inventory: Inventory, nodes: Sequence[str],
          execution_id: int) -> str:
    slurm_names = {inventory.names.get("slurm", {}).get(n, n): n for n in nodes}
    try:
        faulty = {slurm_names[i.name]: _verdict(i.reason, execution_id)
                  for i in slurm.nodes(list(slurm_names), with_jobs=False)
                  if i.name in slurm_names and "DRAIN" in i.flags}
    except Exception as exc:  # the ending stands; the text says what could not be read
        return f"Slurm could not be read to keep faulty nodes out in Kubernetes ({exc})"
    marked, problems = [], []
    for node, verdict in faulty.items():
        if verdict is None:
            continue
        name = inventory.names.get("kubernetes", {}).get(node, node)
        try:
            seen = kubernetes.get_node(name)
            if seen.unschedulable and cordons.FAILED_CHECK not in seen.annotations:
                kubernetes.patch_node(name, cordons.failed_check_patch(
                    execution_id, f"Slurm kept it out: {verdict}"), strategic=True)
                marked.append(node)
        except Exception as exc:  # said, never raised
            problems.append(f"{node} ({exc})")
    said = (f"{', '.join(marked)} kept cordoned in Kubernetes for the failed check"
            if marked else "")
    if problems:
        said += ("; " if said else "") + ("could not mark the Kubernetes cordon of "
                                          + ", ".join(problems))
    return said


def _verdict(reason: str, execution_id: int) -> str | None:
    """This execution's failed-check text in a Slurm reason, if it wrote one."""
    return next((p.said() for p in reasons.parts(reason)
                 if p.execution == execution_id and p.failed_check), None)
