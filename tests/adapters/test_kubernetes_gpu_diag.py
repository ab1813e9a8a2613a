"""``k8s.gpu_diag`` over the in-memory Kubernetes: the Job it creates (pinned to the node,
every GPU of it, the configured image, command and level, tolerations, no retry), a pass, a
failure that keeps the node cordoned with the diagnostic's failing line, a Job that does not
finish or a cancel (deleted, the node kept out), and a run resumed after a crash that waits
for its own Job instead of starting a second. The lab runs it against its API server and
fake dcgmi (tests/runbooks/test_gpu_diag_lab.py)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from adapters.actions import ActionContext, ActionError, ActionStopped, ActionTimeout
from adapters.kubernetes.backend import Job, Pod
from adapters.kubernetes.config import KubernetesConfig
from adapters.kubernetes.cordons import FAILED_CHECK
from adapters.kubernetes.fake import FakeKubernetes
from adapters.kubernetes.gpu_diag import GpuDiagAction, GpuDiagArguments
from adapters.kubernetes.node_jobs import job_name

NS = "gpu-runbook-bot"
FAILED_LOG = ("Successfully ran diagnostic for group.\n"
              "| GPU Memory                | Fail - GPU: 3                                  |\n")


def diag(cordoned: bool = True, **config: Any) -> tuple[GpuDiagAction, FakeKubernetes]:
    kube = FakeKubernetes(["gpu06"])
    kube.nodes["gpu06"] = replace(kube.nodes["gpu06"], unschedulable=cordoned,
                                  labels={"nvidia.com/gpu.count": "8"})
    settings = KubernetesConfig.model_validate({"gpu_diag": config})
    return GpuDiagAction(kube, settings, lambda s: None), kube


def ctx(execution_id: int = 7, seconds: float = 30, **extra: Any) -> ActionContext:
    return ActionContext(execution_id=execution_id, step_id="k8s-diag",
                         deadline=time.monotonic() + seconds, **extra)


def finish(kube: FakeKubernetes, outcome: str, log: str, execution_id: int = 7) -> None:
    """What the Job controller and kubelet do: a pod ran, the Job ended ``outcome``."""
    name = job_name("gpu-diag", execution_id, "gpu06")
    kube.pods.append(Pod(NS, f"{name}-x1", "uid-1", node="gpu06", labels={"job-name": name}))
    kube.logs[(NS, f"{name}-x1")] = log
    kube.job_outcomes[(NS, name)] = Job(NS, name, outcome,  # type: ignore[arg-type]
                                        "BackoffLimitExceeded" if outcome == "failed" else "")


def test_the_job_is_pinned_to_the_node_with_all_its_gpus() -> None:
    action, kube = diag(level=3, image="registry.site/dcgm:3.3.5",
                        tolerations=[{"key": "pool", "operator": "Equal", "value": "serving"}])
    finish(kube, "complete", "Successfully ran diagnostic for group.\n")
    result = action.run(GpuDiagArguments(node="gpu06"), ctx())
    [(namespace, body)] = kube.jobs_created
    pod = body["spec"]["template"]["spec"]
    assert namespace == NS and body["metadata"]["name"] == "gpu-diag-7-gpu06"
    assert pod["nodeName"] == "gpu06" and pod["restartPolicy"] == "Never"
    assert pod["tolerations"] == [{"key": "pool", "operator": "Equal", "value": "serving"}]
    [container] = pod["containers"]
    assert container["command"] == ["dcgmi", "diag", "-r", "3"]
    assert container["image"] == "registry.site/dcgm:3.3.5"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert container["securityContext"] == {"capabilities": {"add": ["SYS_ADMIN"]}}
    assert body["spec"]["backoffLimit"] == 0
    assert "passed dcgmi diag -r 3" in result.summary
    assert kube.jobs == {} and kube.pods == []  # deleted with its pod
    assert FAILED_CHECK not in kube.nodes["gpu06"].annotations


def test_a_failed_diagnostic_keeps_the_node_cordoned_with_its_failing_line() -> None:
    action, kube = diag()
    finish(kube, "failed", FAILED_LOG)
    with pytest.raises(ActionError, match=r"dcgmi diag failed: GPU Memory \| Fail - GPU: 3.*"
                                          r"stays cordoned, marked as a failed check"):
        action.run(GpuDiagArguments(node="gpu06"), ctx())
    node = kube.nodes["gpu06"]
    assert node.unschedulable
    assert node.annotations[FAILED_CHECK].startswith("dcgmi diag failed: GPU Memory | Fail")
    assert node.annotations[FAILED_CHECK].endswith("(execution-7)")
    assert kube.jobs == {}


def test_a_job_that_does_not_finish_is_deleted_and_the_node_kept_out() -> None:
    action, kube = diag()
    with pytest.raises(ActionTimeout, match=r"did not finish: Job gpu-diag-7-gpu06 still "
                                            r"running after 1s.*failed check"):
        action.run(GpuDiagArguments(node="gpu06", timeout=1, poll=0.01), ctx())
    assert kube.jobs == {}
    assert kube.nodes["gpu06"].annotations[FAILED_CHECK].startswith("dcgmi diag did not finish")


def test_a_cancel_deletes_the_job_and_stays_a_stop() -> None:
    action, kube = diag()
    running = ctx()
    running.request_stop("cancelled by alice")
    with pytest.raises(ActionStopped, match=r"cancelled by alice.*stays cordoned"):
        action.run(GpuDiagArguments(node="gpu06"), running)
    assert kube.jobs == {}


def test_a_resumed_run_waits_for_its_own_job() -> None:
    action, kube = diag()
    kube.create_job(NS, {"metadata": {"name": "gpu-diag-7-gpu06"}})  # before the crash
    finish(kube, "complete", "Successfully ran diagnostic for group.\n")
    assert "passed" in action.run(GpuDiagArguments(node="gpu06"), ctx()).summary
    assert kube.jobs == {}


def test_a_node_not_cordoned_is_said_not_marked() -> None:
    action, kube = diag(cordoned=False)
    finish(kube, "failed", FAILED_LOG)
    with pytest.raises(ActionError, match=r"gpu06 is not cordoned: cordon it"):
        action.run(GpuDiagArguments(node="gpu06"), ctx())
    assert FAILED_CHECK not in kube.nodes["gpu06"].annotations


def test_the_plan_names_the_job_and_what_a_failure_leaves() -> None:
    action, _ = diag(level=1)
    plan = action.plan(GpuDiagArguments(node="gpu06", level=4))
    assert "--image=nvcr.io/nvidia/cloud-native/dcgm" in plan[0]
    assert "-- dcgmi diag -r 4" in plan[0] and "pinned to gpu06 (nodeName)" in plan[0]
    assert "stays cordoned, marked as a failed check" in plan[1]
    with pytest.raises(ValueError):
        GpuDiagArguments(node="gpu06", level=5)
