"""Alerts to proposals over HTTP: Alertmanager's webhook (version 4) posted to the bot's real
server with its bearer token; a matching firing alert proposes its runbook once per firing
(a re-sent, flapping or refused alert updates its proposal and is audited once), resolved
alerts update the proposal, bad payloads get a 400 and change nothing, auto_run only for low
risk, /healthz and /metrics answer. The route's guards: 401 without the token, 400 for a
Content-Length that is not a size, 413 over 1 MiB."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from bot.alerts import proposing
from bot.config import ServerConfig
from bot.runtime import access
from bot.runtime.httpserver import HttpServer, Settings
from bot.runtime.serving import application
from bot.store import audit
from bot.store.schema import executions
from bot.surfaces.chat import commands
from bot.surfaces.slack.blocks import plan_message
from kit.errors import Refused
from tests.bot import fakes
from tests.bot.execution.test_engine import record, runbook
from tests.conftest import BotFactory

TOKEN = "test-alerts-token-0123456789abcdef"
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
    fakes.reset()
    bot = make_bot({"demo": runbook([record("a", "a")], risk="medium"),
                    "harmless": {**runbook([record("h", "h")], risk="low"), "name": "harmless",
                                 "locks": []}},
                   alert_rules=RULES)
    server = HttpServer(application(bot, alerts_token=TOKEN), "127.0.0.1", 0, Settings(grace=1))
    server.start()
    yield bot, f"http://127.0.0.1:{server.port}"
    server.stop()


def post(url: str, body: Any, authorization: str | None = f"Bearer {TOKEN}",
         ) -> tuple[int, Any]:
    code, answer, _ = post_with_headers(url, body, authorization)
    return code, answer


def post_with_headers(url: str, body: Any, authorization: str | None = f"Bearer {TOKEN}",
                      ) -> tuple[int, Any, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    request = urllib.request.Request(url + "/alerts", data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read()), response.headers
    except urllib.error.HTTPError as exc:
        with exc:  # it holds the response and its socket
            return exc.code, json.loads(exc.read()), exc.headers


def webhook(*alerts: dict[str, Any]) -> dict[str, Any]:
    return {"version": "4", "status": "firing", "receiver": "bot", "groupKey": "{}:{}",
            "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://alertmanager", "alerts": list(alerts)}


def alert(name: str, node: str, status: str = "firing", fingerprint: str = "f1",
          starts: str = "2026-11-30T10:00:00Z") -> dict[str, Any]:
    return {"status": status, "labels": {"alertname": name, "node": node, "gpu": "3"},
            "annotations": {}, "startsAt": starts,
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


def test_running_a_proposal_whose_alert_resolved_tells_the_approvers(served: Any) -> None:
    bot, url = served
    post(url, webhook(alert("GpuXidFallenOffBus", "gpu01", fingerprint="r")))
    post(url, webhook(alert("GpuXidFallenOffBus", "gpu01", status="resolved", fingerprint="r")))
    [proposal] = proposing.listing(bot)
    assert proposal.alert_status == "resolved"
    ex = bot.get(proposing.run(bot, proposal.id, "alice"))
    assert ex.plan.warnings == [
        f"the alert that proposed this (GpuXidFallenOffBus) resolved at {proposal.resolved_at}: "
        "check that the run is still needed"]
    card = json.dumps(plan_message(ex, ["carol"]).blocks)
    assert "resolved at" in card and "still needed" in card


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


def events(bot: Any, kind: str) -> list[dict[str, Any]]:
    with bot.db.connect() as conn:
        return [e["data"] for e in audit.events(conn) if e["kind"] == kind]


# --- who may post -----------------------------------------------------------------------------

def test_alerts_needs_the_bearer_token(served: Any) -> None:
    bot, url = served
    body = webhook(alert("GpuXidFallenOffBus", "gpu02"))
    wrong = "Bearer wrong-token-0123456789abcdef"
    for authorization in (None, wrong, f"Basic {TOKEN}", "Bearer", f"Bearer {TOKEN}x",
                          f"Bearer {TOKEN[:-1]}"):
        code, answer, headers = post_with_headers(url, body, authorization)
        assert code == 401, authorization
        assert headers["WWW-Authenticate"] == 'Bearer realm="gpu-runbook-bot"' + (
            ', error="invalid_token"' if authorization else "")
        assert list(answer) == ["error"]
        assert "wrong-token" not in answer["error"] and TOKEN[:8] not in answer["error"]
    assert proposing.listing(bot, open_only=False) == []  # nothing proposed, nothing audited
    assert events(bot, "proposed") == []
    code, answer = post(url, body, f"bearer {TOKEN}")  # the scheme in any case (RFC 7235)
    assert code == 200 and answer["proposals"][0]["state"] == "open"


def raw_post(url: str, length: str | None, body: bytes = b"") -> tuple[int, Any]:
    """POST /alerts with exactly this Content-Length header (None: none), and ``body``."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.putrequest("POST", "/alerts", skip_accept_encoding=True)
        conn.putheader("Authorization", f"Bearer {TOKEN}")
        if length is not None:
            conn.putheader("Content-Length", length)
        conn.endheaders(body or None)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


