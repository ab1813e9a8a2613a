"""The health check's GPU gate (adapters/prometheus/gate.py) over a DCGM exporter as
Prometheus answers for it: a node returns only when every GPU its gres names reports, no GPU
alert fires for it and no XID or ECC counter rises while it settles; anything else (Prometheus
not answering included) drains it again with the verdict, as a failed check. The lab runs it
against the real Prometheus and the DCGM simulator (tests/runbooks/test_gpu_gate_lab.py)."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest

from adapters.actions import ActionContext, ActionError
from adapters.kubernetes import cordons
from adapters.kubernetes.config import KubernetesConfig
from adapters.kubernetes.cordons import CORDONED_BY, FAILED_CHECK
from adapters.kubernetes.fake import FakeKubernetes
from adapters.kubernetes.gpu_gate import (
    GPU_COUNT_LABEL,
    GpuGateAction,
    GpuGateArguments,
    GpuGateNodesAction,
    GpuGateNodesArguments,
)
from adapters.prometheus.backend import PrometheusError, Sample, Series
from adapters.prometheus.fake import FakePrometheus
from adapters.slurm.config import SlurmConfig
from adapters.slurm.fake import FakeSlurm
from adapters.slurm.health import HealthCheckAction

CONFIG = SlurmConfig.model_validate({"commands": {"health-check": {"argv": ["dcgmi", "diag"]}}})


class Dcgm:
    """A PrometheusBackend over one node's dcgm-exporter: its GPUs, XID events, alerts."""

    def __init__(self, node: str = "gpu02", gpus: int = 8) -> None:
        self.node, self.gpus = node, set(range(gpus))
        self.xids = 0.0
        self.firing: list[dict[str, Any]] = []
        self.down: PrometheusError | None = None
        self.reads = 0
        self.on_read: Any = None  # called at each error-counter read (an XID mid-settle)

    def query(self, promql: str, at: datetime | float | None = None, *,
              timeout: float | None = None) -> list[Sample]:
        if self.down:
            raise self.down
        base = {"Hostname": self.node}
        if promql.startswith("DCGM_FI_DEV_GPU_TEMP"):
            return [Sample({**base, "gpu": str(g)}, 40.0) for g in sorted(self.gpus)]
        self.reads += 1
        if self.on_read:
            self.on_read(self)
        return [Sample({**base, "gpu": str(g), "__name__": "DCGM_EXP_XID_ERRORS_COUNT"},
                       self.xids if g == 3 else 0.0) for g in sorted(self.gpus)]

    def query_range(self, promql: str, start: datetime | float, end: datetime | float,
                    step: float | str, *, timeout: float | None = None) -> list[Series]:
        raise NotImplementedError

    def ready(self, *, timeout: float | None = None) -> bool:
        return self.down is None

    def alerts(self, *, timeout: float | None = None) -> list[dict[str, Any]]:
        if self.down:
            raise self.down
        return self.firing


def check(dcgm: Dcgm | None, **args: Any) -> tuple[HealthCheckAction, FakeSlurm, Any]:
    slurm = FakeSlurm(["gpu01", "gpu02"])
    slurm.update_nodes(["gpu02"], "DRAIN", "XID 79 (execution 5)")
    slurm.create_reservation("resume-gpu02", ["gpu02"], "now", 3600, ["MAINT"], ["root"])
    action = HealthCheckAction(slurm, CONFIG, lambda s: None, prometheus=dcgm, gpu_settle=0.2)
    return action, slurm, action.Arguments.model_validate(
        {"node": "gpu02", "reservation": "resume-gpu02", "gpu_telemetry": True, **args})


def ctx() -> ActionContext:
    return ActionContext(execution_id=7, step_id="health-check", deadline=time.monotonic() + 30)


def test_a_node_whose_gpus_all_report_and_settle_returns() -> None:
    action, slurm, args = check(Dcgm())
    result = action.run(args, ctx())
    assert result.summary.endswith("its 8 GPU(s) report in DCGM with no new XID or ECC error "
                                   "for 0.2s")
    assert "DRAIN" not in slurm.state["gpu02"].flags
    assert result.details["telemetry_reads"] >= 2  # watched, not read once
    plan = action.plan(args)
    assert any(line.startswith("then DCGM in Prometheus: 8 GPU(s) of gpu02 report")
               for line in plan)


@pytest.mark.parametrize("break_it, verdict", [
    (lambda d: d.gpus.discard(3),
     "DCGM reports 7 of 8 GPUs of gpu02: GPU 3 missing (off the bus?)"),
    (lambda d: d.gpus.clear(),
     "DCGM reports no GPU of gpu02 (its dcgm-exporter down, or not scraped): 8 expected"),
    (lambda d: d.firing.append({"state": "firing", "labels": {
        "alertname": "GpuXid", "node": "gpu02", "gpu": "3", "xid": "79"}}),
     "GPU alert(s) for gpu02: GpuXid firing (gpu=3 xid=79)"),
    (lambda d: setattr(d, "on_read", lambda s: setattr(s, "xids", s.xids + (s.reads > 1))),
     "new GPU errors while settling: gpu02: "),
    (lambda d: setattr(d, "down", PrometheusError("connection refused")),
     "Prometheus did not answer (GPU series): connection refused"),
])
def test_a_node_whose_gpus_fail_stays_drained_with_the_verdict(break_it: Any,
                                                               verdict: str) -> None:
    dcgm = Dcgm()
    break_it(dcgm)
    action, slurm, args = check(dcgm)
    with pytest.raises(ActionError, match="gpu02 is left drained with that reason"):
        action.run(args, ctx())
    reason = slurm.state["gpu02"].reason
    assert "DRAIN" in slurm.state["gpu02"].flags
    assert reason.startswith(f"GPU telemetry: {verdict}")
    assert reason.endswith("(execution 7: failed check)")


