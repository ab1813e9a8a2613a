"""``k8s.gpu_identity``: swap-gpu's evidence on a node only in Kubernetes. nvidia-smi
(``kubernetes.gpu_diag.identity_command``) runs as a Job pinned to the node (node_jobs.py);
the replaced GPU's UUID and serial it reads must be DCGM's (Prometheus) and none of those the
``prom.gpu_identity`` step read before the swap. Anything else, or a Job that fails or does
not finish, keeps the node cordoned, marked as a failed check with the verdict; the
evidence goes in the step's result (and so the audit log).
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
from adapters.host import verdict
from adapters.kubernetes.base import KubernetesAction, NodeArguments
from adapters.kubernetes.node_jobs import NodeJob, job_name, kept_out
from adapters.prometheus.backend import PrometheusError
from adapters.prometheus.gate import GpuGated, gate_for
from adapters.prometheus.identity import (
    GpuIdentity,
    dcgm_identities,
    parse_identities,
    swap_verdict,
)
from kit.durations import format_duration

JOB_LABEL = "gpu-runbook-bot/gpu-identity"  # on the Job and its pod: the node it reads
DCGM_NAME = r"^$|^[A-Za-z0-9][A-Za-z0-9._-]*$"


class GpuIdentityArguments(NodeArguments):
    gpu: int = Field(ge=0, le=15)
    dcgm_name: str = Field(default="", pattern=DCGM_NAME)
    before: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")  # the prom.gpu_identity step
    timeout: Seconds = Field(default=300.0, le=3600)
    poll: Seconds = Field(default=2.0, le=60)


class GpuIdentityAction(GpuGated, KubernetesAction):
    name: ClassVar[str] = "k8s.gpu_identity"
    Arguments: ClassVar[type[StrictArguments]] = GpuIdentityArguments

    def plan(self, args: GpuIdentityArguments) -> list[str]:
        gate_for(self.prometheus, args.dcgm_name or args.node, 0,
                 f"the swap evidence of {args.node}")  # refused without Prometheus
        diag = self.config.gpu_diag
        return [f"kubectl create job -n {diag.namespace} gpu-identity-<execution>-{args.node} "
                f"--image={diag.image} -- {shlex.join(diag.identity_command)}  # pinned to "
                f"{args.node} (nodeName), at most {format_duration(args.timeout)}",
                f"GPU {args.gpu}'s UUID and serial it reads must be DCGM's and not those step "
                f"{args.before} read before the swap; else {args.node} stays cordoned, marked "
                "as a failed check with the verdict; the Job is deleted either way"]

    def run(self, args: GpuIdentityArguments, ctx: ActionContext) -> ActionResult:
        prometheus = gate_for(self.prometheus, args.dcgm_name or args.node, 0,
                              f"the swap evidence of {args.node}").backend
        node = self.backend.get_node(args.node)
        job = NodeJob(self.backend, self.config.gpu_diag, self._sleep,
                      job_name("gpu-identity", ctx.execution_id, node.name), node,
                      list(self.config.gpu_diag.identity_command), "gpu-identity", JOB_LABEL,
                      args.timeout)
        done, log = job.run(ctx, args.poll, "nvidia-smi", "GPU swap: nvidia-smi did not finish")
        before = [GpuIdentity(**b) for b in (ctx.earlier(args.before) or {}).get("before", [])]
        after = parse_identities(log).get(args.gpu) if done.outcome == "complete" else None
        try:
            dcgm = dcgm_identities(prometheus, args.dcgm_name or args.node, args.gpu)
            why = swap_verdict(args.gpu, before, after, dcgm)
        except PrometheusError as exc:
            dcgm, why = [], f"Prometheus did not answer for DCGM's GPU {args.gpu}: {exc}"
        if done.outcome != "complete":
            why = f"nvidia-smi failed: {verdict(log, done.message or done.reason, 1)}"
        evidence: dict[str, Any] = {"gpu": args.gpu, "before": [b.as_dict() for b in before],
                                    "after": after.as_dict() if after else None,
                                    "dcgm": [d.as_dict() for d in dcgm], "job": job.name}
        if why is not None:
            raise ActionError(kept_out(self.backend, node, f"GPU swap: {why}", ctx))
        assert after is not None
        return ActionResult(f"{args.node}: GPU {args.gpu} replaced: {before[0].show()} -> "
                            f"{after.show()}", {"swap_evidence": evidence}, changed=False)