@pytest.mark.parametrize("length", ["abc", "-1", "1_0", "+2", " ", "0x2", "\u00b2", None, "0"])
def test_a_content_length_that_is_not_a_size_is_400(served: Any, length: str | None) -> None:
    _, url = served
    code, answer = raw_post(url, length, b"{}")
    assert code == 400, answer
    assert "Content-Length" in answer["error"] or "empty" in answer["error"]
    code, _ = post(url, webhook(alert("GpuXidFallenOffBus", "gpu02")))  # the server still serves
    assert code == 200


def test_a_body_over_1_mib_is_413_and_not_read(served: Any) -> None:
    _, url = served
    assert access.MAX_BODY == 1024 * 1024
    code, answer = raw_post(url, str(access.MAX_BODY + 1))  # refused before a byte is read
    assert code == 413
    assert answer["error"] == f"the body must be 1 to {access.MAX_BODY} bytes; it was " \
                              f"{access.MAX_BODY + 1}"
    padded = json.dumps(webhook(alert("GpuXidFallenOffBus", "gpu02"))).encode()
    padded += b" " * (access.MAX_BODY - len(padded))
    code, answer = raw_post(url, str(len(padded)), padded)  # exactly 1 MiB is taken
    assert code == 200 and answer["proposals"][0]["params"] == {"node": "gpu02"}


# --- one proposal per firing --------------------------------------------------------------------

def test_an_open_proposal_says_when_its_alert_fires_again(served: Any) -> None:
    bot, url = served
    first = alert("GpuXidFallenOffBus", "gpu02", fingerprint="o")
    _, body = post(url, webhook(first))
    proposal_id = body["proposals"][0]["id"]
    post(url, webhook({**first, "status": "resolved"}))
    code, body = post(url, webhook({**first, "startsAt": "2026-11-30T10:01:00Z"}))
    assert code == 200
    assert [(p["id"], p["alert_status"]) for p in body["proposals"]] == [(proposal_id, "firing")]
    assert proposing.get(bot, proposal_id).alert_started_at == "2026-11-30T10:01:00Z"
    assert [e["proposal"] for e in events(bot, "alert_refired")] == [proposal_id]


