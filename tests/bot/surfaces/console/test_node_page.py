"""/ui/nodes/{name}: the executions that touched a node (a single node parameter, or inside
a hostlist), newest first and paged, beside what Slurm, Kubernetes and Prometheus say now;
a backend that fails or is not configured is a line on the page, never a 500; an unknown
node is a 404, a malformed name a 400; the search redirects or lists."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.kubernetes.fake import FakeKubernetes
from adapters.prometheus.backend import PrometheusError, Sample
from adapters.prometheus.fake import FakePrometheus
from adapters.slurm.fake import FakeSlurm
from bot.execution.engine import Engine
from bot.runbooks.params import Inventory
from bot.service import Service
from bot.surfaces.console import node_page
from tests.bot import fakes
from tests.bot.surfaces.console.pagehelp import Element, as_user, client, overrides, parse
from tests.conftest import NODES, BotFactory

SECRET = "hunter2-node-secret"


@pytest.fixture(autouse=True)
def _clean() -> None:
    fakes.reset()


def runbooks() -> dict[str, Any]:
    step = {"id": "a", "action": "test.record", "with": {"key": "k"}}
    return {
        "one": {"name": "one", "version": "1.0.0", "summary": "a node", "risk": "low",
                "params": {"node": {"type": "node", "required": True},
                           "password": {"type": "text", "default": SECRET}},
                "steps": [step]},
        "many": {"name": "many", "version": "1.0.0", "summary": "a hostlist", "risk": "low",
                 "params": {"nodes": {"type": "nodes", "required": True}}, "steps": [step]},
    }


@pytest.fixture
def bot(make_bot: BotFactory) -> Service:
    bot = make_bot(runbooks(), **overrides())
    engine = Engine(bot, sleep=lambda s: None)
    for name, params, user in [("one", {"node": "gpu02"}, "alice"),  # 1
                               ("many", {"nodes": "gpu[01-03]"}, "bob"),  # 2: gpu02 inside
                               ("one", {"node": "gpu03"}, "alice")]:  # 3: not gpu02
        engine.drive(bot.request(name, params, user))
    engine.close()
    return bot


def page(bot: Service, path: str, status: int = 200) -> Element:
    answer = client(bot).get(path, headers=as_user("alice"))
    assert answer.status_code == status, answer.text[:2000]
    assert SECRET not in answer.text
    return parse(answer.text)


def touched(doc: Element) -> list[str]:
    table = doc.all("table")[-1]
    return [row[0] for row in table.rows()]


def test_every_execution_that_touched_it_hostlists_too(bot: Service) -> None:
    doc = page(bot, "/ui/nodes/gpu02")
    assert touched(doc) == ["2", "1"]
    links = {a.attrs["href"] for a in doc.all("a")}
    assert {"/ui/executions/2", "/ui/executions/1"} <= links
    assert "/ui/executions?node=gpu02" in links
    assert touched(page(bot, "/ui/nodes/gpu01")) == ["2"]
    assert touched(page(bot, "/ui/nodes/gpu04")) == ["No execution."]


def test_unconfigured_systems_are_said_so(bot: Service) -> None:
    text = page(bot, "/ui/nodes/gpu02").text()
    assert "Slurm is not configured for the bot" in text
    assert "Kubernetes is not configured for the bot" in text
    assert "Prometheus is not configured for the bot" in text


def test_the_node_now_beside_its_executions(bot: Service) -> None:
    slurm = FakeSlurm(NODES)
    slurm.update_nodes(["gpu04"], "DRAIN", "XID 79 on GPU 3")
    kubernetes = FakeKubernetes(["gpu04"])
    samples = [Sample({"__name__": "DCGM_FI_DEV_XID_ERRORS", "Hostname": "gpu04", "gpu": "3",
                       "DCGM_FI_DRIVER_VERSION": "550.54"}, 79.0)]
    bot.backends = {"slurm": slurm, "kubernetes": kubernetes,
                    "prometheus": FakePrometheus(samples)}
    doc = page(bot, "/ui/nodes/gpu04")
    text = doc.text()
    assert "+DRAIN" in text and "XID 79 on GPU 3" in text
    assert "schedulable" in text and "NOT Ready" not in text
    gpus = next(table for table in doc.all("table") if "Last XID" in table.text())
    assert gpus.rows()[0][:2] == ["3", "79"] and gpus.rows()[0][-1] == "550.54"
    assert "is not in the Kubernetes pool" in page(bot, "/ui/nodes/gpu01").text()


def test_a_failing_backend_is_a_line_on_the_page_not_a_500(bot: Service) -> None:
    class Broken(FakeSlurm):
        def nodes(self, names: list[str] | None = None, *, with_jobs: bool = True) -> Any:
            raise RuntimeError("socket closed")

    bot.backends = {"slurm": FakeSlurm(NODES),
                    "prometheus": FakePrometheus(PrometheusError("Prometheus at :9090: refused"))}
    doc = page(bot, "/ui/nodes/gpu02")
    (problem,) = doc.all("p", "problem")
    assert "Prometheus: Prometheus at :9090: refused" in problem.text()
    assert touched(doc) == ["2", "1"]
    bot.backends = {"slurm": Broken(NODES)}
    doc = page(bot, "/ui/nodes/gpu02")
    assert "the node view failed: RuntimeError: socket closed" in doc.one("p", "problem").text()
    assert touched(doc) == ["2", "1"]


def test_a_node_no_longer_in_the_inventory_keeps_its_history(bot: Service) -> None:
    bot.inventory = Inventory(nodes=frozenset({"gpu01"}), slurm=frozenset({"gpu01"}))
    doc = page(bot, "/ui/nodes/gpu02")
    assert "not in the bot's inventory now" in doc.text()
    assert touched(doc) == ["2", "1"]


def test_older_executions_are_a_page_away(bot: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_page, "SHOWN", 1)
    doc = page(bot, "/ui/nodes/gpu02")
    assert touched(doc) == ["2"]
    (older,) = [a for a in doc.all("a") if a.text() == "Older →"]
    assert older.attrs["href"] == "/ui/nodes/gpu02?before=2"
    doc = page(bot, older.attrs["href"])
    assert touched(doc) == ["1"]
    assert not [a for a in doc.all("a") if a.text() == "Older →"]
    page(bot, "/ui/nodes/gpu02?before=x", status=400)
    page(bot, "/ui/nodes/gpu02?before=99999999999999999999", status=400)


def test_unknown_and_malformed_names(bot: Service) -> None:
    assert "no node gpu99" in page(bot, "/ui/nodes/gpu99", status=404).text()
    for bad in ("gpu%2001", "gpu;rm", "%C3%A9", "x" * 201):
        assert "is not a node name" in page(bot, f"/ui/nodes/{bad}", status=400).text()


def test_the_search_goes_to_a_node_or_lists_a_hostlist(bot: Service) -> None:
    answer = client(bot).get("/ui/nodes?name=gpu02", headers=as_user("alice"))
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/nodes/gpu02"
    doc = page(bot, "/ui/nodes?name=gpu[02-05]")
    assert [row[0] for row in doc.all("table")[0].rows()] == ["gpu02", "gpu03", "gpu04", "gpu05"]
    assert doc.all("table")[0].rows()[-1][1] == "no"  # gpu05 is not in the inventory
    assert [row[0] for row in page(bot, "/ui/nodes").all("table")[0].rows()] == NODES
    assert "neither a node name nor a hostlist" in page(bot, "/ui/nodes?name=gpu[",
                                                        status=400).text()
