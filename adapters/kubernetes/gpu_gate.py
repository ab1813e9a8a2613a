"""``k8s.gpu_gate`` (``k8s.gpu_gate_nodes``: a set at once): a Kubernetes node's GPUs in
DCGM (through Prometheus) before it is uncordoned, as the Slurm health check gates a Slurm
node (adapters/prometheus/gate.py):
every GPU it should have (GPU Feature Discovery's ``nvidia.com/gpu.count``, else its
allocatable) reports, no GPU alert fires, no XID or ECC counter rises while it settles. A
failure keeps the node cordoned, marked as a failed check with the verdict."""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import Field, field_validator

from adapters.actions import ActionContext, ActionError, ActionResult, Seconds, StrictArguments
from adapters.kubernetes import cordons
from adapters.kubernetes.backend import KubernetesError, Node
from adapters.kubernetes.base import NODE_NAME, KubernetesAction
from adapters.prometheus.gate import GateFailed, GpuGate, GpuGated, gate_for, gate_nodes
from kit.durations import format_duration

GPU_COUNT_LABEL = "nvidia.com/gpu.count"  # GPU Feature Discovery
DCGM_NAME = r"^$|^[A-Za-z0-9][A-Za-z0-9._-]*$"


class GpuGateArguments(StrictArguments):
    node: str = Field(pattern=NODE_NAME, description="Kubernetes node name")
    dcgm_name: str = Field(default="", pattern=DCGM_NAME)
    settle: Seconds | None = Field(default=None, le=3600)  # null: prometheus.gpu_settle


class GpuGateAction(GpuGated, KubernetesAction):
    name: ClassVar[str] = "k8s.gpu_gate"
    Arguments: ClassVar[type[StrictArguments]] = GpuGateArguments


    def _gate(self, args: GpuGateArguments, node: Node) -> GpuGate:
        return gate_for(self.prometheus, args.dcgm_name or args.node, expected(node),
                        f"returning {args.node}")

    def plan(self, args: GpuGateArguments) -> list[str]:
        try:
            node = self.backend.get_node(args.node)
        except KubernetesError as exc:
            return [f"{args.node}'s GPUs in DCGM, counted when it runs ({exc} now)"]
        settle = self.settle_for(args.settle)
        return [self._gate(args, node).describe(settle).replace("drained", "kept cordoned")]

    def run(self, args: GpuGateArguments, ctx: ActionContext) -> ActionResult:
        node = self.backend.get_node(args.node)
        gate = self._gate(args, node)
        settle = self.settle_for(args.settle)
        try:
            reads = gate.check(settle, ctx, self._sleep)
        except GateFailed as exc:
            raise ActionError(f"{args.node}'s GPUs did not pass: {exc}"
                              + self._keep_out(node, str(exc), ctx)) from exc
        return ActionResult(f"{args.node}: its {gate.expect} GPU(s) report in DCGM with no new "
                            f"XID or ECC error for {format_duration(settle)}",
                            {"node": args.node, "reads": reads}, changed=False)

    def _keep_out(self, node: Node, verdict: str, ctx: ActionContext) -> str:
        if not node.unschedulable:
            return f"; {node.name} is not cordoned: cordon it (kubectl cordon {node.name})"
        try:
            self.backend.patch_node(node.name, cordons.failed_check_patch(
                ctx.execution_id, f"GPU telemetry: {verdict}"), strategic=True)
        except KubernetesError as exc:
            return f"; {node.name} stays cordoned (could not mark it as failed: {exc})"
        return f"; {node.name} stays cordoned, marked as a failed check"


def expected(node: Node) -> int:
    """The GPUs the node should have: GFD's count label, else what it offers."""
    label = node.labels.get(GPU_COUNT_LABEL, "")
    return int(label) if label.isdigit() else node.gpus_allocatable


