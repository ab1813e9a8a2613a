"""Every query the adapters build from a value keeps its structure whatever the value holds:
hostile node names through the soak, the GPU gate, the swap evidence and ``build`` itself,
judged by a structure parsed apart from the bot's (tests/adapters/promql_shape.py); a value
outside double quotes must be one number or duration, and a template that lets a value
change its tokens (single quotes, a backslash before the value) is refused."""

from __future__ import annotations

import re

import pytest

from adapters.prometheus.fake import FakePrometheus
from adapters.prometheus.gate import GpuGate
from adapters.prometheus.identity import dcgm_identities
from adapters.prometheus.soak import ErrorWatch
from adapters.prometheus.template import QueryShapeError, build, seal
from adapters.reports.gpu_usage import GpuUsageArguments, GpuUsageReportAction
from tests.adapters.promql_shape import HOSTILE, structure, values


@pytest.mark.parametrize("value", HOSTILE)
def test_build_keeps_every_value_inside_its_label_value(value: str) -> None:
    template = 'max(DCGM_FI_DEV_GPU_TEMP{Hostname="$node", gpu=~"$node"}) or up{job="$node"} > $n'
    query = build(template, node=value, n=0)
    assert structure(query) == structure(build(template, node="gpu01", n=0))
    assert values(query) == [value, value, value]


@pytest.mark.parametrize("value", HOSTILE)
def test_the_soak_query_keeps_its_structure(value: str) -> None:
    query = ErrorWatch(FakePrometheus([]), ["gpu01", value]).query()
    assert structure(query) == structure(ErrorWatch(FakePrometheus([]), ["gpu01", "b"]).query())
    assert values(query)[1] == f"gpu01|{re.escape(value)}"


@pytest.mark.parametrize("value", HOSTILE)
def test_the_gpu_gate_query_keeps_its_structure(value: str) -> None:
    asked = []
    for node in (value, "gpu01"):
        prometheus = FakePrometheus([])
        GpuGate(prometheus, node, 8).presence()
        asked.append(prometheus.queries[0])
    assert structure(asked[0]) == structure(asked[1])
    assert values(asked[0]) == [value, value]


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("lookback", [None, 600.0])
def test_the_swap_evidence_queries_keep_their_structure(value: str,
                                                        lookback: float | None) -> None:
    asked = []
    for node in (value, "gpu01"):
        prometheus = FakePrometheus([])
        dcgm_identities(prometheus, node, 3, lookback)
        asked.append(prometheus.queries)
    assert [structure(q) for q in asked[0]] == [structure(q) for q in asked[1]]
    assert [values(q) for q in asked[0]] == [[value, "3"], [value, "3"]]


def test_the_usage_report_window_is_one_duration() -> None:
    report = GpuUsageReportAction(None, FakePrometheus([]))  # type: ignore[arg-type]
    query = report._query(GpuUsageArguments(idle_for=5400))
    assert query == "max_over_time(DCGM_FI_DEV_GPU_UTIL[5400s])"


@pytest.mark.parametrize("value", [v for v in HOSTILE if v] + ["5 or vector(1)", "1e3x", "-1"])
def test_a_value_outside_quotes_must_be_one_number(value: str) -> None:
    with pytest.raises(QueryShapeError):
        build("up > $n", n=value)


@pytest.mark.parametrize("value", [5, 0.25, "7", "1e3", "10m", "1h30m", 0])
def test_a_number_or_a_duration_may_stand_outside_quotes(value: object) -> None:
    assert build("up > $n", n=value) == f"up > {value}"


@pytest.mark.parametrize("template", [
    "up{a='$v'}",  # single quotes: escaping is for double-quoted strings only
    "up{a=`$v`}",
    'up{a="pre\\$v", b="c"}',  # a backslash of the template's would pair with the value's
    "up{a=$v}",  # no quotes at all
    "$v",
    "up # $v",
])
def test_a_template_where_a_value_could_move_is_refused(template: str) -> None:
    with pytest.raises(QueryShapeError):
        build(template, v='\\"} or vector(1) #')


def test_the_reserved_marks_are_refused_in_values_and_templates() -> None:
    with pytest.raises(QueryShapeError):
        build('up{a="$v"}', v="\ue001 or vector(1)")
    with pytest.raises(QueryShapeError):
        seal('up{a="\ue000x"}')