def test_a_dismissed_alert_sent_again_or_flapping_is_not_proposed_again(served: Any) -> None:
    bot, url = served
    first = alert("GpuXidFallenOffBus", "gpu02", fingerprint="x")
    post(url, webhook(first))
    [proposal] = proposing.listing(bot)
    proposing.dismiss(bot, proposal.id, "alice", "known flaky GPU")
    code, body = post(url, webhook(first))  # Alertmanager sends the same firing again
    assert (code, body["proposals"]) == (200, [])
    firing = first
    for minute in range(1, 4):  # it flaps: resolved, then firing again a minute later
        post(url, webhook({**firing, "status": "resolved"}))
        post(url, webhook({**firing, "status": "resolved"}))  # a resolution sent twice
        post(url, webhook({**first, "status": "resolved"}))  # one of an older firing
        firing = {**first, "startsAt": f"2026-11-30T10:0{minute}:00Z"}
        code, body = post(url, webhook(firing))
        assert [(p["id"], p["state"]) for p in body["proposals"]] == [(proposal.id, "dismissed")]
    found = proposing.listing(bot, open_only=False)
    assert [(p.id, p.state, p.alert_status) for p in found] == [
        (proposal.id, "dismissed", "firing")]
    assert len(events(bot, "proposed")) == 1
    assert len(events(bot, "alert_resolved")) == 3 and len(events(bot, "alert_refired")) == 3


def test_a_flapping_auto_run_alert_runs_once(served: Any) -> None:
    from sqlalchemy import func, select

    bot, url = served
    first = alert("GpuTemperatureHigh", "gpu01", fingerprint="t")
    post(url, webhook(first))
    [proposal] = proposing.listing(bot, open_only=False)
    assert proposal.state == "started" and proposal.execution_id is not None
    with bot.db.begin() as conn:  # the run ended; the alert still fires
        conn.execute(executions.update().where(executions.c.id == proposal.execution_id)
                     .values(state="succeeded"))
    assert post(url, webhook(first)) == (200, {"proposals": []})  # sent again: nothing new
    post(url, webhook({**first, "status": "resolved"}))
    code, body = post(url, webhook({**first, "startsAt": "2026-11-30T10:02:00Z"}))
    assert code == 200 and [(p["id"], p["alert_status"]) for p in body["proposals"]] == [
        (proposal.id, "firing")]
    assert [p.id for p in proposing.listing(bot, open_only=False)] == [proposal.id]
    with bot.db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(executions)).scalar_one() == 1


def test_a_new_firing_after_alert_refire_seconds_is_a_new_proposal(served: Any) -> None:
    bot, url = served
    assert bot.config.server.alert_refire_seconds == 300
    first = alert("GpuXidFallenOffBus", "gpu02", fingerprint="n")
    post(url, webhook(first))
    [old] = proposing.listing(bot)
    proposing.dismiss(bot, old.id, "alice", None)
    # an hour later it fires anew (its resolution never reached the bot): a new proposal
    later = {**first, "startsAt": "2026-11-30T11:00:00Z"}
    _, body = post(url, webhook(later))
    assert [p["state"] for p in body["proposals"]] == ["open"]
    newer = body["proposals"][0]["id"]
    assert newer != old.id
    assert post(url, webhook(later)) == (200, {"proposals": []})
    # with alert_refire_seconds 0, a firing right after a resolution is a new proposal too
    bot.config = bot.config.model_copy(update={"server": ServerConfig(alert_refire_seconds=0)})
    proposing.dismiss(bot, newer, "alice", None)
    post(url, webhook({**later, "status": "resolved"}))
    _, body = post(url, webhook({**later, "startsAt": "2026-11-30T11:01:00Z"}))
    assert [p["state"] for p in body["proposals"]] == ["open"]
    assert body["proposals"][0]["id"] not in (old.id, newer)


def test_a_refused_alert_sent_again_is_recorded_once_per_reason(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    bot, url = served
    unknown = alert("GpuXidFallenOffBus", "gpu99", fingerprint="u")
    answers = [post(url, webhook(unknown))[1]["proposals"] for _ in range(3)]
    assert [[p["state"] for p in a] for a in answers] == [["refused"], [], []]
    assert len(refusals(bot)) == 1 and len(proposing.listing(bot, open_only=False)) == 1

    def closed(name: str, params: dict[str, str], **kwargs: Any) -> Any:
        raise Refused("the lab is closed")

    monkeypatch.setattr(bot, "plan", closed)  # another reason: recorded, once
    for _ in range(2):
        post(url, webhook(unknown))
    assert [r["reason"] for r in refusals(bot)][1:] == ["the lab is closed"]
    assert len(proposing.listing(bot, open_only=False)) == 2
