"""``promql`` checks (bot.execution.checks.monitoring) over a fake Prometheus backend:
every series is
judged by its full label set, so a failing series is never hidden by a passing one that
shares some labels (safety invariant 6); no data and errors fail closed; a failure names
each failing series (capped) with its value, a pass stays short.

The ``lab`` test runs a real Prometheus (Debian's package, tests.adapters.monitoring)
scraping two exporters that report the same GPU: series that differ only in ``instance``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.prometheus.backend import (
    PrometheusApiBackend,
    PrometheusRejected,
    PrometheusUnavailable,
    Sample,
)
from adapters.prometheus.config import PrometheusConfig
from adapters.prometheus.fake import FakePrometheus
from bot.execution.checks.core import Checks, Outcome
from bot.execution.checks.monitoring import MAX_SHOWN, PromqlEvaluator
from bot.execution.planning import PlannedCheck
from tests.adapters.monitoring import Daemon, MetricsServer, binaries, start_prometheus, wait_for

XID = "DCGM_FI_DEV_XID_ERRORS"


def check(promql: str, expect: str = "== 0") -> PlannedCheck:
    return PlannedCheck(name="c", kind="promql", spec={"promql": promql}, expect=expect,
                        for_seconds=0, within_seconds=0, timeout_seconds=5)


def evaluate(answer: list[Sample] | Exception | PrometheusApiBackend, promql: str = "q",
             expect: str = "== 0") -> Outcome:
    backend = answer if isinstance(answer, PrometheusApiBackend) else FakePrometheus(answer)
    evaluator = PromqlEvaluator(backend)
    return Checks({"promql": evaluator}, sleep=lambda s: None).evaluate(check(promql, expect))


def xid(instance: str, value: float, gpu: str = "3") -> Sample:
    return Sample({"__name__": XID, "Hostname": "gpu01", "hostname": "gpu01", "gpu": gpu,
                   "instance": instance, "job": "dcgm"}, value)


@pytest.mark.parametrize("order", ["failing first", "failing last"])
def test_series_differing_only_in_instance_are_judged_apart(order: str) -> None:
    """Two exporters report GPU 3 of gpu01: one sees XID 79. Same Hostname, hostname and
    gpu, different instance: the failing one must fail the check, in either order."""
    samples = [xid("a:9400", 79), xid("b:9400", 0)]
    if order == "failing last":
        samples.reverse()
    outcome = evaluate(samples, XID + '{Hostname="gpu01"}')
    assert outcome.passed is False
    assert outcome.detail == (
        '1 of 2 series not == 0: DCGM_FI_DEV_XID_ERRORS{Hostname="gpu01", gpu="3", '
        'hostname="gpu01", instance="a:9400", job="dcgm"} 79')
    assert outcome.value == {'DCGM_FI_DEV_XID_ERRORS{Hostname="gpu01", gpu="3", '
                             'hostname="gpu01", instance="a:9400", job="dcgm"}': 79.0}


def test_a_by_label_other_than_host_and_gpu_is_not_collapsed() -> None:
    """``max by (UUID)``/``sum by (x)``: the series carry none of Hostname, node or gpu."""
    samples = [Sample({"UUID": "GPU-aaa"}, 95.0), Sample({"UUID": "GPU-bbb"}, 41.0),
               Sample({"UUID": "GPU-ccc"}, 40.0)]
    outcome = evaluate(samples, "max by (UUID) (DCGM_FI_DEV_GPU_TEMP)", "< 90")
    assert outcome.passed is False
    assert outcome.detail == '1 of 3 series not < 90: {UUID="GPU-aaa"} 95'
    sums = [Sample({"x": "1"}, 0.0), Sample({"x": "2"}, 2.0), Sample({"x": "3"}, 0.0)]
    outcome = evaluate(sums, "sum by (x) (errors)")
    assert outcome.passed is False
    assert outcome.detail == '1 of 3 series not == 0: {x="2"} 2'


def test_series_that_differ_only_in_their_metric_name_are_judged_apart() -> None:
    samples = [Sample({"__name__": "a_errors", "node": "gpu01"}, 0.0),
               Sample({"__name__": "b_errors", "node": "gpu01"}, 1.0)]
    outcome = evaluate(samples, '{__name__=~".+_errors", node="gpu01"}')
    assert outcome.passed is False
    assert outcome.detail == '1 of 2 series not == 0: b_errors{node="gpu01"} 1'


def test_every_failing_series_is_named_up_to_a_cap() -> None:
    samples = [xid(f"e{i:02}:9400", 48.0 + i) for i in range(MAX_SHOWN + 3)]
    samples.insert(4, xid("ok:9400", 0))
    outcome = evaluate(samples)
    assert outcome.passed is False
    assert MAX_SHOWN == 10
    assert outcome.detail.startswith(f"{MAX_SHOWN + 3} of {MAX_SHOWN + 4} series not == 0: ")
    assert outcome.detail.endswith(" 57 and 3 more")
    for i in range(MAX_SHOWN):
        assert f'instance="e{i:02}:9400", job="dcgm"}} {48 + i}' in outcome.detail
    assert 'instance="e10:9400"' not in outcome.detail
    assert "ok:9400" not in outcome.detail
    assert len(outcome.value) == MAX_SHOWN


def test_nan_fails_and_label_values_are_quoted() -> None:
    samples = [Sample({"Hostname": 'we"ird', "gpu": "0"}, float("nan"))]
    outcome = evaluate(samples, expect="< 90")
    assert outcome.passed is False
    assert outcome.detail == '1 of 1 series not < 90: {Hostname="we\\"ird", gpu="0"} NaN'


def test_a_pass_stays_short() -> None:
    samples = [xid(f"i{i}:9400", 0) for i in range(64)]
    outcome = evaluate(samples)
    assert outcome.passed is True
    assert outcome.detail == "64 series == 0"
    assert outcome.value == {"series": 64, "min": 0.0, "max": 0.0}
    single = evaluate([Sample({}, 45.0)], "max(DCGM_FI_DEV_GPU_TEMP)", "< 90")
    assert (single.passed, single.detail, single.value) == (True, "1 series < 90", 45.0)


@pytest.mark.parametrize(("answer", "detail"), [
    ([], "no data for q"),
    (PrometheusUnavailable("Prometheus at http://p:9090 is not answering", 3),
     "Prometheus at http://p:9090 is not answering"),
    (PrometheusRejected("Prometheus rejected the query (bad_data): nope", "bad_data", "nope",
                        400), "Prometheus rejected the query (bad_data): nope"),
])
def test_no_data_and_errors_fail_closed(answer: list[Sample] | Exception, detail: str) -> None:
    outcome = evaluate(answer)
    assert (outcome.passed, outcome.value, outcome.detail) == (False, None, detail)


@pytest.mark.lab
def test_a_real_prometheus_keeps_two_exporters_of_one_gpu_apart(tmp_path: Path) -> None:
    prometheus, _ = binaries()
    exporters = [MetricsServer(), MetricsServer()]
    instances = [f"127.0.0.1:{e.port}" for e in exporters]
    gpu = {"Hostname": "gpu01", "hostname": "gpu01", "gpu": "3"}
    daemons: list[Daemon] = []
    try:
        daemon, url = start_prometheus(tmp_path, prometheus, instances)
        daemons.append(daemon)
        backend = PrometheusApiBackend(PrometheusConfig(url=url, timeout=5))

        def reported(values: list[float]) -> None:
            for exporter, value in zip(exporters, values, strict=True):
                exporter.set(XID, gpu, value)
            wanted = dict(zip(instances, values, strict=True))
            wait_for(f"Prometheus sees {wanted}",
                     lambda: {s.labels["instance"]: s.value for s in backend.query(XID)}
                     == wanted, 60, daemons)

        query = XID + '{Hostname="gpu01", gpu="3"}'
        # Each exporter in turn reports the XID: whichever order Prometheus answers in,
        # the failing series is judged on its own.
        for values in ([79.0, 0.0], [0.0, 79.0]):
            reported(values)
            failing = instances[values.index(79.0)]
            outcome = evaluate(backend, query)
            assert outcome.passed is False
            assert outcome.detail == (
                f'1 of 2 series not == 0: {XID}{{Hostname="gpu01", gpu="3", hostname="gpu01", '
                f'instance="{failing}", job="dcgm"}} 79')
            by = evaluate(backend, f"sum by (instance) ({query})")
            assert (by.passed, by.detail) == (
                False, f'1 of 2 series not == 0: {{instance="{failing}"}} 79')
        reported([0.0, 0.0])
        outcome = evaluate(backend, query)
        assert (outcome.passed, outcome.detail) == (True, "2 series == 0")
        missing = evaluate(backend, XID + '{Hostname="gpu02"}')
        assert (missing.passed, missing.detail) == (
            False, f'no data for {XID}{{Hostname="gpu02"}}')
    finally:
        for daemon in daemons:
            daemon.stop()
        for exporter in exporters:
            exporter.stop()
