"""``k8s.gpu_diag``: DCGM's diagnostic (``dcgmi diag -r LEVEL``) on a node only in Kubernetes,
as a Job pinned to it (``nodeName``, the configured tolerations, every GPU of it), its result
read from the Job's condition and its pod's log. A diagnostic that fails or does not finish
keeps the node cordoned, marked as a failed check with the verdict; the Job is deleted with
its pod either way (the step's result keeps the log's tail). Configuration: ``gpu_diag``.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import time
from typing import Any, ClassVar

from pydantic import Field

from adapters.actions import (
    ActionContext,
    ActionError,
    ActionResult,
    ActionStopped,
    ActionTimeout,
    Seconds,
    StrictArguments,
)
from adapters.host import OUTPUT_LIMIT, verdict
from adapters.kubernetes import cordons
from adapters.kubernetes.backend import Job, KubernetesConflict, KubernetesError, Node
from adapters.kubernetes.base import KubernetesAction, NodeArguments
from adapters.kubernetes.gpu_gate import expected
from kit.durations import format_duration

JOB_LABEL = "gpu-runbook-bot/gpu-diag"  # on the Job and its pod: the node it checks


class GpuDiagArguments(NodeArguments):
    level: int | None = Field(default=None, ge=1, le=4)  # null: gpu_diag.level
    timeout: Seconds | None = Field(default=None, le=6 * 3600.0)  # null: gpu_diag.timeout
    poll: Seconds = Field(default=2.0, le=60)


def job_name(execution_id: int, node: str) -> str:
    """One name per execution and node: a run resumed after a crash finds its own Job."""
    name = re.sub(r"[^a-z0-9-]", "-", f"gpu-diag-{execution_id}-{node}")[:63]
    return name.rstrip("-")


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

    def run(self, args: GpuDiagArguments, ctx: ActionContext) -> ActionResult:
        node = self.backend.get_node(args.node)
        diag = self.config.gpu_diag
        name = job_name(ctx.execution_id, args.node)
        try:
            self._create(name, node, args)
            job = self._finished(name, args, ctx)
            log = self._log(name)
        except ActionError as exc:  # a stop, the timeout, the API: the node stays out
            self._delete(name)
            kind = type(exc) if isinstance(exc, ActionStopped | ActionTimeout) else ActionError
            raise kind(self._kept_out(node, f"dcgmi diag did not finish: {exc}", ctx)) from exc
        self._delete(name)
        details: dict[str, Any] = {"node": args.node, "job": name, "outcome": job.outcome,
                                   "argv": self._argv(args), "log": log[-OUTPUT_LIMIT:]}
        if job.outcome != "complete":
            why = verdict(log, job.message or job.reason, 1)
            raise ActionError(self._kept_out(node, f"dcgmi diag failed: {why}", ctx))
        return ActionResult(f"{args.node} passed {shlex.join(self._argv(args))} "
                            f"(Job {diag.namespace}/{name})", details, changed=False)

    def _create(self, name: str, node: Node, args: GpuDiagArguments) -> None:
        # a conflict: this execution's own Job, from before a restart: wait for it
        with contextlib.suppress(KubernetesConflict):
            self.backend.create_job(self.config.gpu_diag.namespace, self._body(name, node, args))

    def _body(self, name: str, node: Node, args: GpuDiagArguments) -> dict[str, Any]:
        diag = self.config.gpu_diag
        gpus = str(expected(node))
        pod: dict[str, Any] = {
            "nodeName": node.name, "restartPolicy": "Never",
            "tolerations": [dict(t) for t in diag.tolerations],
            "containers": [{"name": "dcgm-diag", "image": diag.image,
                            "command": self._argv(args),
                            "resources": {"limits": {"nvidia.com/gpu": gpus}},
                            "securityContext": dict(diag.security_context)}]}
        if diag.service_account:
            pod["serviceAccountName"] = diag.service_account
        labels = {JOB_LABEL: node.name}
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": name, "namespace": diag.namespace, "labels": labels},
                "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": diag.ttl_seconds,
                         "activeDeadlineSeconds": int(args.timeout or diag.timeout),
                         "template": {"metadata": {"labels": labels}, "spec": pod}}}

    def _finished(self, name: str, args: GpuDiagArguments, ctx: ActionContext) -> Job:
        timeout = args.timeout or self.config.gpu_diag.timeout
        deadline = time.monotonic() + min(timeout, ctx.remaining())
        while True:
            job = self.backend.get_job(self.config.gpu_diag.namespace, name)
            if job is None:
                raise ActionError(f"Job {name} is gone before it finished (deleted by someone?)")
            if job.outcome != "running":
                return job
            if time.monotonic() >= deadline:
                raise ActionTimeout(f"Job {name} still running after {format_duration(timeout)}")
            ctx.checkpoint(f"waiting for dcgmi diag on {args.node}")
            self._sleep(max(0.05, ctx.pause(min(args.poll, deadline - time.monotonic()))))

    def _log(self, name: str) -> str:
        namespace = self.config.gpu_diag.namespace
        pods = self.backend.list_pods(namespace, label_selector=f"job-name={name}")
        return self.backend.pod_log(namespace, pods[0].name) if pods else ""

    def _delete(self, name: str) -> None:
        # an error: its ttlSecondsAfterFinished removes it; the verdict matters more
        with contextlib.suppress(KubernetesError):
            self.backend.delete_job(self.config.gpu_diag.namespace, name)

    def _kept_out(self, node: Node, why: str, ctx: ActionContext) -> str:
        """The node stays out: cordoned (it is, by the runbook's drain) and marked."""
        text = f"{node.name}: {why}"
        if not node.unschedulable:
            return f"{text}; {node.name} is not cordoned: cordon it (kubectl cordon {node.name})"
        try:
            self.backend.patch_node(node.name, cordons.failed_check_patch(
                ctx.execution_id, why), strategic=True)
        except KubernetesError as exc:
            return f"{text}; {node.name} stays cordoned (could not mark it: {exc})"
        return f"{text}; {node.name} stays cordoned, marked as a failed check"
