"""The Slack surface end to end over HTTP: signed requests to /slack/events of a real
``serve``, the lab's fake of Slack's Web API recording every call, the lab's Slurm."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from bot.alerts import proposing
from bot.config import EngineConfig, load_config
from bot.service import Service
from bot.store import audit
from bot.store.schema import executions as executions_table
from tests.bot.surfaces.slack.slackhelp import (
    FakeSlack,
    SlackClientSide,
    answers,
    serving,
    slack_secrets,
)
from tests.lab.fixture import Lab

pytestmark = pytest.mark.lab

ALICE, BOB, CAROL, DAVE = "U0ALICE", "U0BOB", "U0CAROL", "U0DAVE"

CHECK_RUNBOOK = """\
name: slack-check
version: 1.0.0
summary: Waits for a person between two notes; two approvals (tests of the Slack surface).
risk: medium
params:
  note: {type: text, required: true}
approval: {required: 2, approvers: ["group:gpu-leads"], expires: 30m}
steps:
  - id: tell
    action: chat.notify
    with: {message: "starting: {{ note }}"}
  - id: ask
    action: chat.confirm
    with: {question: "Is the GPU replaced?", poll: 0.2}
    timeout: 5m
  - id: end
    action: chat.notify
    with: {message: "all done"}
"""

QUICK_RUNBOOK = """\
name: slack-quick
version: 1.0.0
summary: One note; one approval that expires quickly (tests of the Slack surface).
risk: medium
params:
  note: {type: text, required: true}
approval: {required: 1, approvers: ["group:gpu-leads"], expires: 2s}
steps:
  - id: tell
    action: chat.notify
    with: {message: "{{ note }}"}
