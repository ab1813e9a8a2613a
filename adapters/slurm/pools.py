"""``slurm.pool_leave`` and ``slurm.pool_join``: a node leaves the Slurm pool for another
(handoff-node) and comes back.

Leaving: drained with the pool's reason (``pool: kubernetes ...``) and, when the site uses
one, without the feature its jobs ask for (``--constraint``). Joining: the feature back
and, for a node drained with the pool's reason, resumed; a node drained for anything else
(a failed health check) stays drained.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from pydantic import Field, field_validator

from adapters.actions import ActionContext, ActionError, ActionResult, Seconds, StrictArguments
from adapters.slurm import commands
from adapters.slurm.actions import NAME_PATTERN, _check_text, _SlurmAction
from adapters.slurm.backend import NodeInfo

FEATURE_PATTERN = r"^([A-Za-z0-9_.-]{1,64})?$"  # empty: the site uses no feature


class PoolArguments(StrictArguments):
    node: str = Field(pattern=NAME_PATTERN)
    prefix: str = Field(min_length=1, max_length=64,
                        description="the pool's drain reason starts with it")
    feature: str = Field(default="", pattern=FEATURE_PATTERN)

    @field_validator("prefix")
    @classmethod
    def _one_line(cls, value: str) -> str:
        return _check_text(value)


class LeaveArguments(PoolArguments):
    reason: str = Field(min_length=1, max_length=256)

    @field_validator("reason")
    @classmethod
    def _reason(cls, value: str) -> str:
        return _check_text(value)


class JoinArguments(PoolArguments):
    wait_timeout: Seconds = 60.0


def _feature_line(node: str, feature: str, add: bool) -> str:
    change = f"with {feature} added" if add else f"without {feature}"
    return (f"scontrol update NodeName={node} AvailableFeatures=<its features {change}> "
            "ActiveFeatures=<the same>")


class PoolLeaveAction(_SlurmAction):
    """Refuses a node drained for another reason: it is out of service, not free to go."""

    name: ClassVar[str] = "slurm.pool_leave"
    takes_out: ClassVar[tuple[str, ...]] = ("node",)
    Arguments: ClassVar[type[StrictArguments]] = LeaveArguments
    needs: ClassVar[tuple[str, ...]] = ("update_nodes", "update_features")

    def plan(self, args: LeaveArguments) -> list[str]:
        lines = [commands.show(commands.update_nodes([args.node], "DRAIN", args.reason))]
        if args.feature:
            lines.append(_feature_line(args.node, args.feature, add=False))
        return lines

    def run(self, args: LeaveArguments, ctx: ActionContext) -> ActionResult:
        (node,) = self._read([args.node], with_jobs=False)
        done: list[str] = []
        if "DRAIN" in node.flags and not node.reason.startswith(args.prefix):
            raise ActionError(
                f'{args.node} is drained for another reason ("{node.reason}"): it is out of '
                f"service, not free to serve another pool; resume it (resume-node) first")
        if "DRAIN" not in node.flags:
            self.backend.update_nodes([args.node], "DRAIN", args.reason)
            done.append(f'drained (reason "{args.reason}")')
        if args.feature and args.feature in node.features:
            self.backend.update_features([args.node], sorted(node.features - {args.feature}))
            done.append(f"feature {args.feature} removed")
        details: dict[str, Any] = {"node": args.node, "done": done,
                                   "features_before": sorted(node.features)}
        if not done:
            return ActionResult(f"{args.node} already out of the Slurm pool", details,
                                changed=False)
        return ActionResult(f"{args.node} out of the Slurm pool: {', '.join(done)}", details)


class PoolJoinAction(_SlurmAction):
    name: ClassVar[str] = "slurm.pool_join"
    Arguments: ClassVar[type[StrictArguments]] = JoinArguments
    needs: ClassVar[tuple[str, ...]] = ("update_nodes", "update_features")

    def plan(self, args: JoinArguments) -> list[str]:
        lines = [_feature_line(args.node, args.feature, add=True)] if args.feature else []
        return [*lines, commands.show(commands.update_nodes([args.node], "RESUME", None))
                + f' (only if drained with a reason starting "{args.prefix}")']

    def run(self, args: JoinArguments, ctx: ActionContext) -> ActionResult:
        (node,) = self._read([args.node], with_jobs=False)
        done: list[str] = []
        if args.feature and args.feature not in node.features:
            self.backend.update_features([args.node], sorted(node.features | {args.feature}))
            done.append(f"feature {args.feature} added")
        kept = ""
        if "DRAIN" in node.flags and node.reason.startswith(args.prefix):
            self.backend.update_nodes([args.node], "RESUME", None)
            done.append("resumed")
            self._responding(args, ctx)
        elif "DRAIN" in node.flags:
            kept = f'; left drained: "{node.reason}"'
        details: dict[str, Any] = {"node": args.node, "done": done, "reason": node.reason}
        if not done:
            return ActionResult(f"{args.node} already in the Slurm pool{kept}", details,
                                changed=False)
        return ActionResult(f"{args.node} back in the Slurm pool: {', '.join(done)}{kept}",
                            details)

    def _responding(self, args: JoinArguments, ctx: ActionContext) -> list[NodeInfo]:
        started = time.monotonic()
        nodes = self._wait_nodes([args.node], ctx, args.wait_timeout, 0.5,
                                 lambda n: n.responding and "DRAIN" not in n.flags,
                                 "responding and undrained")
        ctx.progress(f"{args.node} resumed in {time.monotonic() - started:.1f}s")
        return nodes


POOL_ACTIONS: tuple[type[_SlurmAction], ...] = (PoolLeaveAction, PoolJoinAction)
