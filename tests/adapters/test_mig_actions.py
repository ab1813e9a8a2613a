"""The MIG actions over in-memory backends: ``gpu_operator.set_mig_layout`` (idempotent),
``wait_mig_state`` (success, failed at once, someone else's label), ``wait_mig_resources``
(devices per GPU times the node's gpu.count, MIG off), and the Slurm side: ``slurm.mig_apply``
(only inside its reservation, the layout as the command's last argument, a failure's
verdict) and ``slurm.check_gres`` (types and counts from the node's Gres)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from adapters.actions import ActionContext, ActionError, ActionStopped, ActionTimeout
from adapters.kubernetes.actions import KubernetesActions
from adapters.kubernetes.fake import FakeKubernetes
from adapters.slurm.config import SlurmConfig
from adapters.slurm.fake import FakeSlurm
from adapters.slurm.mig import (
    CheckGresAction,
    CheckGresArguments,
    MigApplyAction,
    MigApplyArguments,
    gres_types,
)
from tests.adapters.test_gpu_gate import Dcgm

MIG = "nvidia.com/mig.config"
STATE = "nvidia.com/mig.config.state"


def ctx(seconds: float = 5) -> ActionContext:
    return ActionContext(execution_id=1, step_id="s", deadline=time.monotonic() + seconds)


def kube(name: str, backend: FakeKubernetes, **args: Any) -> Any:
    action = KubernetesActions(backend).by_name()[name]
    action._sleep = lambda s: None  # type: ignore[attr-defined]
    return action.run(action.Arguments(**args), ctx())


def node_with(backend: FakeKubernetes, labels: dict[str, str],
              allocatable: dict[str, int]) -> None:
    node = backend.nodes["gpu06"]
    backend.nodes["gpu06"] = replace(node, labels={**node.labels, **labels},
                                     nvidia_allocatable=allocatable)


def test_set_mig_layout_labels_once() -> None:
    backend = FakeKubernetes(["gpu06"])
    done = kube("gpu_operator.set_mig_layout", backend, node="gpu06", layout="all-3g.40gb")
    assert done.changed and done.details["previous_layout"] is None
    assert backend.nodes["gpu06"].labels[MIG] == "all-3g.40gb"
    again = kube("gpu_operator.set_mig_layout", backend, node="gpu06", layout="all-3g.40gb")
    assert not again.changed


def test_wait_mig_state_success_and_failed() -> None:
    backend = FakeKubernetes(["gpu06"])
    node_with(backend, {MIG: "all-3g.40gb", STATE: "success"}, {})
    done = kube("gpu_operator.wait_mig_state", backend, node="gpu06", layout="all-3g.40gb")
    assert done.details["states"] == ["success"]
    node_with(backend, {STATE: "failed"}, {})
    with pytest.raises(ActionError, match=r"reports nvidia.com/mig.config.state=failed on "
                                          r"gpu06 for layout all-3g.40gb"):
        kube("gpu_operator.wait_mig_state", backend, node="gpu06", layout="all-3g.40gb")
    with pytest.raises(ActionError, match="someone else changed it"):
        kube("gpu_operator.wait_mig_state", backend, node="gpu06", layout="all-1g.10gb")


def test_wait_mig_state_times_out_while_pending() -> None:
    backend = FakeKubernetes(["gpu06"])
    node_with(backend, {MIG: "all-3g.40gb", STATE: "pending"}, {})
    with pytest.raises(ActionTimeout, match=r"nvidia.com/mig.config.state=pending"):
        kube("gpu_operator.wait_mig_state", backend, node="gpu06", layout="all-3g.40gb",
             timeout=0.05, poll=0.01)


def test_wait_mig_resources_counts_per_gpu() -> None:
    backend = FakeKubernetes(["gpu06"])
    node_with(backend, {"nvidia.com/gpu.count": "8", STATE: "success"},
              {"nvidia.com/mig-3g.40gb": 16, "nvidia.com/gpu": 0})
    done = kube("gpu_operator.wait_mig_resources", backend, node="gpu06",
                per_gpu={"3g.40gb": 2})
    assert done.details["expected"] == {"nvidia.com/mig-3g.40gb": 16}
    with pytest.raises(ActionTimeout, match=r"want nvidia.com/gpu=8"):
        kube("gpu_operator.wait_mig_resources", backend, node="gpu06", per_gpu={},
             timeout=0.05, poll=0.01)
    node_with(backend, {STATE: "failed"}, {})
    with pytest.raises(ActionError, match="state=failed"):
        kube("gpu_operator.wait_mig_resources", backend, node="gpu06", per_gpu={})


def test_wait_mig_resources_needs_a_gpu_count() -> None:
    backend = FakeKubernetes(["gpu06"])
    with pytest.raises(ActionError, match=r"no nvidia.com/gpu.count label"):
        kube("gpu_operator.wait_mig_resources", backend, node="gpu06", per_gpu={})
    node_with(backend, {}, {"nvidia.com/gpu": 4})
    assert kube("gpu_operator.wait_mig_resources", backend, node="gpu06", per_gpu={},
                gpus=4).details["allocatable"] == {"nvidia.com/gpu": 4}


@pytest.mark.parametrize(("gres", "types"), [
    ("gpu:h100:8", {"h100": 8}), ("gpu:3g.40gb:16(S:0)", {"3g.40gb": 16}),
    ("gpu:1g.10gb:7,gpu:3g.40gb:2(S:0-1)", {"1g.10gb": 7, "3g.40gb": 2}),
    ("gpu:8", {"gpu": 8}), ("", {}), ("(null)", {})])
def test_gres_types(gres: str, types: dict[str, int]) -> None:
    assert gres_types(gres) == types


CONFIG = SlurmConfig.model_validate({"commands": {
    "mig-apply": {"argv": ["nvidia-mig-parted", "apply", "-f", "/etc/m.yaml", "-c"],
                  "accepts_args": True},
    "gpu-count": {"argv": ["nvidia-smi", "--query-gpu=index"]}}})


def test_mig_apply_inside_its_reservation_only() -> None:
    slurm = FakeSlurm(["gpu03"])
    action = MigApplyAction(slurm, CONFIG)
    args = MigApplyArguments(node="gpu03", reservation="mig-gpu03", layout="all-3g.40gb")
    with pytest.raises(ActionError, match="reservation mig-gpu03 with gpu03 does not exist"):
        action.run(args, ctx())
    slurm.update_nodes(["gpu03"], "DRAIN", "MIG layout all-3g.40gb (execution 1)")  # ours
    slurm.create_reservation("mig-gpu03", ["gpu03"], "now", 60, ["MAINT"], ["root"])
    done = action.run(args, ctx())
    assert done.summary == "MIG layout all-3g.40gb applied on gpu03"
    assert ("srun", "gpu03", "mig-gpu03", ["nvidia-mig-parted", "apply", "-f", "/etc/m.yaml",
                                            "-c", "all-3g.40gb"]) in slurm.calls
    assert "DRAIN" not in slurm.state["gpu03"].flags  # resumed inside the reservation
    failing = MigApplyArguments(node="gpu03", reservation="mig-gpu03", layout="fail")
    with pytest.raises(ActionError, match=r"failed \(Row remap \| Fail\)"):
        action.run(failing, ctx())


def test_check_gres_compares_types_and_counts() -> None:
    slurm = FakeSlurm(["gpu03"])
    slurm.state["gpu03"] = replace(slurm.state["gpu03"], gres="gpu:3g.40gb:16(S:0)")
    action = CheckGresAction(slurm, CONFIG)
    action._sleep = lambda s: None
    done = action.run(CheckGresArguments(node="gpu03", per_gpu={"3g.40gb": 2}, gpus=8), ctx())
    assert done.details["types"] == {"3g.40gb": 16}
    with pytest.raises(ActionTimeout, match=r"Gres=gpu:3g.40gb:16\(S:0\), not 8 plain GPUs"):
        action.run(CheckGresArguments(node="gpu03", per_gpu={}, gpus=8, timeout=0.05,
                                    poll=0.01), ctx())
    slurm.state["gpu03"] = replace(slurm.state["gpu03"], gres="gpu:h100:8")
    # the fake's srun prints one line ("Pass"): one GPU counted
    with pytest.raises(ActionTimeout, match="not 1 plain GPUs"):
        action.run(CheckGresArguments(node="gpu03", per_gpu={}, timeout=0.05, poll=0.01), ctx())
    assert action.run(CheckGresArguments(node="gpu03", per_gpu={}, gpus=8), ctx()).changed is False


def gres_check(gres: str, dcgm: Any = None) -> tuple[CheckGresAction, FakeSlurm]:
    """gpu03 resumed inside its reservation with ``gres``, as mig_apply leaves it."""
    slurm = FakeSlurm(["gpu03"])
    slurm.state["gpu03"] = replace(slurm.state["gpu03"], gres=gres)
    action = CheckGresAction(slurm, CONFIG, lambda s: None, prometheus=dcgm, gpu_settle=0.05)
    return action, slurm


def test_check_gres_that_fails_drains_the_node_as_a_failed_check() -> None:
    action, slurm = gres_check("gpu:3g.40gb:14")  # a GPU fell off: 7 of 8 published
    with pytest.raises(ActionTimeout, match=r"not gpu:3g.40gb:16 .*gpu03 is left drained"):
        action.run(CheckGresArguments(node="gpu03", per_gpu={"3g.40gb": 2}, gpus=8,
                                      timeout=0.05, poll=0.01), ctx())
    reason = slurm.state["gpu03"].reason
    assert "DRAIN" in slurm.state["gpu03"].flags
    assert reason.startswith("MIG check: gpu03 publishes Gres=gpu:3g.40gb:14")
    assert reason.endswith("(execution 1: failed check)")


def test_check_gres_gates_the_physical_gpus_in_dcgm() -> None:
    dcgm = Dcgm("gpu03")
    action, slurm = gres_check("gpu:3g.40gb:16(S:0)", dcgm)
    args = CheckGresArguments(node="gpu03", per_gpu={"3g.40gb": 2}, gpus=8, gpu_telemetry=True)
    plan = action.plan(args)
    assert "DCGM in Prometheus: 8 GPU(s) of gpu03 report" in plan[-1], plan
    done = action.run(args, ctx())
    assert "report in DCGM" in done.summary and "DRAIN" not in slurm.state["gpu03"].flags
    dcgm.gpus.discard(5)
    with pytest.raises(ActionError, match=r"has the layout but its GPUs did not pass: DCGM "
                                          r"reports 7 of 8 GPUs of gpu03: GPU 5 missing"):
        action.run(args, ctx())
    reason = slurm.state["gpu03"].reason
    assert reason.startswith("GPU telemetry: DCGM reports 7 of 8") and "failed check" in reason


def test_check_gres_without_prometheus_refuses_the_gate_at_plan() -> None:
    action, _ = gres_check("gpu:h100:8")
    with pytest.raises(ActionError, match="no Prometheus is configured"):
        action.plan(CheckGresArguments(node="gpu03", per_gpu={}, gpus=8, gpu_telemetry=True))


def test_check_gres_stopped_drains_the_node_and_stays_a_stop() -> None:
    action, slurm = gres_check("gpu:3g.40gb:14")
    stopping = ctx()
    stopping.request_stop("cancelled by alice")
    with pytest.raises(ActionStopped, match=r"cancelled by alice.*gpu03 is left drained"):
        action.run(CheckGresArguments(node="gpu03", per_gpu={"3g.40gb": 2}, gpus=8,
                                      timeout=30, poll=0.01), stopping)
    assert slurm.state["gpu03"].reason.endswith("(execution 1: failed check)")