"""


@pytest.fixture(scope="module")
def runbook_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("runbooks")
    (folder / "slack-check.yaml").write_text(CHECK_RUNBOOK)
    (folder / "slack-quick.yaml").write_text(QUICK_RUNBOOK)
    return folder


@pytest.fixture(scope="module")
def bot(lab: Lab, runbook_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Service:
    config = load_config(lab.dir / "bot.yaml")
    config = config.model_copy(update={
        "database_url": f"sqlite:///{tmp_path_factory.mktemp('db') / 'bot.db'}",
        "engine": EngineConfig(lease_seconds=10, poll_seconds=0.1),
        "runbook_paths": [*config.runbook_paths, runbook_dir],
    })
    return Service.from_config(config)


@pytest.fixture(scope="module")
def fake(lab: Lab) -> FakeSlack:
    return FakeSlack(lab["slack"]["url"])


@pytest.fixture(scope="module")
def slack(lab: Lab, bot: Service, fake: FakeSlack) -> Iterator[SlackClientSide]:
    fake.reset()
    with serving(bot, slack_secrets(lab)) as (_, base):
        yield SlackClientSide(base + "/slack/events", lab.env["SLACK_SIGNING_SECRET"], fake)


# --- helpers -------------------------------------------------------------------------------

def latest_execution(bot: Service, runbook: str) -> int:
    with bot.db.connect() as conn:
        found = conn.execute(select(executions_table.c.id)
                             .where(executions_table.c.runbook == runbook)
                             .order_by(executions_table.c.id.desc()).limit(1)).scalar()
    return int(found or 0)


def count_executions(bot: Service) -> int:
    with bot.db.connect() as conn:
        return len(conn.execute(select(executions_table.c.id)).all())


def mentions(call: dict[str, Any], execution_id: int) -> bool:
    return re.search(rf"execution {execution_id}\b", str(call["args"].get("text", ""))) is not None


def root(fake: FakeSlack, execution_id: int) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        for call in fake.calls("chat.postMessage"):
            if (call.get("status", 200) == 200 and not call["args"].get("thread_ts")
                    and mentions(call, execution_id)):
                return call
        return None
    return dict(fake.wait(find, message=f"the root message of execution {execution_id}"))


def root_ts(fake: FakeSlack, execution_id: int) -> str:
    return str(root(fake, execution_id)["response"]["ts"])


def root_text(fake: FakeSlack, execution_id: int, contains: str) -> str:
    ts = root_ts(fake, execution_id)

    def find() -> str | None:
        updates = [c for c in fake.calls("chat.update") if c["args"].get("ts") == ts]
        text = str(updates[-1]["args"]["text"]) if updates else ""
        return text if contains in text else None
    return str(fake.wait(find, message=f"the root of {execution_id} to say {contains!r}"))


def thread(fake: FakeSlack, execution_id: int) -> list[str]:
    ts = root_ts(fake, execution_id)
    return [str(c["args"].get("text", "")) for c in fake.calls("chat.postMessage")
            if c["args"].get("thread_ts") == ts]


def ephemerals(fake: FakeSlack, user: str) -> list[str]:
    return [str(c["args"]["text"]) for c in fake.calls("chat.postEphemeral")
            if c["args"].get("user") == user]


def wait_state(bot: Service, execution_id: int, state: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if bot.get(execution_id).state == state:
            return
        time.sleep(0.05)
    raise AssertionError(f"execution {execution_id} is {bot.get(execution_id).state}, "
                         f"not {state}")


def value_of(fake: FakeSlack, execution_id: int) -> str:
    blocks = root(fake, execution_id)["args"]["blocks"]
    buttons = [e for b in blocks if b["type"] == "actions" for e in b["elements"]]
    approve = next(b for b in buttons if b["action_id"] == "approve")
    return str(approve["value"])


# --- signatures -------------------------------------------------------------------------------

def test_forged_and_stale_signatures_are_rejected(bot: Service, slack: SlackClientSide) -> None:
    before = count_executions(bot)
    status, _, _ = slack.command("run slack-quick note=forged", ALICE, secret="not-the-secret")
    assert status == 401
    status, _, _ = slack.command("run slack-quick note=stale", ALICE,
                                 timestamp=int(time.time()) - 600)
    assert status == 401
    assert count_executions(bot) == before


# --- approvals through buttons ------------------------------------------------------------------

def test_two_person_approval_progress_and_summary(bot: Service, slack: SlackClientSide,
                                                  fake: FakeSlack) -> None:
    status, _, elapsed = slack.command('run slack-check note="GPU 3 on gpu02"', ALICE)
    assert status == 200 and elapsed < 3
    execution_id = fake.wait(lambda: latest_execution(bot, "slack-check"))
    reply = fake.wait(lambda: [p["body"] for r in fake.responses() for p in r["posts"]
                               if f"execution {execution_id}:" in str(p["body"])
                               and not p.get("refused")],
                      message="the answer to the command at its response_url")[0]
    assert "waiting for approval" in str(reply) and "ephemeral" in str(reply)
    value = value_of(fake, execution_id)
    plan = root(fake, execution_id)["args"]
    assert "awaiting approval" in plan["text"]
    shown = str(plan["blocks"])
    assert "Operations" in shown and "Locks" in shown and "expires at" in shown

    slack.click("approve", value, ALICE)  # the requester
    fake.wait(lambda: any("may not approve" in t for t in ephemerals(fake, ALICE)),
              message="self-approval refused")
    slack.click("approve", value, BOB)  # on call, not a gpu lead
    fake.wait(lambda: any("may not approve" in t for t in ephemerals(fake, BOB)),
              message="an unauthorised approver refused")
    assert bot.approvals(execution_id) == []

    slack.click("approve", value, CAROL)
    fake.wait(lambda: bot.approvals(execution_id) == ["carol"], message="carol's approval")
    slack.click("approve", value, DAVE)
    wait_state(bot, execution_id, "running")

    # A long step runs (it waits for a person): commands are still acknowledged at once.
    for _ in range(5):
        status, _, elapsed = slack.command(f"status {execution_id}", BOB)
        assert status == 200 and elapsed < 3
    # The question itself, not a progress line of the thread that quotes it.
    asks = f"execution {execution_id} asks: Is the GPU replaced?"
    confirm = fake.wait(lambda: [c for c in fake.calls("chat.postMessage")
                                 if c["args"].get("text") == asks],
                        message="the question posted in the thread")[0]
    assert confirm["args"]["thread_ts"] == root_ts(fake, execution_id)
    yes = next(e["value"] for b in confirm["args"]["blocks"] if b["type"] == "actions"
               for e in b["elements"] if e["action_id"] == "confirm_yes")
    assert yes == f"{execution_id}:ask:{bot.get(execution_id).plan_hash}"  # step and plan
    slack.click("confirm_yes", yes, ALICE)
    wait_state(bot, execution_id, "succeeded")

    final = root_text(fake, execution_id, "succeeded")
    assert f"execution {execution_id}" in final
    summary = fake.wait(lambda: [t for t in thread(fake, execution_id) if "ended" in t],
                        message="the final summary")[0]
    assert "succeeded" in summary and f"runbook show {execution_id}" in summary
    lines = "\n".join(thread(fake, execution_id))
    assert "starting: GPU 3 on gpu02" in lines and "step end: done" in lines
    assert audit.verify(bot.db).ok


def test_drain_node_from_slash_command_to_summary(lab: Lab, bot: Service, slack: SlackClientSide,
                                                 fake: FakeSlack) -> None:
    """The issue's end to end: /runbook run drain-node, approval by button, the final summary,
    every Slack call recorded by the fake, the audit log verifying, Slurm really drained."""
    try:
        status, _, _ = slack.command('run drain-node node=gpu04 reason="XID 79 on GPU 3"', ALICE)
        assert status == 200
        execution_id = fake.wait(lambda: latest_execution(bot, "drain-node"))
        assert bot.get(execution_id).requested_by == "alice"
        shown = str(root(fake, execution_id)["args"]["blocks"])
        assert "scontrol" in shown or "drain" in shown
        assert "capacity stays above the floor" in shown and "node:gpu04" in shown
        slack.click("approve", value_of(fake, execution_id), CAROL)
        wait_state(bot, execution_id, "succeeded", seconds=120)
        summary = fake.wait(lambda: [t for t in thread(fake, execution_id) if "ended" in t],
                            message="the final summary")[0]
        assert "succeeded" in summary and "the node is drained in Slurm" in summary
        root_text(fake, execution_id, "succeeded")
        drained = lab.run("scontrol", "show", "node", "gpu04", "-o").stdout
        assert "DRAIN" in drained and "XID 79 on GPU 3" in drained
        assert audit.verify(bot.db).ok
        methods = {c["method"] for c in fake.calls()}
        assert {"auth.test", "chat.postMessage", "chat.update", "chat.postEphemeral"} <= methods
    finally:
        lab.run("scontrol", "update", "NodeName=gpu04", "State=RESUME")


def test_deny_from_a_button(bot: Service, slack: SlackClientSide, fake: FakeSlack) -> None:
    slack.command("run slack-check note=deny-me", ALICE)
    execution_id = fake.wait(lambda: (n := latest_execution(bot, "slack-check"))
                             and bot.get(n).params.get("note") == "deny-me" and n)
    slack.click("deny", value_of(fake, execution_id), DAVE)
    wait_state(bot, execution_id, "denied")
    assert "denied" in root_text(fake, execution_id, "denied")
    with bot.db.connect() as conn:
        kinds = [e["kind"] for e in audit.events(conn, execution_id=execution_id)]
    assert "step_started" not in kinds


def test_expired_approval_is_refused(bot: Service, slack: SlackClientSide, fake: FakeSlack) -> None:
    slack.command("run slack-quick note=too-late", ALICE)
    execution_id = fake.wait(lambda: (n := latest_execution(bot, "slack-quick"))
                             and bot.get(n).params.get("note") == "too-late" and n)
    value = value_of(fake, execution_id)
    time.sleep(2.5)
    slack.click("approve", value, CAROL)
    fake.wait(lambda: any("expired" in t for t in ephemerals(fake, CAROL)),
              message="the approval refused as expired")
    assert bot.get(execution_id).state == "expired"
    root_text(fake, execution_id, "expired")


def test_cancel_a_running_execution(bot: Service, slack: SlackClientSide, fake: FakeSlack) -> None:
    slack.command("run slack-check note=cancel-me", ALICE)
    execution_id = fake.wait(lambda: (n := latest_execution(bot, "slack-check"))
                             and bot.get(n).params.get("note") == "cancel-me" and n)
    value = value_of(fake, execution_id)
    slack.click("approve", value, CAROL)
    slack.click("approve", value, DAVE)
    wait_state(bot, execution_id, "running")
    slack.click("cancel", str(execution_id), ALICE)
    wait_state(bot, execution_id, "cancelled")
    root_text(fake, execution_id, "cancelled")


# --- delivery -----------------------------------------------------------------------------------

def test_a_redelivered_command_runs_once(bot: Service, slack: SlackClientSide,
                                         fake: FakeSlack) -> None:
    before = count_executions(bot)
    body = slack.command_body("run slack-quick note=once", ALICE, trigger_id="trigger-once-1")
    first = slack.post(body)
    again = slack.post(body, headers={"X-Slack-Retry-Num": "1",
                                      "X-Slack-Retry-Reason": "http_timeout"})
    assert first[0] == 200 and again[0] == 200
    fake.wait(lambda: count_executions(bot) > before, message="the request recorded")
    time.sleep(0.5)
    assert count_executions(bot) == before + 1


def test_a_429_from_slack_is_retried(bot: Service, slack: SlackClientSide, fake: FakeSlack) -> None:
    fake.ratelimit(1, retry_after=1, method="chat.postMessage")
    slack.command("run slack-quick note=rate-limited", ALICE)
    execution_id = fake.wait(lambda: (n := latest_execution(bot, "slack-quick"))
                             and bot.get(n).params.get("note") == "rate-limited" and n)
    root(fake, execution_id)  # posted in the end
    statuses = [c.get("status") for c in fake.calls("chat.postMessage")]
    assert 429 in statuses


def test_secrets_never_reach_the_audit_log(lab: Lab, bot: Service, slack: SlackClientSide) -> None:
    with bot.db.connect() as conn:
        exported = str(list(audit.events(conn)))
    for secret in slack_secrets(lab).values():
        assert secret not in exported


# --- proposals ----------------------------------------------------------------------------------

def test_an_alert_proposal_comes_with_run_and_dismiss(bot: Service, slack: SlackClientSide,
                                                      fake: FakeSlack) -> None:

    def alert(node: str, fingerprint: str) -> dict[str, Any]:
        return {"status": "firing", "fingerprint": fingerprint,
                "labels": {"alertname": "GpuTemperatureHigh", "node": node, "gpu": "2"},
                "annotations": {}, "startsAt": "2026-11-30T10:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z", "generatorURL": ""}

    payload = {"version": "4", "status": "firing", "receiver": "bot", "groupKey": "{}:{}",
               "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
               "externalURL": "http://alertmanager",
               "alerts": [alert("gpu03", "slack-a"), alert("gpu04", "slack-b")]}
    touched = proposing.receive(bot, proposing.parse(json.dumps(payload).encode()))
    first, second = sorted(touched, key=lambda p: p.id)

    def posted(proposal_id: int) -> dict[str, Any]:
        return dict(fake.wait(lambda: next(
            (c for c in fake.calls("chat.postMessage")
             if f"(proposal {proposal_id}," in str(c["args"].get("blocks"))), None),
            message=f"proposal {proposal_id} posted"))

    message = posted(first.id)
    buttons = [e["action_id"] for b in message["args"]["blocks"] if b["type"] == "actions"
               for e in b["elements"]]
    assert buttons == ["run_proposal", "dismiss_proposal"]
    slack.click("dismiss_proposal", str(first.id), CAROL)
    fake.wait(lambda: proposing.get(bot, first.id).state == "dismissed", message="dismissed")
    ts = message["response"]["ts"]
    fake.wait(lambda: any(c["args"].get("ts") == ts and "dismissed" in str(c["args"]["blocks"])
                          for c in fake.calls("chat.update")), message="the buttons replaced")

    posted(second.id)
    slack.click("run_proposal", str(second.id), ALICE)
    fake.wait(lambda: proposing.get(bot, second.id).execution_id is not None, message="run")
    assert proposing.get(bot, second.id).state == "started"
    execution_id = proposing.get(bot, second.id).execution_id
    assert execution_id is not None and bot.get(execution_id).requested_by == "alice"
    root(fake, execution_id)  # the requested run is posted for approval
    bot.cancel(execution_id, "alice")


# --- Socket Mode ------------------------------------------------------------------------------

def test_socket_mode_runs_a_command_once(lab: Lab, bot: Service, fake: FakeSlack,
                                         slack: SlackClientSide) -> None:
    before = count_executions(bot)
    with serving(bot, slack_secrets(lab, socket=True)):
        fake.wait(lambda: fake.socket_clients() > 0, message="a Socket Mode connection")
        command = {"command": "/runbook", "text": "run slack-quick note=socket",
                   "user_id": ALICE, "user_name": "alice", "channel_id": "C0RUNBOOK",
                   "team_id": "T0LAB", "api_app_id": "A0LAB", "trigger_id": "trigger-socket-1",
                   }
        command["response_url"] = fake.response_url("slash_commands", command)
        envelope = fake.socket_send("slash_commands", command)
        fake.wait(lambda: any(a["envelope_id"] == envelope for a in fake.socket_acks()),
                  message="the envelope acknowledged")
        fake.wait(lambda: count_executions(bot) == before + 1, message="the run requested")
        fake.socket_send("slash_commands", command, envelope_id=envelope)  # redelivered
        fake.wait(lambda: sum(a["envelope_id"] == envelope for a in fake.socket_acks()) == 2,
                  message="the redelivery acknowledged")
        time.sleep(0.5)
    assert count_executions(bot) == before + 1
    execution_id = latest_execution(bot, "slack-quick")
    assert bot.get(execution_id).requested_by == "alice"


def test_runbook_serve_in_http_mode_keeps_secrets_out_of_its_output(
        lab: Lab, fake: FakeSlack, tmp_path: Path) -> None:
    """The real command: `runbook serve` with the lab's Slack secrets in its environment."""
    import subprocess
    import sys

    from tests.bot.surfaces.slack.slackhelp import free_port

    port = free_port()
    env = dict(lab.env, RUNBOOK_DB_URL=f"sqlite:///{tmp_path / 'bot.db'}")
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        serve = subprocess.Popen([sys.executable, "-m", "bot", "serve", "--port", str(port)],
                                 env=env, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
    try:
        fake.wait(lambda: answers(f"http://127.0.0.1:{port}/healthz"), message="serve up")
        side = SlackClientSide(f"http://127.0.0.1:{port}/slack/events",
                               lab.env["SLACK_SIGNING_SECRET"], fake)
        status, _, _ = side.command("list", ALICE)
        assert status == 200
        status, _, _ = side.command("list", ALICE, secret="forged")
        assert status == 401
        fake.wait(lambda: any("drain-node" in str(p["body"]) for r in fake.responses()
                              for p in r["posts"]), message="the answer to list")
    finally:
        serve.terminate()
        serve.wait(30)
    output = log.read_text()
    assert "Slack in http mode" in output and "/slack/events" in output
    for secret in slack_secrets(lab, socket=True).values():
        assert secret not in output