class GpuGateNodesArguments(StrictArguments):
    # Kubernetes node name -> its name in DCGM's Hostname ("" or absent: the same)
    nodes: dict[str, str] = Field(min_length=1, max_length=1000)
    settle: Seconds | None = Field(default=None, le=3600)  # null: prometheus.gpu_settle
    # only the nodes cordoned by this owner (window-12): those its uncordon returns
    owner: str | None = Field(default=None, pattern=r"^[a-z]+-\d+$")
    # a failing node in service is cordoned (a driver rollout returned it): else only named
    cordon: bool = False
    fail_on_kept: bool = False  # the step fails naming the nodes kept out

    @field_validator("nodes")
    @classmethod
    def _names(cls, value: dict[str, str]) -> dict[str, str]:
        for name, dcgm in value.items():
            if not re.fullmatch(NODE_NAME, name) or not re.fullmatch(DCGM_NAME, dcgm):
                raise ValueError(f"{name}: {dcgm!r} is not a node name and its DCGM name")
        return value


class GpuGateNodesAction(GpuGated, KubernetesAction):
    """The gate over a set of nodes at once: before they are uncordoned (close-window) a
    node that fails stays cordoned, marked as a failed check with the verdict (so the
    uncordon after leaves it); after the GPU Operator returned them (a driver rollout,
    ``cordon``) a failing node is cordoned and marked. ``kept_out`` in the result names
    them for the step that reports (chat.notify), or the step fails (``fail_on_kept``)."""

    name: ClassVar[str] = "k8s.gpu_gate_nodes"
    Arguments: ClassVar[type[StrictArguments]] = GpuGateNodesArguments

    def plan(self, args: GpuGateNodesArguments) -> list[str]:
        gate_for(self.prometheus, ", ".join(args.nodes), 0, "returning the nodes")
        which = f" cordoned by {args.owner}" if args.owner else ""
        return [f"DCGM in Prometheus for {', '.join(args.nodes)}{which} (all at once): every GPU "
                "of each (nvidia.com/gpu.count) reports, no GPU alert fires, and for "
                f"{format_duration(self.settle_for(args.settle))} no XID or ECC counter "
                "rises; a node that fails " + ("is cordoned" if args.cordon else
                                                "stays cordoned")
                + ", marked as a failed check" + (", and the step fails naming it"
                                                  if args.fail_on_kept else "")]

    def run(self, args: GpuGateNodesArguments, ctx: ActionContext) -> ActionResult:
        prometheus = gate_for(self.prometheus, ", ".join(args.nodes), 0,
                              "returning the nodes").backend
        found = {name: node for name in args.nodes
                 if (node := self.backend.get_node(name)).annotations.get(cordons.CORDONED_BY)
                 == args.owner or args.owner is None}
        if not found:
            return ActionResult(f"none of {', '.join(args.nodes)} is cordoned by {args.owner}",
                                {"kept_out": {}}, changed=False)
        dcgm = {name: args.nodes[name] or name for name in found}
        expect = {dcgm[name]: expected(node) for name, node in found.items()}
        failed = gate_nodes(prometheus, expect, self.settle_for(args.settle), ctx,
                            self._sleep)
        kept = {name: failed[dcgm[name]] for name in found if dcgm[name] in failed}
        notes = [self._keep_out(found[name], verdict, ctx, args.cordon)
                 for name, verdict in kept.items()]
        if not kept:
            return ActionResult(f"the GPUs of {', '.join(found)} passed",
                                {"kept_out": {}}, changed=False)
        text = "KEPT OUT: " + "; ".join(f"{name} ({verdict}{note})" for (name, verdict), note
                                        in zip(kept.items(), notes, strict=True))
        if args.fail_on_kept:
            raise ActionError(text)
        return ActionResult(text, {"kept_out": kept}, changed=True)

    def _keep_out(self, node: Node, verdict: str, ctx: ActionContext, cordon: bool) -> str:
        if not node.unschedulable and not cordon:
            return f"; not cordoned: cordon it (kubectl cordon {node.name})"
        patch = cordons.failed_check_patch(ctx.execution_id, f"GPU telemetry: {verdict}")
        if not node.unschedulable:  # in service again: out, as this execution's cordon
            cordon_now = cordons.cordon_patch(ctx.execution_id)
            patch = {"spec": cordon_now["spec"], "metadata": {"annotations": {
                **cordon_now["metadata"]["annotations"], **patch["metadata"]["annotations"]}}}
        self.backend.patch_node(node.name, patch, strategic=True)
        return ""
