"""A step over many nodes, compactly: ``drained 40/128 gpu[001-040] · draining gpu[041-056] ·
blocked by PDB gpu057 · failed —``, from the node states the action publishes
(``ActionContext.status``, kept on the step) or leaves in its result's details.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_HOSTLIST = 80  # characters of one state's hostlist before it is cut
MAX_NOTE = 120  # characters of a node's note (what blocks it): a Slack section holds 3,000


def node_status(result: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The node states of a step row's result: published while running, or its details'."""
    if not result:
        return None
    status = result.get("status") or (result.get("details") or {}).get("status")
    return status if isinstance(status, Mapping) and status.get("states") else None


def fleet_line(status: Mapping[str, Any]) -> str:
    parts = []
    total = status.get("total", 0)
    for index, entry in enumerate(status.get("states") or []):
        state, count, hosts = str(entry[0]), int(entry[1]), str(entry[2])
        if len(hosts) > MAX_HOSTLIST:
            hosts = hosts[:MAX_HOSTLIST] + "…"
        counted = f" {count}/{total}" if index == 0 else (f" {count}" if count else "")
        parts.append(f"{state}{counted} {hosts or '—'}")
    notes = status.get("notes") or {}
    line = " · ".join(parts)
    if notes:
        line += " (" + "; ".join(f"{node}: {str(why)[:MAX_NOTE]}"
                                 for node, why in list(notes.items())[:3]) + ")"
    return line
