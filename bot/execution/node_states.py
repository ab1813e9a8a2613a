"""What state each node of a run that failed or was cancelled is in, in each pool, read once
as it ends, with the next command where one follows: the message on-call reads then says
where every node stands (drained and why, cordoned or not), not only what went wrong.

It only reads. A system that cannot be read says so in the text; it never changes the
ending. A run over more than MAX_NODES nodes names its count instead (a fleet run's status
lists its nodes)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from adapters.kubernetes import cordons
from adapters.slurm import reasons
from adapters.slurm.backend import NodeInfo
from bot.runbooks.params import Inventory

MAX_NODES = 8
READ_SECONDS = 5.0  # a system that does not answer in this time is said to be unknown


def describe(backends: Mapping[str, Any], inventory: Inventory, nodes: Sequence[str]) -> str:
    """``state now: gpu05: Slurm drained ("XID 94 (execution 12)"), Kubernetes cordoned;
    next: ...``; "" when the run names no node or too many."""
    if not nodes or len(nodes) > MAX_NODES:
        return ""
    slurm = _within("Slurm", [n for n in nodes if n in inventory.slurm],
                    lambda: _slurm(backends.get("slurm"), inventory, nodes))
    kubernetes = _within("Kubernetes", [n for n in nodes if n in inventory.kubernetes],
                         lambda: _kubernetes(backends.get("kubernetes"), inventory, nodes))
    said = []
    for node in nodes:
        bits = [text for text in (slurm.get(node), kubernetes.get(node)) if text]
        if bits:
            said.append(f"{node}: {', '.join(bits)}")
    return "state now: " + "; ".join(said) if said else ""


def _within(system: str, nodes: Sequence[str],
            read: Callable[[], dict[str, str]]) -> dict[str, str]:
    """``read()`` in a thread of its own, given READ_SECONDS: a hung daemon delays the end of
    a failed run by that much at most (the thread is left to finish on its own)."""
    box: dict[str, dict[str, str]] = {}
    worker = threading.Thread(target=lambda: box.update(found=read()), daemon=True,
                              name="node-states")
    worker.start()
    worker.join(READ_SECONDS)
    if "found" in box:
        return box["found"]
    return dict.fromkeys(nodes, f"{system} state unknown (no answer in {READ_SECONDS:g} s)")


def _slurm(backend: Any, inventory: Inventory, nodes: Sequence[str]) -> dict[str, str]:
    mine = [n for n in nodes if n in inventory.slurm]
    if backend is None or not mine:
        return {}
    named = {inventory.names.get("slurm", {}).get(n, n): n for n in mine}
    try:
        found = {named.get(i.name, i.name): i for i in backend.nodes(list(named),
                                                                      with_jobs=False)}
    except Exception as exc:  # the ending stands; the text says what could not be read
        return dict.fromkeys(mine, f"Slurm state unknown ({exc})")
    return {node: "Slurm " + _slurm_text(found[node], node) if node in found
            else "Slurm: not listed" for node in mine}


def _slurm_text(info: NodeInfo, node: str) -> str:
    if "DRAIN" in info.flags:
        held = reasons.blocking(info.reason)
        state = "draining" if info.draining else "drained"
        nxt = (f"; next: repair it (swap-gpu, reset-gpu), then resume-node node={node} "
               "override_drains=true (break-glass)" if held
               else f"; next: resume-node node={node} once it is serviced")
        return f'{state} ("{info.reason}"){nxt}'
    if info.state == "down" or not info.responding:
        return f"{info.state}, not responding"
    return "in service" + (" (in a reservation)" if info.flags & {"MAINTENANCE", "RESERVED"}
                           else "")


def _kubernetes(backend: Any, inventory: Inventory, nodes: Sequence[str]) -> dict[str, str]:
    mine = [n for n in nodes if n in inventory.kubernetes]
    if backend is None or not mine:
        return {}
    named = {inventory.names.get("kubernetes", {}).get(n, n): n for n in mine}
    found: dict[str, str] = {}
    for name, node in named.items():
        try:
            seen = backend.get_node(name)
        except Exception as exc:  # the ending stands; the text says what could not be read
            found[node] = f"Kubernetes state unknown ({exc})"
            continue
        found[node] = "Kubernetes " + (cordons.whose(seen) if seen.unschedulable
                                       else "schedulable")
    return found