def test_a_firing_alert_of_another_node_or_a_pending_one_does_not_count() -> None:
    dcgm = Dcgm()
    dcgm.firing += [{"state": "firing", "labels": {"alertname": "GpuXid", "node": "gpu01"}},
                    {"state": "pending", "labels": {"alertname": "GpuXid", "node": "gpu02"}},
                    {"state": "firing", "labels": {"alertname": "SlurmdDown", "node": "gpu02"}}]
    action, slurm, args = check(dcgm)
    action.run(args, ctx())
    assert "DRAIN" not in slurm.state["gpu02"].flags


def test_without_prometheus_the_plan_is_refused_unless_asked_without_the_gate() -> None:
    action, _, args = check(None)
    with pytest.raises(ActionError, match=r"no Prometheus is configured: configure "
                                          r"prometheus:, or ask again with gpu_telemetry=false"):
        action.plan(args)
    without = args.model_copy(update={"gpu_telemetry": False})
    assert not any("DCGM" in line for line in action.plan(without))
    assert "passed" in action.run(without, ctx()).summary


def test_its_dcgm_name_and_settle_come_from_the_request() -> None:
    dcgm = Dcgm(node="node02.dcgm")
    action, slurm, args = check(dcgm, dcgm_name="node02.dcgm", settle="1s")
    result = action.run(args, ctx())
    assert result.summary.endswith("for 1s")
    assert "DRAIN" not in slurm.state["gpu02"].flags


# --- a node only in Kubernetes: k8s.gpu_gate before it is uncordoned ---------------------


def kube_gate(dcgm: Dcgm | None, count: str = "8") -> tuple[GpuGateAction, FakeKubernetes]:
    kube = FakeKubernetes(["gpu06"])
    kube.patch_node("gpu06", {"spec": {"unschedulable": True}, "metadata": {
        "labels": {GPU_COUNT_LABEL: count}, "annotations": {CORDONED_BY: "execution-5"}}},
        strategic=True)
    return GpuGateAction(kube, KubernetesConfig(), lambda s: None, prometheus=dcgm,
                         gpu_settle=0.2), kube


def test_a_kubernetes_node_whose_gpus_report_passes_its_gate() -> None:
    action, kube = kube_gate(Dcgm(node="gpu06"))
    result = action.run(GpuGateArguments(node="gpu06"), ctx())
    assert result.summary == ("gpu06: its 8 GPU(s) report in DCGM with no new XID or ECC "
                              "error for 0.2s")
    assert FAILED_CHECK not in kube.nodes["gpu06"].annotations


def test_a_kubernetes_node_missing_a_gpu_stays_cordoned_as_a_failed_check() -> None:
    dcgm = Dcgm(node="gpu06")
    dcgm.gpus.discard(5)
    action, kube = kube_gate(dcgm)
    with pytest.raises(ActionError, match=r"gpu06's GPUs did not pass: DCGM reports 7 of 8 "
                                          r"GPUs of gpu06: GPU 5 missing .*stays cordoned"):
        action.run(GpuGateArguments(node="gpu06"), ctx())
    assert kube.nodes["gpu06"].annotations[FAILED_CHECK].startswith(
        "GPU telemetry: DCGM reports 7 of 8 GPUs of gpu06: GPU 5 missing")
    assert "gpu06" in cordons.not_liftable(kube.nodes.values())  # resume-nodes leaves it


def test_the_kubernetes_gate_counts_what_gfd_says_and_needs_prometheus() -> None:
    action, _ = kube_gate(Dcgm(node="gpu06", gpus=4), count="4")
    assert action.run(GpuGateArguments(node="gpu06"), ctx()).summary.startswith(
        "gpu06: its 4 GPU(s)")
    without, _ = kube_gate(None)
    with pytest.raises(ActionError, match="no Prometheus is configured"):
        without.plan(GpuGateArguments(node="gpu06"))


def test_a_set_gate_after_a_rollout_cordons_the_failing_node_and_fails() -> None:
    """k8s.gpu_gate_nodes with cordon and fail_on_kept (rollback-driver's Kubernetes side):
    the operator returned the nodes; the one DCGM sees short of a GPU is cordoned, as this
    execution's cordon marked as a failed check, the other is left in service."""
    kube = FakeKubernetes(["gpu05", "gpu06"])
    for name in kube.nodes:
        kube.nodes[name] = replace(kube.nodes[name], labels={GPU_COUNT_LABEL: "8"})
    prom = FakePrometheus([], gpus=8)
    prom.gpus_of["gpu06"] = 7
    action = GpuGateNodesAction(kube, KubernetesConfig(), lambda s: None, prometheus=prom,
                                gpu_settle=0.0)
    args = GpuGateNodesArguments.model_validate({"nodes": {"gpu05": "", "gpu06": ""},
                                            "cordon": True, "fail_on_kept": True})
    assert "is cordoned, marked as a failed check, and the step fails" in action.plan(args)[0]
    with pytest.raises(ActionError, match=r"KEPT OUT: gpu06 \(DCGM reports 7 of 8 GPUs"):
        action.run(args, ctx())
    assert not kube.nodes["gpu05"].unschedulable
    gone = kube.nodes["gpu06"]
    assert gone.unschedulable and gone.annotations[CORDONED_BY] == "execution-7"
    assert gone.annotations[FAILED_CHECK].startswith("GPU telemetry: DCGM reports 7 of 8")
    quiet = GpuGateNodesArguments.model_validate({"nodes": {"gpu05": ""}, "cordon": True,
                                             "fail_on_kept": True})
    assert "passed" in action.run(quiet, ctx()).summary
