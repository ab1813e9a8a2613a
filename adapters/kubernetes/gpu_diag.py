"""``k8s.gpu_diag``: DCGM's diagnostic (``dcgmi diag -r LEVEL``) on a node only in Kubernetes,
as a Job pinned to it (``nodeName``, the configured tolerations, every GPU of it), its result
read from the Job's condition and its pod's log (node_jobs.py). A diagnostic that fails or
does not finish keeps the node cordoned, marked as a failed check with the verdict; the Job
is deleted with its pod either way (the step's result keeps the log's tail). Configuration:
``gpu_diag``.
"""

from __future__ import annotations

import shlex
from typing import Any, ClassVar

from pydantic import Field

from adapters.actions import (
    ActionContext,
    ActionError,
    ActionResult,
    Seconds,
    StrictArguments,
)
from adapters.host import OUTPUT_LIMIT, verdict
from adapters.kubernetes.backend import Node
from adapters.kubernetes.base import KubernetesAction, NodeArguments
from adapters.kubernetes.node_jobs import NodeJob, job_name, kept_out
from kit.durations import format_duration

JOB_LABEL = "gpu-runbook-bot/gpu-diag"  # on the Job and its pod: the node it checks


class GpuDiagArguments(NodeArguments):
    level: int | None = Field(default=None, ge=1, le=4)  # null: gpu_diag.level
    timeout: Seconds | None = Field(default=None, le=6 * 3600.0)  # null: gpu_diag.timeout
    poll: Seconds = Field(default=2.0, le=60)


class GpuDiagAction(KubernetesAction):
    name: ClassVar[str] = "k8s.gpu_diag"
    Arguments: ClassVar[type[StrictArguments]] = GpuDiagArguments

    def _argv(self, args: GpuDiagArguments) -> list[str]:
        return [*self.config.gpu_diag.command, str(args.level or self.config.gpu_diag.level)]

    def plan(self, args: GpuDiagArguments) -> list[str]:
        diag = self.config.gpu_diag
        timeout = args.timeout or diag.timeout
        return [f"kubectl create job -n {diag.namespace} gpu-diag-<execution>-{args.node} "
                f"--image={diag.image} -- {shlex.join(self._argv(args))}  # pinned to "
                f"{args.node} (nodeName), all its GPUs, {len(diag.tolerations)} toleration(s)",
                f"wait until the Job completes (at most {format_duration(timeout)}); if it "
                f"fails or does not finish, {args.node} stays cordoned, marked as a failed "
                "check with the diagnostic's failing line; the Job is deleted either way"]

    def _job(self, args: GpuDiagArguments, node: Node, execution_id: int) -> NodeJob:
        return NodeJob(self.backend, self.config.gpu_diag, self._sleep,
                       job_name("gpu-diag", execution_id, node.name), node, self._argv(args),
                       "dcgm-diag", JOB_LABEL, args.timeout or self.config.gpu_diag.timeout)

    def run(self, args: GpuDiagArguments, ctx: ActionContext) -> ActionResult:
        node = self.backend.get_node(args.node)
        job = self._job(args, node, ctx.execution_id)
        done, log = job.run(ctx, args.poll, "dcgmi diag", "dcgmi diag did not finish")
        details: dict[str, Any] = {"node": args.node, "job": job.name, "outcome": done.outcome,
                                   "argv": job.argv, "log": log[-OUTPUT_LIMIT:]}
        if done.outcome != "complete":
            why = verdict(log, done.message or done.reason, 1)
            raise ActionError(self._kept_out(node, f"dcgmi diag failed: {why}", ctx))
        return ActionResult(f"{args.node} passed {shlex.join(job.argv)} "
                            f"(Job {self.config.gpu_diag.namespace}/{job.name})", details,
                            changed=False)

    def _kept_out(self, node: Node, why: str, ctx: ActionContext) -> str:
        return kept_out(self.backend, node, why, ctx)
