"""``report.gpu_usage`` over fake Slurm and Prometheus backends: GPU-hours and queue wait per
account, allocated-but-idle GPUs (Slurm allocation against DCGM utilisation), nodes drained
for more than a day with their reasons, and "unknown" (never a guess) for a part whose
system does not answer."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from adapters.actions import ActionContext, ActionError
from adapters.prometheus.backend import PrometheusUnavailable, Sample
from adapters.reports.gpu_usage import GpuUsageArguments, GpuUsageReportAction
from adapters.slurm.backend import AccountUsage, NodeInfo, SlurmError
from adapters.slurm.fake import FakeSlurm

NOW = datetime(2026, 3, 9, 8, 0, tzinfo=UTC).timestamp()
DAY = 86400


class Slurm(FakeSlurm):
    """The nodes and the accounting as given, or failing like an unreachable slurmctld."""

    def __init__(self, nodes: list[NodeInfo], usage: list[AccountUsage] | None = None,
                 fail: bool = False) -> None:
        super().__init__([])
        self._nodes = nodes
        self.usage = usage or []
        self.fail = fail
        self.asked: list[tuple[datetime, datetime]] = []

    def nodes(self, names: list[str] | None = None, *, with_jobs: bool = True) -> list[NodeInfo]:
        if self.fail:
            raise SlurmError("slurmctld does not answer", ["sinfo", "--json"])
        return self._nodes

    def accounting(self, start: datetime, end: datetime) -> list[AccountUsage]:
        self.asked.append((start, end))
        if self.fail:
            raise SlurmError("slurmdbd does not answer", ["sacct", "--json"])
        return self.usage


class Prometheus:
    def __init__(self, samples: list[Sample], fail: bool = False) -> None:
        self.samples = samples
        self.fail = fail
        self.queries: list[str] = []

    def query(self, promql: str, at: Any = None, *, timeout: float | None = None) -> list[Any]:
        self.queries.append(promql)
        if self.fail:
            raise PrometheusUnavailable("Prometheus: connection refused", attempts=3)
        return self.samples


def util(host: str, gpu: int, value: float, label: str = "Hostname") -> Sample:
    return Sample(labels={label: host, "gpu": str(gpu)}, value=value)


def context() -> ActionContext:
    return ActionContext(execution_id=1, step_id="report", deadline=time.monotonic() + 60)


def report(slurm: Slurm, prometheus: Prometheus | None, **args: Any) -> Any:
    action = GpuUsageReportAction(slurm, prometheus, clock=lambda: NOW)
    return action.run(GpuUsageArguments(**args), context())


NODES = [
    NodeInfo("gpu01", "mixed", gpus_total=8, gpus_used=4, jobs=[101]),
    NodeInfo("gpu02", "allocated", gpus_total=8, gpus_used=8, jobs=[102, 103]),
    NodeInfo("gpu03", "idle", frozenset({"DRAIN"}), reason="XID 79 on GPU 3",
             reason_user="alice", reason_time=int(NOW - 3 * DAY), gpus_total=8),
    NodeInfo("gpu04", "idle", frozenset({"DRAIN"}), reason="fan", reason_time=int(NOW - 3600),
             gpus_total=8),
    NodeInfo("gpu05", "idle", gpus_total=8),
]
USAGE = [AccountUsage("vision", 120.5, 10, 600.0), AccountUsage("nlp", 900.25, 4, 5400.0)]


def test_the_three_parts() -> None:
    samples = [util("gpu01", g, 0 if g < 3 else 80) for g in range(8)]  # 3 idle, 5 busy
    samples += [util("gpu02", g, 1 if g == 7 else 95, "hostname") for g in range(8)]
    prometheus = Prometheus(samples)
    slurm = Slurm(NODES, USAGE)
    result = report(slurm, prometheus, period="7d", idle_below=5, idle_for="1h")
    text = result.summary
    assert not result.changed
    assert text.splitlines()[0] == ("GPU usage report, 2026-03-02 08:00 to 2026-03-09 08:00 "
                                    "UTC (7d)")
    lines = text.splitlines()
    nlp = next(line for line in lines if line.strip().startswith("nlp"))
    assert nlp.split() == ["nlp", "900.2", "4", "1h30m"]  # biggest user first
    assert "total" in text and "1020.8" in text
    assert slurm.asked[0][1] - slurm.asked[0][0] == (
        datetime(2026, 3, 9, tzinfo=UTC) - datetime(2026, 3, 2, tzinfo=UTC))
    assert prometheus.queries == ["max_over_time(DCGM_FI_DEV_GPU_UTIL[3600s])"]
    # gpu01: 4 allocated, 5 GPUs busy: nothing idle among the allocated ones
    assert "gpu01:" not in text
    assert "  gpu02: 1 of 8 allocated GPUs idle (GPUs under 5%: 7, jobs 102,103)" in lines
    assert "  total: 1 allocated GPUs idle on 1 node(s)" in lines
    assert ('  gpu03: drained for 3d (since 2026-03-06 08:00 UTC by alice): "XID 79 on GPU 3"'
            in lines)
    assert "gpu04: drained" not in text  # drained for an hour only
    assert result.details["idle"][0]["node"] == "gpu02"
    assert [d["node"] for d in result.details["drained"]] == ["gpu03"]


def test_idle_gpus_on_a_node_with_allocation() -> None:
    samples = [util("gpu01", g, 0 if g < 6 else 70) for g in range(8)]  # 2 busy, 4 allocated
    text = report(Slurm(NODES[:1]), Prometheus(samples)).summary
    assert "  gpu01: 2 of 4 allocated GPUs idle (GPUs under 5%: 0,1,2,3,4,5, jobs 101)" in (
        text.splitlines())


def test_a_node_without_telemetry_is_unknown_not_idle() -> None:
    text = report(Slurm(NODES[:2]), Prometheus([])).summary
    assert "no DCGM telemetry (unknown, not idle): gpu01, gpu02" in text
    assert "  none" in text


def test_names_that_differ_between_slurm_and_dcgm() -> None:
    samples = [util("gpu02-bmc", g, 0) for g in range(8)]
    text = report(Slurm(NODES[1:2]), Prometheus(samples),
                  dcgm_names={"gpu02": "gpu02-bmc"}).summary
    assert "gpu02: 8 of 8 allocated GPUs idle" in text


def test_a_part_whose_system_does_not_answer_says_unknown() -> None:
    text = report(Slurm(NODES, USAGE), Prometheus([], fail=True)).summary
    assert "unknown: Prometheus did not answer" in text
    assert "nlp" in text and "gpu03: drained" in text
    assert "unknown: no prometheus section is configured" in report(
        Slurm(NODES, USAGE), None).summary


def test_nothing_answering_fails_the_step() -> None:
    with pytest.raises(ActionError, match="could not read anything"):
        report(Slurm(NODES, fail=True), Prometheus([], fail=True))


def test_the_plan_says_what_it_reads() -> None:
    action = GpuUsageReportAction(Slurm([]), None)
    lines = action.plan(GpuUsageArguments(period="30d"))
    assert lines[0].startswith("sacct --json --allusers -X for the last 30d")
    assert "skipped (no prometheus section configured)" in lines[2]
    assert lines[-1] == "reads only; changes nothing"


def test_sacct_finding_no_job_is_an_empty_period_not_an_error() -> None:
    """Slurm 22.05's sacct --json reports "Nothing found" as an error when no job ran."""
    import json

    from adapters.slurm.config import SlurmConfig
    from adapters.slurm.transports.cli import CliBackend
    from tests.adapters.test_slurm_parsing import FakeRunner

    empty = {"meta": {}, "errors": [{"error": "Nothing found", "error_number": 9003,
                                     "source": "slurmdb_jobs_get"}], "jobs": []}
    runner = FakeRunner({"sacct --json": (0, json.dumps(empty), ""),
                         "scontrol ping": (0, "Slurmctld(primary) at vm is UP\n", "")})
    backend = CliBackend(SlurmConfig(), runner=runner)
    start = datetime(2026, 3, 1, tzinfo=UTC)
    assert backend.accounting(start, datetime(2026, 3, 2, tzinfo=UTC)) == []
    broken = {"meta": {}, "errors": [{"error": "Unspecified error", "errno": -1}], "jobs": []}
    runner = FakeRunner({"sacct --json": (0, json.dumps(broken), ""),
                         "scontrol ping": (0, "Slurmctld(primary) at vm is UP\n", "")})
    with pytest.raises(SlurmError, match="reported errors"):
        CliBackend(SlurmConfig(), runner=runner).accounting(start, start)
