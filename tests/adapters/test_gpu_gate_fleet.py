"""The GPU gate over a set of nodes (resume-nodes' ``slurm.resume_batches`` with
gpu_telemetry): each node is judged on its own, all watched at once; a failing node stays
drained with the verdict kept after the reason it had, the others return; Prometheus not
answering fails every node still judged. The lab runs it in test_gpu_gate_lab.py."""

from __future__ import annotations

import re
import time
from datetime import datetime
from typing import Any

import pytest

from adapters.actions import ActionContext, ActionError
from adapters.prometheus.backend import PrometheusError, Sample, Series
from adapters.prometheus.gate import gate_nodes
from adapters.slurm import reasons
from adapters.slurm.config import SlurmConfig
from adapters.slurm.fake import FakeSlurm
from adapters.slurm.fleet import ResumeBatchesAction, ResumeBatchesArguments
from adapters.slurm.release import ReleaseArguments, ReservationReleaseAction

NODES = ["gpu01", "gpu02", "gpu03"]


class Fleet:
    """A PrometheusBackend over the nodes' dcgm-exporters: GPUs per node, XID counters."""

    def __init__(self, nodes: list[str] | None = None) -> None:
        self.nodes = list(nodes or NODES)
        self.gpus = {node: set(range(8)) for node in self.nodes}
        self.xids = {node: 0.0 for node in self.nodes}
        self.down: PrometheusError | None = None
        self.error_reads = 0
        self.xid_at_read: tuple[str, int] | None = None  # (node, read): an XID mid-settle
        self.errorless: set[str] = set()  # nodes whose error series Prometheus has not

    def query(self, promql: str, at: datetime | float | None = None, *,
              timeout: float | None = None) -> list[Sample]:
        if self.down:
            raise self.down
        if promql.startswith("DCGM_FI_DEV_GPU_TEMP"):
            node = re.search(r'="([^"]+)"', promql).group(1)  # type: ignore[union-attr]
            return [Sample({"Hostname": node, "gpu": str(g)}, 40.0)
                    for g in sorted(self.gpus.get(node, ()))]
        self.error_reads += 1
        if self.xid_at_read and self.error_reads >= self.xid_at_read[1]:
            self.xids[self.xid_at_read[0]] = 1.0
        named = set(re.findall(r"[A-Za-z0-9_.]+", promql))
        return [Sample({"Hostname": n, "gpu": "0", "__name__": "DCGM_EXP_XID_ERRORS_COUNT"},
                       self.xids[n]) for n in self.nodes
                if n in named and n not in self.errorless]

    def query_range(self, promql: str, start: datetime | float, end: datetime | float,
                    step: float | str, *, timeout: float | None = None) -> list[Series]:
        raise NotImplementedError

    def ready(self, *, timeout: float | None = None) -> bool:
        return self.down is None

    def alerts(self, *, timeout: float | None = None) -> list[dict[str, Any]]:
        if self.down:
            raise self.down
        return []


def ctx() -> ActionContext:
    return ActionContext(execution_id=9, step_id="slurm-resume", deadline=time.monotonic() + 30)


def judged(fleet: Fleet) -> dict[str, str]:
    return gate_nodes(fleet, {n: 8 for n in NODES}, 0.05, ctx(), lambda s: time.sleep(0.01),
                      poll=0.01)


def test_every_node_passes_when_every_gpu_reports_and_nothing_rises() -> None:
    assert judged(Fleet()) == {}


def test_each_node_is_judged_on_its_own() -> None:
    fleet = Fleet()
    fleet.gpus["gpu02"].discard(3)
    fleet.xid_at_read = ("gpu03", 2)  # after the watch's first read: rises while settling
    failed = judged(fleet)
    assert set(failed) == {"gpu02", "gpu03"}
    assert "GPU 3 missing" in failed["gpu02"]
    assert failed["gpu03"].startswith("new GPU errors while settling: gpu03:")


def test_prometheus_not_answering_fails_every_node() -> None:
    fleet = Fleet()
    fleet.down = PrometheusError("connection refused")
    assert set(judged(fleet)) == set(NODES)


def test_a_node_without_error_series_fails_alone_with_its_own_verdict() -> None:
    """The bench's loaded lab: one exporter's series gone failed every node with a verdict
    naming the others (" ++ GPU telemetry: no DCGM error series (...) for gpu[014,...")."""
    fleet = Fleet()
    fleet.errorless.add("gpu03")
    slurm, result = resume(fleet)
    assert result.details["resumed"] == ["gpu01", "gpu02"]
    assert slurm.state["gpu03"].reason == (
        "rack work (execution 5) ++ GPU telemetry: no XID/ECC error series of gpu03 in "
        "Prometheus (its dcgm-exporter not scraped?): its errors cannot be watched "
        "(execution 9: failed check)")
    fleet.errorless.update(NODES)
    assert set(judged(fleet)) == set(NODES)


