"""``slurm:`` checks: node states, accounts listed by slurmdbd, slurmctld's queue to slurmdbd.

    slurm: {nodes: "gpu[01-02]", state: drained}   # drained | in_service | idle | not_held
    slurm: {accounts: listed}                      # or a list of accounts that must exist
    slurm: {dbd_queue: empty}                      # job records held for slurmdbd were sent

Slurm errors fail the check with Slurm's words (fail closed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from adapters.actions import ActionError
from adapters.slurm import reasons
from adapters.slurm.backend import NodeInfo, SlurmBackend
from bot.execution.checks.core import Outcome
from bot.execution.planning import PlannedCheck
from kit import hostlist

NODE_STATES: dict[str, Callable[[NodeInfo], bool]] = {
    "drained": lambda n: "DRAIN" in n.flags and not n.jobs and n.state in ("idle", "down"),
    "in_service": lambda n: n.responding and "DRAIN" not in n.flags and n.state != "down",
    "idle": lambda n: n.state == "idle" and "DRAIN" not in n.flags and n.responding,
    # no new job lands there (drained, or draining while its jobs finish), or it is down
    "out_of_service": lambda n: "DRAIN" in n.flags or n.state == "down",
    # no drain a routine return must leave: someone else's, or the bot's for a failed check
    "not_held": lambda n: "DRAIN" not in n.flags or reasons.blocking(n.reason) is None,
}


class SlurmEvaluator:
    def __init__(self, backend: SlurmBackend) -> None:
        self._backend = backend

    def __call__(self, check: PlannedCheck, deadline: float) -> Outcome:
        spec: dict[str, Any] = dict(check.spec["slurm"])
        try:
            if "nodes" in spec:
                return self._nodes(str(spec["nodes"]), str(spec.get("state", "")))
            if "accounts" in spec:
                return self._accounts(spec["accounts"])
            if "dbd_queue" in spec:
                size = self._backend.dbd_queue()
                return Outcome(size == 0, size, f"{size} record(s) waiting for slurmdbd")
        except (ActionError, ValueError) as exc:
            return Outcome(False, None, str(exc))
        return Outcome(False, None, f"unknown slurm check {sorted(spec)}: use nodes+state, "
                                    "accounts or dbd_queue")

    def _nodes(self, expression: str, state: str) -> Outcome:
        wanted = NODE_STATES.get(state)
        if wanted is None:
            return Outcome(False, None, f'unknown state "{state}": one of '
                                        f"{', '.join(NODE_STATES)}")
        names = hostlist.expand(expression)
        found = {node.name: node for node in self._backend.nodes(names)}
        wrong = [found[name].describe() if name in found else f"{name}: unknown to Slurm"
                 for name in names if name not in found or not wanted(found[name])]
        if wrong:
            said = ("held out by someone else or for a failed check" if state == "not_held"
                    else f"not {state}")
            return Outcome(False, len(wrong), f"{said}: " + "; ".join(wrong[:10]))
        return Outcome(True, 0, f"{expression} {state}")

    def _accounts(self, wanted: Any) -> Outcome:
        listed = self._backend.accounts()
        if isinstance(wanted, list):
            missing = sorted(set(map(str, wanted)) - set(listed))
            detail = f"missing {', '.join(missing)}" if missing else f"{len(listed)} accounts"
            return Outcome(not missing, len(listed), detail)
        return Outcome(bool(listed), len(listed), f"sacctmgr lists {len(listed)} account(s)")
