"""One escaping rule for every PromQL a plan holds: a parameter (or an alert label feeding
one) with quotes, backslashes, newlines, braces or ``"}) or vector(1)`` stays inside its
label value in a ``promql:`` check and in every step argument that is a query
(``prom.wait``'s), judged by a structure parsed apart from the bot's; a value outside double
quotes plans only as a number, and every action argument that takes a query says so."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from adapters.prometheus.actions import PrometheusActions
from adapters.prometheus.config import PrometheusConfig
from adapters.prometheus.fake import FakePrometheus
from adapters.prometheus.template import query_arguments
from bot.config import Config
from bot.execution.planning import Plan, PlanError, make_plan
from bot.runbooks import params
from bot.runbooks.catalogue import KNOWN, Catalogue
from bot.runbooks.inventory import PoolInventory
from bot.runbooks.loading import load_text
from bot.surfaces import nodeview
from tests.adapters.promql_shape import HOSTILE, structure, values

NODES = frozenset({"gpu01", "gpu02"})
INVENTORY = PoolInventory(nodes=NODES, slurm=NODES, kubernetes=frozenset())
RUNBOOK = """\
name: wait-for-host
version: 1.0.0
summary: Wait until a host's GPUs are cool.
risk: low
params:
  host: {type: text, max_length: 200, required: true}
  limit: {type: text, max_length: 50, default: "90"}
pre_checks:
  - name: the host reports
    promql: 'count(DCGM_FI_DEV_GPU_TEMP{Hostname="{{ host }}", job=~"dcgm|{{ host }}"})'
    expect: "> 0"
steps:
  - id: cool
    action: prom.wait
    with:
      query: 'max(DCGM_FI_DEV_GPU_TEMP{Hostname="{{ host }}"}) > {{ limit }}'
      expect: "== 0"
      timeout: 10m
post_checks:
  - name: still cool
    promql: 'max(DCGM_FI_DEV_GPU_TEMP{Hostname="{{ host }}"}) or vector({{ limit }})'
    expect: "< 90"
"""


def plan(values: dict[str, Any]) -> Plan:
    wait = PrometheusActions(PrometheusConfig(url="http://prometheus:9090")).by_name()
    catalogue = Catalogue([wait["prom.wait"]], KNOWN)
    loaded = load_text(RUNBOOK, Path("wait-for-host.yaml"), catalogue.arguments())
    return make_plan(loaded, {"limit": "90", **values}, INVENTORY, catalogue, Config())


def queries(made: Plan) -> list[str]:
    return [made.pre_checks[0].spec["promql"], made.steps[0].args["query"],
            made.post_checks[0].spec["promql"]]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_hostile_value_stays_inside_its_label_value_in_checks_and_steps(value: str) -> None:
    hostile, benign = queries(plan({"host": value})), queries(plan({"host": "gpu01"}))
    assert [structure(q) for q in hostile] == [structure(q) for q in benign]
    assert [values(q) for q in hostile] == [[value, f"dcgm|{value}"], [value], [value]]


def test_the_issues_value_through_a_text_parameter() -> None:
    """The value from the issue, validated as a text parameter first, as a request is."""
    value = 'gpu01"}) or vector(0) or max(up{job="x'
    loaded = load_text(RUNBOOK, Path("wait-for-host.yaml"), {
        name: known[0] for name, known in KNOWN.items()})
    checked = params.validate(loaded.runbook, {"host": value}, INVENTORY)
    wait = plan(checked).steps[0].args["query"]
    assert wait == 'max(DCGM_FI_DEV_GPU_TEMP{Hostname="gpu01\\"}) or vector(0) or ' \
                   'max(up{job=\\"x"}) > 90'


@pytest.mark.parametrize("limit", ["90 or vector(1)", "1) or vector(0", "", "x", '"90"'])
def test_a_value_outside_quotes_plans_only_as_a_number(limit: str) -> None:
    with pytest.raises(PlanError, match="would change the query"):
        plan({"host": "gpu01", "limit": limit})
    assert queries(plan({"host": "gpu01", "limit": "85.5"}))[1].endswith("> 85.5")


def test_every_action_argument_that_takes_a_query_is_declared_one() -> None:
    """A new action with a PromQL argument gets the rule by declaring it (template.QUERY);
    one that forgets is caught here by its name or description."""
    found: dict[str, list[str]] = {}
    for name, (arguments, _section) in KNOWN.items():
        for field, info in arguments.model_fields.items():
            said = f"{field} {info.description or ''}".lower()
            if field in ("query", "promql") or "promql" in said:
                found.setdefault(name, []).append(field)
    assert found == {"prom.wait": ["query"]}
    assert all(tuple(fields) == query_arguments(KNOWN[name][0]) for name, fields in found.items())


@pytest.mark.parametrize("value", HOSTILE)
def test_the_node_views_query_keeps_its_structure(value: str) -> None:
    """``runbook node``: a DCGM name from the inventory stays one alternative of its regex."""
    asked = []
    for name in (value, "gpu01"):
        prometheus = FakePrometheus([])
        facts = {"dcgm_name": {"gpu01": name, "gpu02": "gpu02"}}
        sources = SimpleNamespace(backends={"prometheus": prometheus},
                                  inventory=SimpleNamespace(facts=lambda f=facts: f))
        nodeview._gpus(sources, {n: nodeview.NodeView(n) for n in ("gpu01", "gpu02")})
        asked.append(prometheus.queries[0])
    assert structure(asked[0]) == structure(asked[1])
    assert values(asked[0])[1] == "|".join(re.escape(h) for h in sorted([value, "gpu02"]))
