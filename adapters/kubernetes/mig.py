"""The ``gpu_operator.*`` MIG actions: set a node's ``nvidia.com/mig.config`` label, follow the
MIG Manager's ``nvidia.com/mig.config.state`` and wait for the node's MIG resources.

The MIG Manager (GPU Operator, mixed strategy) applies the layout; these actions only label
the node and read it back, so cordon and drain stay the runbook's (k8s.cordon, k8s.drain).
"""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import Field, field_validator

from adapters.actions import ActionContext, ActionError, ActionResult, Seconds, StrictArguments
from adapters.kubernetes.backend import GPU_RESOURCE, Node
from adapters.kubernetes.base import NodeArguments
from adapters.kubernetes.gpu_operator import _OperatorAction
from kit.durations import format_duration

MIG_CONFIG = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"
GPU_COUNT = "nvidia.com/gpu.count"  # GPU Feature Discovery: physical GPUs, MIG or not
MIG_PREFIX = "nvidia.com/mig-"
LAYOUT = r"^[a-z0-9][a-z0-9._-]{0,62}$"
PROFILE = r"^[1-7]g\.[0-9]{1,3}gb$"
SUCCESS, FAILED = "success", "failed"


class MigLayoutArguments(NodeArguments):
    layout: str = Field(pattern=LAYOUT, description="a layout the MIG Manager knows")


class WaitMigStateArguments(MigLayoutArguments):
    timeout: Seconds = 600.0
    poll: Seconds = 1.0


class WaitMigResourcesArguments(NodeArguments):
    per_gpu: dict[str, int] = Field(description="MIG devices per GPU ({} for MIG off)")
    gpus: int | None = Field(default=None, ge=1, le=64)  # default: the node's gpu.count
    timeout: Seconds = 600.0
    poll: Seconds = 1.0

    @field_validator("per_gpu")
    @classmethod
    def _profiles(cls, value: dict[str, int]) -> dict[str, int]:
        for profile, count in value.items():
            if not re.match(PROFILE, profile) or not 1 <= count <= 7:
                raise ValueError(f"{profile}: {count} is not a MIG profile like 3g.40gb with "
                                 "1 to 7 devices per GPU")
        return value


def _failed(node: Node, layout: str | None) -> ActionError:
    wanted = layout or node.labels.get(MIG_CONFIG, "(none)")
    return ActionError(
        f"the MIG Manager reports {MIG_STATE}={FAILED} on {node.name} for layout {wanted}: "
        f"look at the nvidia-mig-manager pod's log on {node.name} (kubectl -n gpu-operator "
        "logs -l app=nvidia-mig-manager), fix the cause, or label the node with the layout "
        f"it had ({MIG_CONFIG}=...); the MIG layout of its GPUs may be half applied")


class SetMigLayoutAction(_OperatorAction):
    name: ClassVar[str] = "gpu_operator.set_mig_layout"
    takes_out: ClassVar[tuple[str, ...]] = ("node",)
    Arguments: ClassVar[type[StrictArguments]] = MigLayoutArguments

    def plan(self, args: MigLayoutArguments) -> list[str]:
        return [f"kubectl label node {args.node} {MIG_CONFIG}={args.layout} --overwrite"]

    def run(self, args: MigLayoutArguments, ctx: ActionContext) -> ActionResult:
        node = self.backend.get_node(args.node)
        previous = node.labels.get(MIG_CONFIG)
        details = {"node": args.node, "layout": args.layout, "previous_layout": previous,
                   "previous_state": node.labels.get(MIG_STATE)}
        if previous == args.layout:
            return ActionResult(f"{args.node} already labelled {MIG_CONFIG}={args.layout}",
                                details, changed=False)
        self.backend.patch_node(args.node, {"metadata": {"labels": {MIG_CONFIG: args.layout}}})
        ctx.progress(f"{args.node}: {MIG_CONFIG} {previous or '(none)'} -> {args.layout}")
        return ActionResult(f"labelled {args.node} {MIG_CONFIG}={args.layout} (was "
                            f"{previous or 'unset'})", details)


