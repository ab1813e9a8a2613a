"""``report.drift`` over fake Prometheus, Kubernetes and Slurm: drivers against the pinned
version and the CUDA floor, VBIOS and InfoROM against the pool's most common per GPU model,
slurmd against slurmctld, the fix request of every node out of line, and "unknown" (never a
guess) for a source that does not answer."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from adapters.actions import ActionContext, ActionError
from adapters.kubernetes.backend import KubernetesUnavailable, Node
from adapters.kubernetes.fake import DRIVER_VERSION_LABEL, FakeKubernetes
from adapters.prometheus.backend import PrometheusUnavailable, Sample
from adapters.reports.drift.judging import (
    FIRMWARE_FIX,
    Gpu,
    NodeVersions,
    Pin,
    counts,
    judge,
    judge_driver,
    majority,
)
from adapters.reports.drift.report import DriftArguments, DriftReportAction
from adapters.reports.drift.sources import (
    CLUSTERPOLICY,
    DRIVER_LABEL,
    INFOROM_LABEL,
    VBIOS_LABEL,
    DaemonVersions,
    dcgm_gpus,
)
from adapters.slurm.backend import SlurmError
from adapters.slurm.daemons import NodeDaemon

NOW = datetime(2026, 3, 9, 7, 0, tzinfo=UTC).timestamp()
PINNED, FLOOR = "535.161.08", "535.54.03"
PIN = Pin(PINNED, FLOOR, "12.2")
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
VBIOS, INFOROM = "96.00.89.00.01", "G520.0200.00.05"
DRIVERS = {"slurm": {"pinned": PINNED, "floor": FLOOR, "cuda": "12.2"},
           "kubernetes": {"pinned": PINNED, "floor": FLOOR, "cuda": "12.2"}}


def gpus(driver: str | None = PINNED, vbios: str = VBIOS, model: str = H100,
         count: int = 8) -> list[Gpu]:
    return [Gpu(str(i), model, driver, vbios, INFOROM) for i in range(count)]


def node(name: str, pool: str = "slurm", **kwargs: Any) -> NodeVersions:
    slurmd = kwargs.pop("slurmd", "22.05.8" if pool == "slurm" else None)
    return NodeVersions(name, pool, gpus(**kwargs), slurmd=slurmd)


# --- judging --------------------------------------------------------------------------

def test_a_node_on_the_pinned_driver_is_in_line() -> None:
    assert judge([node("gpu01")], PIN, "22.05.8") == []


def test_a_driver_other_than_the_pinned_one_is_fixed_by_rollback_driver() -> None:
    newer = judge_driver(node("gpu03", driver="550.54.15"), PIN)
    assert newer is not None and newer.kind == "driver_pinned"
    assert newer.text == "driver 550.54.15, newer than the pinned 535.161.08"
    assert newer.fix == "runbook run rollback-driver pool=slurm nodes=gpu03 version=535.161.08"
    older = judge_driver(node("gpu03", driver="535.104.05"), PIN)
    assert older is not None and older.text.endswith("older than the pinned 535.161.08")


def test_below_the_cuda_floor_is_worse_than_off_the_pin() -> None:
    found = judge_driver(node("gpu02", driver="530.30.02"), PIN)
    assert found is not None and found.kind == "driver_floor"
    assert found.text == ("driver 530.30.02 is below 535.54.03, the lowest driver for CUDA 12.2, "
                          "pinned 535.161.08")
    assert found.fix.endswith("nodes=gpu02 version=535.161.08")
    # several findings: the floor comes first
    found_all = judge([node("gpu01", driver="550.54.15"), node("gpu02", driver="530.30.02")],
                      PIN)
    assert [f.kind for f in found_all] == ["driver_floor", "driver_pinned"]


def test_without_a_pin_only_the_floor_judges_and_the_fix_says_to_pin_one() -> None:
    pin = Pin(None, FLOOR, "12.2")
    assert judge_driver(node("gpu01", driver="550.54.15"), pin) is None
    found = judge_driver(node("gpu01", driver="525.60.13"), pin)
    assert found is not None and found.kind == "driver_floor"
    assert found.fix == ("pin a driver for the pool (drivers.pools.slurm.pinned, at or above "
                         "535.54.03), then runbook run rollback-driver pool=slurm nodes=gpu01 "
                         "version=THAT_VERSION")


def test_kubernetes_nodes_are_fixed_through_the_gpu_operator_for_the_whole_pool() -> None:
    found = judge_driver(node("gpu06", "kubernetes", driver="550.54.15"), PIN)
    assert found is not None
    assert found.fix == "runbook run rollback-driver pool=kubernetes version=535.161.08"


def test_a_node_without_a_reading_is_unknown_and_falls_back_to_the_label() -> None:
    bare = NodeVersions("gpu07", "kubernetes")
    found = judge_driver(bare, PIN)
    assert found is not None and found.kind == "unknown"
    assert judge_driver(replace(bare, label_driver=PINNED), PIN) is None


def test_vbios_is_judged_against_the_pools_most_common_per_model() -> None:
    nodes = [node("gpu01"), node("gpu02"), node("gpu03", vbios="96.00.74.00.01"),
             node("gpu04", vbios="94.00.9F.00.01", model=A100)]  # alone of its model: in line
    nodes[1].gpus[2] = replace(nodes[1].gpus[2], vbios="96.00.99.00.01")
    found = judge(nodes, PIN)
    assert [(f.node, f.kind) for f in found] == [("gpu02", "vbios"), ("gpu03", "vbios")]
    assert found[0].text == (f"VBIOS 96.00.99.00.01 on GPU 2; 15 of the pool's 24 {H100} run "
                             f"{VBIOS}")
    assert found[1].text.startswith("VBIOS 96.00.74.00.01 on GPU 0,1,2,3,4,5,6,7; 15 of")
    assert all(f.fix == FIRMWARE_FIX for f in found)
    assert "vendor's tool" in FIRMWARE_FIX
    assert counts(found)["vbios"] == 2 and counts(found)["driver_pinned"] == 0


def test_a_tie_goes_to_the_higher_version() -> None:
    assert majority(["96.00.74.00.01", "96.00.89.00.01"]) == ("96.00.89.00.01", 1, 2)
    assert majority([]) is None


def test_inforom_differs() -> None:
    nodes = [node("gpu01"), node("gpu02")]
    nodes[0].gpus[:] = [replace(g, inforom="G520.0200.00.01") for g in nodes[0].gpus[:5]] + \
        nodes[0].gpus[5:]
    found = judge(nodes, PIN)
    assert [(f.node, f.kind) for f in found] == [("gpu01", "inforom")]
    assert found[0].text.startswith("InfoROM image G520.0200.00.01 on GPU 0,1,2,3,4; 11 of")


def test_slurmd_other_than_slurmctld() -> None:
    found = judge([node("gpu01", slurmd="22.05.7"), node("gpu02")], PIN, "22.05.8")
    assert [(f.node, f.kind, f.text) for f in found] == [
        ("gpu01", "slurmd", "slurmd 22.05.7, slurmctld 22.05.8")]
    assert "no shipped runbook" in found[0].fix and "install Slurm 22.05.8 on gpu01" in found[0].fix
    assert judge([node("gpu01", slurmd=None)], PIN, "22.05.8") == []  # not registered: no guess


# --- sources ----------------------------------------------------------------------------

def sample(host: str, gpu: int, driver: str | None = PINNED, vbios: str = VBIOS,
           label: str = "Hostname", model: str = H100) -> Sample:
    labels = {label: host, "gpu": str(gpu), "modelName": model, VBIOS_LABEL: vbios,
              INFOROM_LABEL: INFOROM}
    if driver:
        labels[DRIVER_LABEL] = driver
    return Sample(labels, 40.0)


def test_dcgm_labels_per_gpu_under_either_host_label() -> None:
    stale = replace(sample("gpu01", 0, "530.30.02", vbios="96.00.74.00.01"), value=30.0)
    found = dcgm_gpus([sample("gpu01", 1), stale, sample("gpu01", 0), Sample({"gpu": "0"}, 1.0),
                       sample("gpu02", 0, "550.54.15", label="hostname")])
    assert sorted(found) == ["gpu01", "gpu02"]
    assert [g.index for g in found["gpu01"]] == ["0", "1"]
    assert found["gpu01"][0].driver == PINNED  # the series sampled last (40 > 30)
    assert found["gpu01"][0].vbios == VBIOS
    assert found["gpu02"][0] == Gpu("0", H100, "550.54.15", VBIOS, INFOROM)


class Reads:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def controller(self) -> dict[str, str]:
        if self.fail:
            raise SlurmError("slurmctld does not answer", ["scontrol", "show", "config"])
        return {"SLURM_VERSION": "22.05.8", "ClusterName": "lab"}

    def dbd_version(self) -> str:
        return "22.05.8"

    def node_daemons(self, names: list[str] | None = None) -> list[NodeDaemon]:
        return [NodeDaemon("gpu01", "22.05.8", "", True), NodeDaemon("gpu02", "22.05.7", "", True),
                NodeDaemon("gpu03", "", "", False)]


def test_slurm_versions_from_the_daemons() -> None:
    assert DaemonVersions(Reads()).slurm_versions() == (
        "22.05.8", {"gpu01": "22.05.8", "gpu02": "22.05.7", "gpu03": None})


# --- the action -------------------------------------------------------------------------

class Prometheus:
    def __init__(self, samples: list[Sample], fail: bool = False) -> None:
        self.samples, self.fail, self.queries = samples, fail, list[str]()

    def query(self, promql: str, at: Any = None, *, timeout: float | None = None) -> list[Any]:
        self.queries.append(promql)
        if self.fail:
            raise PrometheusUnavailable("Prometheus: connection refused", attempts=3)
        return self.samples


class Kubernetes(FakeKubernetes):
    def __init__(self, drivers: dict[str, str], fail: bool = False) -> None:
        super().__init__([])
        self.fail = fail
        for name, version in drivers.items():
            self.nodes[name] = Node(name, labels={DRIVER_VERSION_LABEL: version})
        self.objects[(*CLUSTERPOLICY, None, "cluster-policy")] = {
            "metadata": {"name": "cluster-policy",
                         "labels": {"app.kubernetes.io/version": "v23.9.2"}},
            "spec": {"driver": {"version": PINNED}}, "status": {"state": "ready"}}

    def driver_versions(self, label_selector: str | None = None) -> dict[str, str | None]:
        if self.fail:
            raise KubernetesUnavailable("the Kubernetes API does not answer")
        return super().driver_versions(label_selector)


def fleet() -> list[Sample]:
    """gpu01..gpu04 in Slurm (gpu03 on a newer driver, gpu02 below the floor, gpu04 with
    an odd VBIOS), gpu05..gpu06 in Kubernetes (gpu06 on another driver)."""
    drivers = {"gpu02": "530.30.02", "gpu03": "550.54.15", "gpu06": "550.54.15"}
    out = []
    for i in range(1, 7):
        name = f"gpu0{i}"
        for g in range(8):
            out.append(sample(name, g, drivers.get(name, PINNED),
                              "96.00.99.00.01" if name == "gpu04" else VBIOS))
    return out


def context() -> ActionContext:
    return ActionContext(execution_id=1, step_id="report", deadline=time.monotonic() + 60)


def arguments(**overrides: Any) -> DriftArguments:
    data: dict[str, Any] = {"drivers": DRIVERS, "slurm_nodes": ["gpu01", "gpu02", "gpu03",
                                                                "gpu04"],
                            "kubernetes_nodes": ["gpu05", "gpu06", "gpu07"]}
    return DriftArguments(**(data | overrides))


def report(prometheus: Prometheus | None, kubernetes: Kubernetes | None, reads: Reads | None,
           **overrides: Any) -> Any:
    action = DriftReportAction(prometheus, kubernetes,
                               DaemonVersions(reads) if reads is not None else None,
                               clock=lambda: NOW)
    return action.run(arguments(**overrides), context())


def test_the_report_lists_each_node_out_of_line_with_its_fix() -> None:
    k8s = Kubernetes({"gpu05": PINNED, "gpu06": "550.54.15", "gpu07": PINNED})
    result = report(Prometheus(fleet()), k8s, Reads())
    lines = result.summary.splitlines()
    assert not result.changed
    assert lines[0] == "Drift report, 2026-03-09 07:00 UTC"
    assert "slurm pool: pinned driver 535.161.08; CUDA 12.2 needs 535.54.03 or newer" in lines
    assert "GPU Operator: v23.9.2, ClusterPolicy driver 535.161.08, state ready" in lines
    assert "Slurm: slurmctld 22.05.8" in lines
    assert "  out of line (3 nodes):" in lines  # Slurm: gpu02 (driver, slurmd), gpu03, gpu04
    assert "  drivers: 535.161.08 on 2 nodes, 530.30.02 on 1 node, 550.54.15 on 1 node" in lines
    assert ("    gpu02: driver 530.30.02 is below 535.54.03, the lowest driver for CUDA 12.2, "
            "pinned 535.161.08") in lines
    assert "      fix: runbook run rollback-driver pool=slurm nodes=gpu02 version=535.161.08" \
        in lines
    assert "    gpu03: driver 550.54.15, newer than the pinned 535.161.08" in lines
    assert ('  all Slurm drivers at once: runbook run rollback-driver pool=slurm '
            'nodes="gpu[02-03]" version=535.161.08') in lines
    assert f"      fix: {FIRMWARE_FIX}" in lines
    assert "    gpu02: slurmd 22.05.7, slurmctld 22.05.8" in lines
    assert "    gpu06: driver 550.54.15, newer than the pinned 535.161.08" in lines
    assert "      fix: runbook run rollback-driver pool=kubernetes version=535.161.08" in lines
    # gpu07 has no DCGM telemetry: the GPU Operator's label speaks for it
    assert "gpu07" not in result.summary.split("Kubernetes pool")[1].split("out of line")[1]
    details = result.details
    assert details["drift"]["slurm"] == {"driver_floor": 1, "driver_pinned": 1, "vbios": 1,
                                         "inforom": 0, "slurmd": 1, "unknown": 0}
    assert details["drift"]["kubernetes"]["driver_pinned"] == 1
    assert details["nodes_checked"] == {"slurm": 4, "kubernetes": 3}
    assert details["sources"] == {"prometheus": True, "kubernetes": True, "slurm": True}
    assert details["versions"]["gpu_operator"] == "v23.9.2"


def test_names_that_differ_between_the_bot_and_dcgm() -> None:
    samples = [sample("gpu01-bmc", g, "550.54.15") for g in range(8)]
    result = report(Prometheus(samples), None, None, slurm_nodes=["gpu01"], kubernetes_nodes=[],
                    dcgm_names={"gpu01": "gpu01-bmc"})
    assert "    gpu01: driver 550.54.15, newer than the pinned 535.161.08" in (
        result.summary.splitlines())


def test_the_clusterpolicy_installing_another_driver_is_said_with_its_fix() -> None:
    k8s = Kubernetes({"gpu05": PINNED})
    k8s.objects[(*CLUSTERPOLICY, None, "cluster-policy")]["spec"]["driver"]["version"] = "550.54.15"
    lines = report(None, k8s, None, slurm_nodes=[], kubernetes_nodes=["gpu05"]).summary
    assert "  the ClusterPolicy installs driver 550.54.15, not the pinned 535.161.08" in lines


def test_a_source_that_does_not_answer_is_said_and_the_rest_judged() -> None:
    k8s = Kubernetes({"gpu05": PINNED, "gpu06": "550.54.15", "gpu07": PINNED})
    result = report(Prometheus([], fail=True), k8s, Reads())
    text = result.summary
    assert "unknown: prometheus did not answer (Prometheus: connection refused)" in text
    # Slurm nodes: no driver reading at all; Kubernetes nodes: the label speaks
    assert "  unknown (no driver reading): gpu01, gpu02, gpu03, gpu04" in text
    assert "    gpu06: driver 550.54.15, newer than the pinned 535.161.08" in text
    assert result.details["sources"]["prometheus"] is False
    assert result.details["drift"]["slurm"]["unknown"] == 4
    slurm_down = report(Prometheus(fleet()), k8s, Reads(fail=True)).summary
    assert "unknown: slurm did not answer (slurmctld does not answer" in slurm_down
    assert "gpu03: driver 550.54.15" in slurm_down and "Slurm: slurmctld" not in slurm_down
    no_k8s = report(Prometheus(fleet()), Kubernetes({}, fail=True), Reads()).summary
    assert "unknown: kubernetes did not answer (the Kubernetes API does not answer)" in no_k8s
    assert "GPU Operator" not in no_k8s
    unconfigured = report(Prometheus(fleet()), None, None).summary
    assert "unknown: kubernetes not configured" in unconfigured
    assert "unknown: slurm not configured" in unconfigured


def test_nothing_answering_fails_the_step() -> None:
    with pytest.raises(ActionError, match="could not read anything: kubernetes: not configured; "
                       "prometheus: did not answer"):
        report(Prometheus([], fail=True), None, Reads(fail=True))


def test_the_plan_shows_the_pins_and_the_sources() -> None:
    action = DriftReportAction(Prometheus([]), None, None)
    lines = action.plan(arguments())
    assert lines[0] == "slurm pool: pinned driver 535.161.08, floor 535.54.03 (CUDA 12.2)"
    assert "kubernetes: skipped (not configured)" in lines
    assert lines[-1] == "reads only; changes nothing"