def resume(fleet: Fleet | None, **args: Any) -> tuple[FakeSlurm, Any]:
    slurm = FakeSlurm(NODES)
    slurm.update_nodes(NODES, "DRAIN", "rack work (execution 5)")
    action = ResumeBatchesAction(slurm, SlurmConfig(), lambda s: None, prometheus=fleet,
                                 gpu_settle=0.05)
    parsed = ResumeBatchesArguments.model_validate({"nodes": "gpu[01-03]", "fail_on_left": False,
                                                    "gpu_telemetry": True, **args})
    return slurm, action.run(parsed, ctx())


def test_resume_batches_returns_the_good_nodes_and_keeps_the_failing_one() -> None:
    fleet = Fleet()
    fleet.gpus["gpu02"].discard(5)
    slurm, result = resume(fleet)
    nodes = {n.name: n for n in slurm.nodes(NODES)}
    assert result.details["resumed"] == ["gpu01", "gpu03"]
    assert "DRAIN" in nodes["gpu02"].flags and "DRAIN" not in nodes["gpu01"].flags
    assert nodes["gpu02"].reason.startswith("rack work (execution 5)")
    assert "GPU 5 missing" in nodes["gpu02"].reason
    assert nodes["gpu02"].reason.endswith("(execution 9: failed check)")
    assert "LEFT DRAINED: gpu02 (failed the GPU gate:" in result.summary


def test_a_long_verdict_keeps_the_reason_the_node_was_drained_for() -> None:
    """Prometheus timing out under load: a verdict as long as a reason may be. The node's
    reason must still say why it was drained and why the gate kept it out (sinfo -R)."""
    fleet = Fleet()
    fleet.down = PrometheusError(
        "HTTPConnectionPool(host='prometheus.monitoring.svc', port=9090): Read timed out. "
        "(read timeout=30) while asking /api/v1/query for DCGM_FI_DEV_GPU_TEMP of the node")
    slurm, result = resume(fleet)
    for node in slurm.nodes(NODES):
        assert node.reason.startswith("rack work (execution 5) ++ GPU telemetry: Prometheus "
                                      "did not answer (GPU series): HTTPConnectionPool")
        assert node.reason.endswith("(execution 9: failed check)")
        assert len(node.reason) <= reasons.MAX_REASON and "DRAIN" in node.flags
        assert reasons.held_by(node.reason) == {5, 9}
    assert result.details["resumed"] == []


def test_without_prometheus_the_gate_is_refused_at_plan_and_run() -> None:
    with pytest.raises(ActionError, match="no Prometheus is configured"):
        resume(None)
    slurm = FakeSlurm(NODES)
    action = ResumeBatchesAction(slurm, SlurmConfig(), lambda s: None)
    with pytest.raises(ActionError, match="gpu_telemetry=false"):
        action.plan(ResumeBatchesArguments.model_validate({"nodes": "gpu[01-03]",
                                                           "gpu_telemetry": True}))


def release(fleet: Fleet, **args: Any) -> tuple[FakeSlurm, ReservationReleaseAction, Any]:
    slurm = FakeSlurm(NODES)
    slurm.create_reservation("rack12", NODES, "now", 3600, ["MAINT"], ["root"])
    slurm.update_nodes(["gpu03"], "DRAIN", "bob: PSU fan")  # out already: not gated
    action = ReservationReleaseAction(slurm, SlurmConfig(), lambda s: None, prometheus=fleet,
                                      gpu_settle=0.05)
    return slurm, action, ReleaseArguments.model_validate({"name": "rack12", **args})


def test_close_maintenance_keeps_out_a_node_that_fails_and_releases_the_rest() -> None:
    fleet = Fleet()
    fleet.gpus["gpu02"].discard(6)
    fleet.gpus["gpu03"].clear()  # would fail, but it stays drained anyway: not judged
    slurm, action, args = release(fleet)
    with pytest.raises(ActionError, match=r"deleted reservation rack12; KEPT OUT: gpu02 "
                                          r"\(DCGM reports 7 of 8 GPUs of gpu02: GPU 6"):
        action.run(args, ctx())
    assert slurm.reservations() == []
    assert slurm.state["gpu02"].reason.endswith("(execution 9: failed check)")
    assert slurm.state["gpu03"].reason == "bob: PSU fan"
    assert "DRAIN" not in slurm.state["gpu01"].flags


def test_close_maintenance_with_every_gpu_back_just_releases() -> None:
    slurm, action, args = release(Fleet())
    assert "passed" in action.run(args, ctx()).summary
    assert slurm.reservations() == []
    assert any(line.startswith("first, DCGM in Prometheus") for line in action.plan(args))
    _, plain, without = release(Fleet(), gpu_telemetry=False)
    assert not any("DCGM" in line for line in plain.plan(without))