class WaitMigStateAction(_OperatorAction):
    """Until the state is success; failed stops at once. A success still standing from the
    previous layout (before the MIG Manager saw the new label) passes: the resources wait
    that follows (it too stops at failed) is what proves the new layout."""

    name: ClassVar[str] = "gpu_operator.wait_mig_state"
    Arguments: ClassVar[type[StrictArguments]] = WaitMigStateArguments

    def plan(self, args: WaitMigStateArguments) -> list[str]:
        return [f"wait until {args.node} reports {MIG_STATE}={SUCCESS} for {MIG_CONFIG}="
                f"{args.layout}; stop at {FAILED} (at most {format_duration(args.timeout)})"]

    def run(self, args: WaitMigStateArguments, ctx: ActionContext) -> ActionResult:
        seen: list[str] = []

        def check() -> tuple[bool, str, str]:
            node = self.backend.get_node(args.node)
            layout, state = node.labels.get(MIG_CONFIG), node.labels.get(MIG_STATE, "(none)")
            if layout != args.layout:
                raise ActionError(f"{args.node} is labelled {MIG_CONFIG}={layout or '(none)'}, "
                                  f"not {args.layout}: someone else changed it; look before "
                                  "running again")
            if state == FAILED:
                raise _failed(node, args.layout)
            if not seen or seen[-1] != state:
                seen.append(state)
            return state == SUCCESS, f"{args.node}: {MIG_STATE}={state}", f"{MIG_STATE}={state}"

        waited = self._wait(f"waiting for the MIG Manager on {args.node}", args.timeout,
                            args.poll, ctx, check)
        return ActionResult(f"{args.node}: {MIG_STATE}={SUCCESS} for {args.layout}",
                            {"node": args.node, "layout": args.layout, "states": seen,
                             "waited_seconds": round(waited, 1)}, changed=False)


class WaitMigResourcesAction(_OperatorAction):
    name: ClassVar[str] = "gpu_operator.wait_mig_resources"
    Arguments: ClassVar[type[StrictArguments]] = WaitMigResourcesArguments

    def plan(self, args: WaitMigResourcesArguments) -> list[str]:
        gpus = str(args.gpus) if args.gpus else f"the node's {GPU_COUNT}"
        if args.per_gpu:
            wanted = ", ".join(f"{MIG_PREFIX}{p}={n} per GPU" for p, n in
                               sorted(args.per_gpu.items())) + f" and no {GPU_RESOURCE}"
        else:
            wanted = f"{GPU_RESOURCE}=1 per GPU and no {MIG_PREFIX}*"
        return [f"wait until {args.node} advertises {wanted} (status.allocatable, times "
                f"{gpus}; at most {format_duration(args.timeout)}); stop at {MIG_STATE}="
                f"{FAILED}"]

    def expected(self, args: WaitMigResourcesArguments, node: Node) -> dict[str, int]:
        gpus = args.gpus or int(node.labels.get(GPU_COUNT, "0") or 0)
        if gpus < 1:
            raise ActionError(f"{node.name} has no {GPU_COUNT} label (GPU Feature Discovery "
                              "sets it): give gpus to the step")
        if not args.per_gpu:
            return {GPU_RESOURCE: gpus}
        return {f"{MIG_PREFIX}{p}": n * gpus for p, n in args.per_gpu.items()}

    def run(self, args: WaitMigResourcesArguments, ctx: ActionContext) -> ActionResult:
        found: dict[str, int] = {}
        wanted: dict[str, int] = {}

        def check() -> tuple[bool, str, str]:
            nonlocal found, wanted
            node = self.backend.get_node(args.node)
            if node.labels.get(MIG_STATE) == FAILED:
                raise _failed(node, None)
            wanted = self.expected(args, node)
            found = {k: v for k, v in node.nvidia_allocatable.items()
                     if v and (k == GPU_RESOURCE or k.startswith(MIG_PREFIX))}
            have = " ".join(f"{k}={v}" for k, v in sorted(found.items())) or "none"
            return found == wanted, f"{args.node} advertises {have}", (
                f"{args.node} advertises {have}; want "
                + " ".join(f"{k}={v}" for k, v in sorted(wanted.items())))

        waited = self._wait(f"waiting for the MIG resources of {args.node}", args.timeout,
                            args.poll, ctx, check)
        shown = ", ".join(f"{k}={v}" for k, v in sorted(found.items()))
        return ActionResult(f"{args.node} advertises {shown}",
                            {"node": args.node, "allocatable": found, "expected": wanted,
                             "waited_seconds": round(waited, 1)}, changed=False)


MIG_ACTIONS: tuple[type[_OperatorAction], ...] = (
    SetMigLayoutAction, WaitMigStateAction, WaitMigResourcesAction)
