"""``k8s.gpu_gate``: a Kubernetes node's GPUs in DCGM (through Prometheus) before it is
uncordoned, as the Slurm health check gates a Slurm node (adapters/prometheus/gate.py):
every GPU it should have (GPU Feature Discovery's ``nvidia.com/gpu.count``, else its
allocatable) reports, no GPU alert fires, no XID or ECC counter rises while it settles. A
failure keeps the node cordoned, marked as a failed check with the verdict."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from adapters.actions import ActionContext, ActionError, ActionResult, Seconds, StrictArguments
from adapters.kubernetes import cordons
from adapters.kubernetes.backend import KubernetesError, Node
from adapters.kubernetes.base import NODE_NAME, KubernetesAction
from adapters.prometheus.gate import GateFailed, GpuGate, GpuGated, gate_for
from kit.durations import format_duration

GPU_COUNT_LABEL = "nvidia.com/gpu.count"  # GPU Feature Discovery


class GpuGateArguments(StrictArguments):
    node: str = Field(pattern=NODE_NAME, description="Kubernetes node name")
    dcgm_name: str = Field(default="", pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9._-]*$")
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
