"""A command on one Kubernetes node as a batch/v1 Job pinned to it (``nodeName``: a cordon does
not keep it off) asking for every GPU of the node, with ``kubernetes.gpu_diag``'s namespace,
image, tolerations and security context; its outcome read from the Job's condition and its
pod's log. k8s.gpu_diag (dcgmi diag) and k8s.gpu_identity (nvidia-smi) run through it. The
Job is named by execution and node, so a run resumed after a crash finds its own.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from adapters.actions import ActionContext, ActionError, ActionStopped, ActionTimeout
from adapters.kubernetes import cordons
from adapters.kubernetes.backend import (
    Job,
    KubernetesBackend,
    KubernetesConflict,
    KubernetesError,
    Node,
)
from adapters.kubernetes.config import GpuDiagConfig
from adapters.kubernetes.gpu_gate import expected
from kit.durations import format_duration


def job_name(kind: str, execution_id: int, node: str) -> str:
    """One name per kind, execution and node."""
    name = re.sub(r"[^a-z0-9-]", "-", f"{kind}-{execution_id}-{node}")[:63]
    return name.rstrip("-")


@dataclass
class NodeJob:
    """One command's Job on ``node``; ``label`` marks the Job and its pod with the node."""

    backend: KubernetesBackend
    config: GpuDiagConfig
    sleep: Callable[[float], None]
    name: str
    node: Node
    argv: list[str]
    container: str
    label: str
    timeout: float

    def create(self) -> None:
        # a conflict: this execution's own Job, from before a restart: wait for it
        with contextlib.suppress(KubernetesConflict):
            self.backend.create_job(self.config.namespace, self._body())

    def _body(self) -> dict[str, Any]:
        pod: dict[str, Any] = {
            "nodeName": self.node.name, "restartPolicy": "Never",
            "tolerations": [dict(t) for t in self.config.tolerations],
            "containers": [{"name": self.container, "image": self.config.image,
                            "command": self.argv,
                            "resources": {"limits": {"nvidia.com/gpu": str(expected(self.node))}},
                            "securityContext": dict(self.config.security_context)}]}
        if self.config.service_account:
            pod["serviceAccountName"] = self.config.service_account
        labels = {self.label: self.node.name}
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": self.name, "namespace": self.config.namespace,
                             "labels": labels},
                "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": self.config.ttl_seconds,
                         "activeDeadlineSeconds": int(self.timeout),
                         "template": {"metadata": {"labels": labels}, "spec": pod}}}

    def finished(self, ctx: ActionContext, poll: float, what: str) -> Job:
        """The Job once it completed or failed; ActionTimeout after ``timeout``."""
        deadline = time.monotonic() + min(self.timeout, ctx.remaining())
        while True:
            job = self.backend.get_job(self.config.namespace, self.name)
            if job is None:
                raise ActionError(f"Job {self.name} is gone before it finished "
                                  "(deleted by someone?)")
            if job.outcome != "running":
                return job
            if time.monotonic() >= deadline:
                raise ActionTimeout(f"Job {self.name} still running after "
                                    f"{format_duration(self.timeout)}")
            ctx.checkpoint(f"waiting for {what} on {self.node.name}")
            self.sleep(max(0.05, ctx.pause(min(poll, deadline - time.monotonic()))))

    def log(self) -> str:
        pods = self.backend.list_pods(self.config.namespace,
                                      label_selector=f"job-name={self.name}")
        return self.backend.pod_log(self.config.namespace, pods[0].name) if pods else ""

    def run(self, ctx: ActionContext, poll: float, what: str, unfinished: str) -> tuple[Job, str]:
        """Create, wait for and read the Job, then delete it: its outcome and its pod's log.
        A stop, the timeout or the API failing deletes it too and keeps the node out (a
        stop stays a stop, a timeout a timeout), the error saying ``unfinished``."""
        try:
            self.create()
            done = self.finished(ctx, poll, what)
            log = self.log()
        except ActionError as exc:
            self.delete()
            kind = type(exc) if isinstance(exc, ActionStopped | ActionTimeout) else ActionError
            raise kind(kept_out(self.backend, self.node, f"{unfinished}: {exc}", ctx)) from exc
        self.delete()
        return done, log

    def delete(self) -> None:
        # an error: its ttlSecondsAfterFinished removes it; the verdict matters more
        with contextlib.suppress(KubernetesError):
            self.backend.delete_job(self.config.namespace, self.name)


def kept_out(backend: KubernetesBackend, node: Node, why: str, ctx: ActionContext) -> str:
    """The node stays out: cordoned (it is, by the runbook's drain) and marked as a failed
    check; what happened, for the error."""
    text = f"{node.name}: {why}"
    if not node.unschedulable:
        return f"{text}; {node.name} is not cordoned: cordon it (kubectl cordon {node.name})"
    try:
        backend.patch_node(node.name, cordons.failed_check_patch(ctx.execution_id, why),
                           strategic=True)
    except KubernetesError as exc:
        return f"{text}; {node.name} stays cordoned (could not mark it: {exc})"
    return f"{text}; {node.name} stays cordoned, marked as a failed check"
