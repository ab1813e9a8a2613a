"""Alerts to proposals over HTTP: Alertmanager's webhook (version 4) posted to the bot's real
server; a matching firing alert proposes its runbook once per fingerprint, resolved alerts
update the proposal, bad payloads get a 400 and change nothing, auto_run only for low risk,
/healthz and /metrics answer."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from bot.alerts import proposing
from bot.config import ServerConfig
from bot.runtime.serving import make_handler
from bot.store import audit
from bot.surfaces.chat import commands
from kit.errors import Refused
from tests.bot import fakes
from tests.bot.execution.test_engine import record, runbook
from tests.conftest import BotFactory

RULES = [
    {"match": {"alertname": "GpuXidFallenOffBus"}, "runbook": "demo",
     "params": {"node": "{{ labels.node }}"}},
    {"match": {"alertname": "GpuTemperatureHigh|GpuEccDoubleBit"}, "runbook": "harmless",
     "params": {"node": "{{ labels.node }}"}, "auto_run": True},
    {"match": {"alertname": "GpuRowRemapFailure"}, "runbook": "demo",
     "params": {"node": "{{ labels.node }}"}, "auto_run": True},
]


@pytest.fixture
def served(make_bot: BotFactory) -> Iterator[tuple[Any, str]]:
    from http.server import ThreadingHTTPServer

    fakes.reset()
    bot = make_bot({"demo": runbook([record("a", "a")], risk="medium"),
                    "harmless": {**runbook([record("h", "h")], risk="low"), "name": "harmless",
                                 "locks": []}},
                   alert_rules=RULES)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(bot))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield bot, f"http://127.0.0.1:{port}"
    server.shutdown()
    server.server_close()


def post(url: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + "/alerts", data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def webhook(*alerts: dict[str, Any]) -> dict[str, Any]:
    return {"version": "4", "status": "firing", "receiver": "bot", "groupKey": "{}:{}",
            "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://alertmanager", "alerts": list(alerts)}


def alert(name: str, node: str, status: str = "firing", fingerprint: str = "f1") -> dict[str, Any]:
    return {"status": status, "labels": {"alertname": name, "node": node, "gpu": "3"},
            "annotations": {}, "startsAt": "2026-11-30T10:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "", "fingerprint": fingerprint}


def test_firing_alert_proposes_once(served: Any) -> None:
    bot, url = served
    code, body = post(url, webhook(alert("GpuXidFallenOffBus", "gpu02")))
    assert code == 200 and body["proposals"][0]["params"] == {"node": "gpu02"}
    code, body = post(url, webhook(alert("GpuXidFallenOffBus", "gpu02")))  # repeated
    assert code == 200 and body["proposals"] == []
    found = proposing.listing(bot)
    assert [(p.runbook, p.params, p.state) for p in found] == [("demo", {"node": "gpu02"},
                                                                 "open")]
    code, body = post(url, webhook(alert("GpuXidFallenOffBus", "gpu02", status="resolved")))
    assert body["proposals"][0]["alert_status"] == "resolved"


def test_run_and_dismiss(served: Any) -> None:
    bot, url = served
    post(url, webhook(alert("GpuXidFallenOffBus", "gpu01", fingerprint="a"),
                      alert("GpuXidFallenOffBus", "gpu03", fingerprint="b")))
    first, second = sorted(proposing.listing(bot), key=lambda p: p.id)
    execution_id = proposing.run(bot, first.id, "alice")
    assert bot.get(execution_id).state == "awaiting_approval"  # medium risk: a person approves
    proposing.dismiss(bot, second.id, "bob", "known flaky GPU")
    assert proposing.listing(bot) == []
    with pytest.raises(Exception, match="not open"):
        proposing.run(bot, second.id, "alice")


def test_only_a_requester_may_dismiss(served: Any) -> None:
    bot, url = served
    post(url, webhook(alert("GpuXidFallenOffBus", "gpu01", fingerprint="d")))
    proposal = proposing.listing(bot)[0]
    with pytest.raises(Refused, match="mallory may not dismiss proposals"):
        proposing.dismiss(bot, proposal.id, "mallory", "not my problem")
    assert [p.id for p in proposing.listing(bot)] == [proposal.id]  # still open
    answer = commands.handle(bot, f"proposal dismiss {proposal.id}", "mallory")
    assert not answer.ok and "requesters: group:oncall, group:gpu-leads" in answer.text
    assert proposing.dismiss(bot, proposal.id, "alice", None).state == "dismissed"


def test_auto_run_only_for_low_risk(served: Any) -> None:
    bot, url = served
    post(url, webhook(alert("GpuTemperatureHigh", "gpu01", fingerprint="t"),
                      alert("GpuRowRemapFailure", "gpu02", fingerprint="r")))
    by_alert = {p.alertname: p for p in proposing.listing(bot, open_only=False)}
    assert by_alert["GpuTemperatureHigh"].state == "started"
    low = bot.get(by_alert["GpuTemperatureHigh"].execution_id)
    assert low.runbook == "harmless" and low.requested_by == "alertmanager"
    assert by_alert["GpuRowRemapFailure"].state == "open"  # medium: never without a person
    assert "auto_run ignored" in (by_alert["GpuRowRemapFailure"].note or "")


def test_unknown_node_is_recorded_as_refused(served: Any) -> None:
    bot, url = served
    code, body = post(url, webhook(alert("GpuXidFallenOffBus", "gpu99")))
    assert code == 200 and body["proposals"][0]["state"] == "refused"
    assert proposing.listing(bot) == []


def refusals(bot: Any) -> list[dict[str, Any]]:
    with bot.db.connect() as conn:
        return [e["data"] for e in audit.events(conn) if e["kind"] == "proposal_refused"]


def test_an_alert_without_a_label_its_rule_uses_is_refused_and_the_batch_goes_on(
        served: Any) -> None:
    bot, url = served
    bare = alert("GpuXidFallenOffBus", "gpu02", fingerprint="b")
    del bare["labels"]["node"]
    code, body = post(url, webhook(alert("GpuXidFallenOffBus", "gpu01", fingerprint="a"), bare,
                                   alert("GpuXidFallenOffBus", "gpu03", fingerprint="c")))
    assert code == 200
    assert [(p["fingerprint"], p["state"], p["params"]) for p in body["proposals"]] == [
        ("a", "open", {"node": "gpu01"}), ("b", "refused", {}), ("c", "open", {"node": "gpu03"})]
    reason = body["proposals"][1]["note"]
    assert reason == ("parameter node: template '{{ labels.node }}': 'dict object' has no "
                      "attribute 'node' (the alert's labels: alertname, gpu)")
    assert [(r["fingerprint"], r["reason"]) for r in refusals(bot)] == [("b", reason)]
    assert sorted(p.params["node"] for p in proposing.listing(bot)) == ["gpu01", "gpu03"]


def test_an_alert_that_fails_otherwise_is_refused_and_the_batch_goes_on(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    bot, url = served
    real = bot.plan

    def plan(name: str, params: dict[str, str], **kwargs: Any) -> Any:
        if params.get("node") == "gpu02":
            raise RuntimeError("something unforeseen")
        return real(name, params, **kwargs)

    monkeypatch.setattr(bot, "plan", plan)
    code, body = post(url, webhook(*(alert("GpuXidFallenOffBus", node, fingerprint=node)
                                      for node in ("gpu01", "gpu02", "gpu03"))))
    assert code == 200
    assert [(p["fingerprint"], p["state"], p["note"]) for p in body["proposals"]] == [
        ("gpu01", "open", None),
        ("gpu02", "refused", "could not be proposed: RuntimeError: something unforeseen"),
        ("gpu03", "open", None)]
    assert [r["fingerprint"] for r in refusals(bot)] == ["gpu02"]


def test_a_request_of_too_many_alerts_is_refused_whole(served: Any) -> None:
    bot, url = served
    assert bot.config.server.max_alerts_per_request == 200
    many = [alert("GpuXidFallenOffBus", "gpu01", fingerprint=f"m{n}") for n in range(201)]
    code, body = post(url, webhook(*many))
    assert (code, body) == (413, {"error": (
        "201 alerts in one request; at most 200 are taken (server.max_alerts_per_request): "
        "set max_alerts in Alertmanager's webhook_config to at most that")})
    bot.config = bot.config.model_copy(update={
        "server": ServerConfig(max_alerts_per_request=2)})
    code, _ = post(url, webhook(*many[:3]))
    assert code == 413
    assert proposing.listing(bot, open_only=False) == []
    code, body = post(url, webhook(*many[:2]))
    assert code == 200 and [p["fingerprint"] for p in body["proposals"]] == ["m0", "m1"]


@pytest.mark.parametrize("body, message", [
    (b"not json", "not an Alertmanager webhook"),
    ({"version": "3", "status": "firing", "alerts": []}, "version"),
    ({"version": "4", "status": "firing", "alerts": [{"labels": {}}]}, "alerts.0.status"),
])
def test_bad_payload_is_refused_and_changes_nothing(served: Any, body: Any, message: str) -> None:
    bot, url = served
    code, answer = post(url, body)
    assert code == 400 and message in answer["error"]
    assert proposing.listing(bot, open_only=False) == []


def test_healthz_and_metrics(served: Any) -> None:
    _, url = served
    post(url, webhook(alert("GpuXidFallenOffBus", "gpu02")))
    with urllib.request.urlopen(url + "/healthz", timeout=5) as response:
        assert json.loads(response.read()) == {"status": "ok"}
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    assert "runbook_open_proposals 1.0" in text
    assert "runbook_step_duration_seconds_count" in text
