"""Per-node states of a step over many nodes (a fleet drain), published through
``ActionContext.status`` as a count and a hostlist per state: what the execution's one chat
message and ``runbook status`` show, instead of a thread line per node.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from adapters.actions import ActionContext
from kit.hostlist import compress

PUBLISH_EVERY = 1.0  # seconds: at most one status a second reaches the engine
MAX_NOTES = 5  # nodes whose note (what blocks them, why they failed) is published


class NodeStates:
    """The state of each node of a set; ``states`` lists them in the order shown, the first
    being the goal (``drained 40/128``). ``publish()`` hands a snapshot to ``ctx.status``
    when something changed, at most every ``PUBLISH_EVERY`` seconds unless forced."""

    def __init__(self, nodes: Iterable[str], ctx: ActionContext, states: tuple[str, ...],
                 start: str, clock: Callable[[], float] | None = None) -> None:
        self.state = dict.fromkeys(nodes, start)
        self.notes: dict[str, str] = {}
        self.states = states
        self._ctx = ctx
        self._clock = clock or (lambda: time.monotonic())  # looked up when called
        self._changed = True
        self._published = float("-inf")

    def set(self, node: str, state: str, note: str = "") -> None:
        if self.state.get(node) != state or self.notes.get(node, "") != note:
            self.state[node] = state
            self._changed = True
            if note:
                self.notes[node] = note
            else:
                self.notes.pop(node, None)

    def nodes_in(self, state: str) -> list[str]:
        return [node for node, now in self.state.items() if now == state]

    def snapshot(self) -> dict[str, Any]:
        """``{"total": 128, "states": [[state, count, hostlist], ...], "notes": {...}}``."""
        by_state: dict[str, list[str]] = {state: [] for state in self.states}
        for node, state in self.state.items():
            by_state.setdefault(state, []).append(node)
        return {
            "total": len(self.state),
            "states": [[state, len(nodes), compress(nodes) if nodes else ""]
                       for state, nodes in by_state.items()],
            "notes": dict(list(self.notes.items())[:MAX_NOTES]),
        }

    def publish(self, force: bool = False) -> None:
        now = self._clock()
        if self._changed and (force or now - self._published >= PUBLISH_EVERY):
            self._ctx.status(self.snapshot())
            self._changed = False
            self._published = now
