"""``k8s.gpu_identity`` over the in-memory Kubernetes and a DCGM stand-in: nvidia-smi as a Job
pinned to a Kubernetes-only node, the replaced GPU's UUID and serial compared with DCGM's and
with the reading before the swap. A swap that happened passes with the evidence; the old GPU
still in, a disagreement with DCGM, a failed or unfinished Job, or no Prometheus keep the node
cordoned as a failed check (or refuse). The lab runs swap-gpu on a Kubernetes-only node with
`lab swap` in tests/runbooks/test_kubernetes_runbooks.py."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from adapters.actions import ActionContext, ActionError, ActionStopped
from adapters.kubernetes.backend import Job, Pod
from adapters.kubernetes.config import KubernetesConfig
from adapters.kubernetes.cordons import FAILED_CHECK
from adapters.kubernetes.fake import FakeKubernetes
from adapters.kubernetes.gpu_identity import GpuIdentityAction, GpuIdentityArguments
from adapters.kubernetes.node_jobs import job_name
from adapters.prometheus.backend import PrometheusError
from adapters.prometheus.identity import GpuIdentity
from tests.adapters.test_swap_evidence import NEW, OLD, Dcgm, smi

NS = "gpu-runbook-bot"
ARGS = GpuIdentityArguments(node="gpu02", gpu=3, before="identity-before")


def action(dcgm: Dcgm | None) -> tuple[GpuIdentityAction, FakeKubernetes]:
    kube = FakeKubernetes(["gpu02"])
    kube.nodes["gpu02"] = replace(kube.nodes["gpu02"], unschedulable=True,
                                  labels={"nvidia.com/gpu.count": "8"})
    return GpuIdentityAction(kube, KubernetesConfig(), lambda s: None, prometheus=dcgm), kube


def ctx(before: list[GpuIdentity] | None = None, **extra: Any) -> ActionContext:
    reading = {"before": [b.as_dict() for b in (before if before is not None else [OLD])]}
    return ActionContext(execution_id=7, step_id="k8s-identity",
                         deadline=time.monotonic() + 30,
                         earlier=lambda step: reading if step == "identity-before" else None,
                         **extra)


def finish(kube: FakeKubernetes, log: str, outcome: str = "complete") -> None:
    """What the Job controller and kubelet do: a pod ran nvidia-smi, the Job ended."""
    name = job_name("gpu-identity", 7, "gpu02")
    kube.pods.append(Pod(NS, f"{name}-x1", "uid-1", node="gpu02", labels={"job-name": name}))
    kube.logs[(NS, f"{name}-x1")] = log
    kube.job_outcomes[(NS, name)] = Job(NS, name, outcome)  # type: ignore[arg-type]


def test_a_replaced_gpu_passes_with_both_readings_and_the_job_pinned() -> None:
    act, kube = action(Dcgm(NEW))
    finish(kube, smi(NEW))
    result = act.run(ARGS, ctx())
    assert result.details["swap_evidence"] == {
        "gpu": 3, "before": [OLD.as_dict()], "after": NEW.as_dict(), "dcgm": [NEW.as_dict()],
        "job": "gpu-identity-7-gpu02"}
    assert f"{OLD.uuid}" in result.summary and f"-> UUID {NEW.uuid}" in result.summary
    [(namespace, body)] = kube.jobs_created
    pod = body["spec"]["template"]["spec"]
    assert namespace == NS and pod["nodeName"] == "gpu02"
    assert pod["containers"][0]["command"] == [
        "nvidia-smi", "--query-gpu=index,serial,uuid", "--format=csv,noheader"]
    assert kube.jobs == {} and FAILED_CHECK not in kube.nodes["gpu02"].annotations


@pytest.mark.parametrize(("after", "dcgm", "before", "why"), [
    (OLD, OLD, [OLD], "GPU 3 still reports UUID"),  # the old GPU is still in
    (NEW, OLD, [OLD], "nvidia-smi reads GPU 3 as UUID GPU-9f8e"),  # DCGM disagrees
    (None, NEW, [OLD], "nvidia-smi lists no GPU 3"),  # off the bus
    (NEW, NEW, [], "no reading of GPU 3 from before the swap"),
])
def test_anything_but_a_replaced_gpu_keeps_the_node_cordoned(
        after: GpuIdentity | None, dcgm: GpuIdentity, before: list[GpuIdentity],
        why: str) -> None:
    act, kube = action(Dcgm(dcgm))
    finish(kube, smi(after))
    with pytest.raises(ActionError, match=f"GPU swap: {why}.*stays cordoned, marked as a "
                                          "failed check"):
        act.run(ARGS, ctx(before))
    node = kube.nodes["gpu02"]
    assert node.unschedulable and node.annotations[FAILED_CHECK].startswith(f"GPU swap: {why}")
    assert kube.jobs == {}


def test_a_failed_job_or_a_silent_prometheus_keeps_it_cordoned() -> None:
    act, kube = action(Dcgm(NEW))
    finish(kube, "NVIDIA-SMI has failed because it couldn't communicate with the driver",
           outcome="failed")
    with pytest.raises(ActionError, match="GPU swap: nvidia-smi failed: NVIDIA-SMI has failed"):
        act.run(ARGS, ctx())
    down = Dcgm(NEW)
    down.down = PrometheusError("connection refused")
    act, kube = action(down)
    finish(kube, smi(NEW))
    with pytest.raises(ActionError, match="Prometheus did not answer for DCGM's GPU 3"):
        act.run(ARGS, ctx())
    assert FAILED_CHECK in kube.nodes["gpu02"].annotations


def test_a_stop_while_it_runs_deletes_the_job_and_keeps_the_node_out() -> None:
    act, kube = action(Dcgm(NEW))
    running = ctx()
    running.request_stop("cancelled by alice")
    with pytest.raises(ActionStopped, match=r"nvidia-smi did not finish: .*cancelled by alice"):
        act.run(ARGS, running)
    assert kube.jobs == {} and FAILED_CHECK in kube.nodes["gpu02"].annotations


def test_without_prometheus_it_is_refused_before_anything_runs() -> None:
    act, kube = action(None)
    with pytest.raises(ActionError, match="no Prometheus is configured"):
        act.plan(ARGS)
    with pytest.raises(ActionError, match="no Prometheus is configured"):
        act.run(ARGS, ctx())
    assert kube.jobs_created == []
