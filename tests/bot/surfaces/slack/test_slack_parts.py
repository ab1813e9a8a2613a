"""The Slack surface's parts that need no Slack: secrets, deliveries, Block Kit, buttons."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import pytest

from bot.config import Config, SlackConfig, load_config
from bot.service import Service
from bot.store import audit
from bot.surfaces.slack import blocks, deliveries
from bot.surfaces.slack.app import Listeners
from bot.surfaces.slack.identity import Identities
from bot.surfaces.slack.secrets import SlackSetupError, load
from tests.conftest import BotFactory

P = ParamSpec("P")
T = TypeVar("T")

RUNBOOK = {
    "name": "drain", "version": "1.0.0", "summary": "drain a node", "risk": "medium",
    "params": {"node": {"type": "node", "required": True}},
    "locks": ["node:{{ node }}"],
    "approval": {"required": 1, "approvers": ["group:gpu-leads"], "expires": "30m"},
    "steps": [{"id": "note", "action": "chat.notify", "with": {"message": "drain {{ node }}"}}],
}


def test_secrets_from_the_environment_choose_the_mode() -> None:
    config = SlackConfig(channel="C1")
    assert load(config, {}) is None
    http = load(config, {"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s3"})
    assert http is not None and http.mode == "http"
    socket = load(config, {"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1"})
    assert socket is not None and socket.mode == "socket"
    assert "xoxb-1" not in repr(http) and "s3" not in repr(http)


def test_half_set_up_slack_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SlackSetupError, match="no slack: section"):
        load(None, {"SLACK_BOT_TOKEN": "xoxb-1"})
    with pytest.raises(SlackSetupError, match="signing secret"):
        load(SlackConfig(channel="C1"), {"SLACK_BOT_TOKEN": "xoxb-1"})
    with pytest.raises(SlackSetupError, match="app-level token"):
        load(SlackConfig(channel="C1", mode="socket"), {"SLACK_BOT_TOKEN": "xoxb-1"})
    with pytest.raises(SlackSetupError, match="cannot read"):
        load(SlackConfig(channel="C1", bot_token_file=tmp_path / "missing"), {})


def test_secrets_from_files(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("xoxb-from-file\n")
    (tmp_path / "secret").write_text("signing\n")
    found = load(SlackConfig(channel="C1", bot_token_file=tmp_path / "token",
                             signing_secret_file=tmp_path / "secret"), {})
    assert found is not None and found.bot_token == "xoxb-from-file"
    assert found.signing_secret == "signing"


def test_the_configuration_file_refuses_secrets(tmp_path: Path) -> None:
    file = tmp_path / "bot.yaml"
    file.write_text("slack: {channel: C1, bot_token: xoxb-leaked}\n")
    with pytest.raises(Exception, match="secrets do not belong") as caught:
        load_config(file)
    assert "xoxb-leaked" not in str(caught.value)


def test_a_delivery_is_acted_on_once(make_bot: BotFactory) -> None:
    bot = make_bot({"drain": RUNBOOK})
    key = deliveries.key_of({"trigger_id": "123.456"})
    assert key == "trigger_id:123.456"
    assert deliveries.first_time(bot.db, key)
    assert not deliveries.first_time(bot.db, key)
    assert deliveries.key_of({"type": "url_verification"}) is None


def test_the_plan_message_shows_what_people_decide_on(make_bot: BotFactory) -> None:
    bot = make_bot({"drain": RUNBOOK})
    ex = bot.get(bot.request("drain", {"node": "gpu01"}, "alice"))
    message = blocks.plan_message(ex, [])
    shown = str(message.blocks)
    assert "drain 1.0.0" in shown and "node:gpu01" in shown and "drain gpu01" in shown
    assert "expires at" in shown and "risk *medium*" in shown
    buttons = [e for b in message.blocks if b["type"] == "actions" for e in b["elements"]]
    assert [b["action_id"] for b in buttons] == ["approve", "deny"]
    assert buttons[0]["value"] == f"{ex.id}:{ex.plan_hash}"
    assert f"execution {ex.id}" in message.text


class FakeClient:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def chat_postEphemeral(self, **kwargs: Any) -> None:
        self.calls.append(("chat.postEphemeral", kwargs))

    def usergroups_users_list(self, usergroup: str) -> dict[str, Any]:
        return {"users": {"S0LEADS": ["U0ERIN"]}.get(usergroup, [])}


class Inline(Executor):
    """Does the work at once, in the caller's thread (its exceptions reach the caller)."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        done: Future[T] = Future()
        done.set_result(fn(*args, **kwargs))
        return done


def listeners_for(config: Config, bot: Service, clock: Callable[[], float] = lambda: 5.0,
                  ) -> tuple[Listeners, FakeClient]:
    """Listeners on a fake Slack; the clock reads 5 s, as on a host that has just booted."""
    client = FakeClient()
    return Listeners(bot, client, Identities(config, client, clock=clock), Inline(),
                     lambda: None), client


def click(listeners: Listeners, user: str, action_id: str, value: str) -> str:
    """Click a button as ``user``; the answer only they see."""
    listeners.button(lambda: None, {"user": {"id": user}, "channel": {"id": "C1"}},
                     {"action_id": action_id, "value": value})
    client = listeners.client
    assert client.calls[-1][0] == "chat.postEphemeral" and client.calls[-1][1]["user"] == user
    return str(client.calls[-1][1]["text"])


def slash(listeners: Listeners, user: str, text: str) -> str:
    """``/runbook text`` as ``user``; the answer (always ephemeral)."""
    answers: list[dict[str, Any]] = []
    listeners.command(lambda: None, {"user_id": user, "text": text},
                      lambda **kwargs: answers.append(kwargs))
    assert answers[-1]["response_type"] == "ephemeral"
    return str(answers[-1]["text"])


def test_buttons_are_commands_of_the_grammar(make_bot: BotFactory) -> None:
    bot = make_bot({"drain": RUNBOOK}, slack={"channel": "C1",
                                              "users": {"U0ALICE": "alice", "U0CAROL": "carol"}})
    listeners, client = listeners_for(bot.config, bot)
    ex = bot.get(bot.request("drain", {"node": "gpu01"}, "alice"))
    click(listeners, "U0ALICE", "approve", f"{ex.id}:{ex.plan_hash}")
    assert "may not approve" in client.calls[-1][1]["text"]
    click(listeners, "U0CAROL", "approve", f"{ex.id}:{'0' * 64}")
    assert "plan changed" in client.calls[-1][1]["text"]
    assert bot.get(ex.id).state == "awaiting_approval"
    click(listeners, "U0CAROL", "approve", f"{ex.id}:{ex.plan_hash}")
    assert bot.get(ex.id).state == "approved"
    assert bot.approvals(ex.id) == ["carol"]


def test_slack_user_groups_grant_approval_from_the_first_request_after_boot(
        make_bot: BotFactory) -> None:
    """A mapped member of a mapped user group approves at once, whatever the host's uptime
    (the clock reads 5 s: the groups were once ignored for 5 minutes after every boot)."""
    bot = make_bot({"drain": RUNBOOK}, slack={
        "channel": "C1", "users": {"U0ALICE": "alice", "U0ERIN": "erin"},
        "user_groups": {"S0LEADS": "gpu-leads"}})
    listeners, _ = listeners_for(bot.config, bot)
    ex = bot.get(bot.request("drain", {"node": "gpu01"}, "alice"))
    assert "may not" in click(listeners, "U0ALICE", "deny", f"{ex.id}:{ex.plan_hash}")
    click(listeners, "U0ERIN", "approve", f"{ex.id}:{ex.plan_hash}")
    assert bot.approvals(ex.id) == ["erin"]


def test_user_groups_are_read_again_after_their_interval() -> None:
    now = [0.0]
    members = {"S0LEADS": ["U0ERIN"]}

    class Groups:
        asked = 0

        def usergroups_users_list(self, usergroup: str) -> dict[str, Any]:
            Groups.asked += 1
            return {"users": members[usergroup]}

    config = Config.model_validate({"users": {"erin": {}}, "slack": {
        "channel": "C1", "users": {"U0ERIN": "erin", "U0FRED": "fred"},
        "user_groups": {"S0LEADS": "gpu-leads"}, "groups_refresh_seconds": 60}})
    identities = Identities(config, Groups(), clock=lambda: now[0])
    assert identities.who("U0ERIN").name == "erin"  # read at once, at 0.0 on this clock
    assert config.groups_of("erin") == {"gpu-leads"} and Groups.asked == 1
    members["S0LEADS"] = ["U0FRED"]
    now[0] = 59.0
    identities.who("U0ERIN")
    assert config.groups_of("erin") == {"gpu-leads"} and Groups.asked == 1
    now[0] = 60.0
    identities.who("U0ERIN")
    assert config.groups_of("erin") == set() and config.groups_of("fred") == {"gpu-leads"}


def test_a_slack_user_not_in_users_may_only_read(make_bot: BotFactory) -> None:
    """Unmapped: read verbs only, each refusal saying what to configure, seen only by them;
    nothing is recorded for them. A member of a mapped user group gets nothing from it."""
    bot = make_bot({"drain": RUNBOOK}, requesters=["*"], slack={
        "channel": "C1", "users": {"U0ALICE": "alice"}, "user_groups": {"S0LEADS": "gpu-leads"}})
    listeners, _ = listeners_for(bot.config, bot)
    ex = bot.get(bot.request("drain", {"node": "gpu01"}, "alice"))
    assert "drain 1.0.0 (medium)" in slash(listeners, "U0ERIN", "list")
    assert "awaiting" in slash(listeners, "U0ERIN", f"status {ex.id}").lower()
    assert "drain" in slash(listeners, "U0ERIN", "describe drain")
    refused = slash(listeners, "U0ERIN", "run drain node=gpu02")
    assert "U0ERIN is not in slack.users, so you may only read" in refused
    assert "slack.unmapped: requester" in refused
    for action in ("approve", "deny"):
        refused = click(listeners, "U0ERIN", action, f"{ex.id}:{ex.plan_hash}")
        assert "may approve, deny or confirm" in refused and "U0ERIN: NAME" in refused
    assert "may approve, deny or confirm" in slash(listeners, "U0ERIN", f"approve {ex.id}")
    assert "may only read" in click(listeners, "U0ERIN", "cancel", str(ex.id))
    assert bot.approvals(ex.id) == [] and bot.get(ex.id).state == "awaiting_approval"
    with bot.db.connect() as conn:
        assert [e["actor"] for e in audit.events(conn) if e["actor"].startswith("slack:")] == []


def test_unmapped_requester_may_request_but_never_decide(make_bot: BotFactory) -> None:
    bot = make_bot({"drain": RUNBOOK}, requesters=["*"], slack={
        "channel": "C1", "users": {"U0CAROL": "carol"}, "unmapped": "requester"})
    listeners, _ = listeners_for(bot.config, bot)
    answer = slash(listeners, "U0ERIN", "run drain node=gpu02")
    assert "requested by slack:U0ERIN; waiting for approval" in answer
    ex = bot.get(int(answer.split()[1].rstrip(":")))
    assert "may approve, deny or confirm" in click(listeners, "U0ERIN", "approve",
                                                   f"{ex.id}:{ex.plan_hash}")
    click(listeners, "U0CAROL", "approve", f"{ex.id}:{ex.plan_hash}")
    assert bot.get(ex.id).state == "approved"


def test_one_person_is_one_identity_on_the_command_line_and_in_slack(
        make_bot: BotFactory) -> None:
    """carol on the command line and carol in Slack are one approver, and cannot approve
    what she asked for; a group member not in slack.users is no second carol."""
    two = {**RUNBOOK, "approval": {"required": 2, "approvers": ["group:gpu-leads"]}}
    bot = make_bot({"drain": two}, slack={
        "channel": "C1", "users": {"U0CAROL": "carol"}, "user_groups": {"S0LEADS": "gpu-leads"}})
    listeners, _ = listeners_for(bot.config, bot)
    ex = bot.get(bot.request("drain", {"node": "gpu01"}, "alice"))
    bot.approve(ex.id, "carol")  # on the command line
    assert "already approved" in click(listeners, "U0CAROL", "approve",
                                       f"{ex.id}:{ex.plan_hash}")
    click(listeners, "U0ERIN", "approve", f"{ex.id}:{ex.plan_hash}")  # in S0LEADS, unmapped
    assert bot.approvals(ex.id) == ["carol"] and bot.get(ex.id).state == "awaiting_approval"
    own = bot.get(bot.request("drain", {"node": "gpu02"}, "carol"))
    assert "may not approve it too" in click(listeners, "U0CAROL", "approve",
                                             f"{own.id}:{own.plan_hash}")
    assert bot.approvals(own.id) == []


def test_a_yes_no_button_answers_only_the_question_it_was_posted_for(
        make_bot: BotFactory) -> None:
    """Yes/No carry the step and the plan hash they were posted for: a button left from an
    earlier question (or an earlier plan) is refused, seen only by the clicker, and never
    answers the question pending now."""
    import threading

    from bot.execution import confirming
    from bot.execution.engine import Engine
    from tests.bot.execution.test_engine import runbook

    asks = [{"id": step, "action": "chat.confirm", "with": {"question": text, "poll": 0.02}}
            for step, text in (("reseat", "Cable reseated?"), ("swap", "GPU replaced?"))]
    bot = make_bot({"swap": runbook(asks, name="swap")},
                   slack={"channel": "C1", "users": {"U0ALICE": "alice"}})
    listeners, _ = listeners_for(bot.config, bot)
    ex = bot.get(bot.request("swap", {"node": "gpu01"}, "alice"))
    engine = Engine(bot, sleep=lambda s: None)
    worker = threading.Thread(target=engine.drive, args=(ex.id,), daemon=True)
    worker.start()

    def button(step: str, action_id: str, plan_hash: str = ex.plan_hash) -> str:
        """The value of the button the poster posts for ``step``'s question."""
        deadline = time.monotonic() + 10
        while True:
            with bot.db.connect() as conn:
                asked = confirming.pending(conn, ex.id)
            if asked is not None and asked.step_id == step:
                break
            assert time.monotonic() < deadline, f"no question from step {step}"
            time.sleep(0.02)
        message = blocks.confirm_message(ex.id, step, asked.question, plan_hash)
        found = [e for b in message.blocks if b["type"] == "actions" for e in b["elements"]
                 if e["action_id"] == action_id]
        return str(found[0]["value"])

    try:
        stale_yes = button("reseat", "confirm_yes")
        assert stale_yes == f"{ex.id}:reseat:{ex.plan_hash}"
        bot.confirm(ex.id, "alice", True, None)  # answered on the command line meanwhile
        wrong_plan = button("swap", "confirm_no", plan_hash="0" * 64)
        refused = click(listeners, "U0ALICE", "confirm_yes", stale_yes)
        assert "question of step reseat was answered already (yes, by alice)" in refused
        assert "plan changed" in click(listeners, "U0ALICE", "confirm_no", wrong_plan)
        with bot.db.connect() as conn:
            assert confirming.pending(conn, ex.id).step_id == "swap"  # still unanswered
        answered = click(listeners, "U0ALICE", "confirm_yes", button("swap", "confirm_yes"))
        assert "alice answered yes to 'GPU replaced?'" in answered
        worker.join(10)
    finally:
        engine.close()
    assert bot.get(ex.id).state == "succeeded"


class RecordingClient:
    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        self.updates: list[dict[str, Any]] = []

    def chat_postMessage(self, **kwargs: Any) -> dict[str, Any]:
        self.posts.append(kwargs)
        return {"ts": f"{len(self.posts)}.000"}

    def chat_update(self, **kwargs: Any) -> dict[str, Any]:
        self.updates.append(kwargs)
        return {"ts": kwargs["ts"]}


def test_the_poster_posts_each_request_once_and_not_old_history(make_bot: BotFactory) -> None:
    from sqlalchemy import update

    from bot.store.schema import executions as executions_table
    from bot.surfaces.slack.poster import Poster

    bot = make_bot({"drain": RUNBOOK})
    old = bot.request("drain", {"node": "gpu01"}, "alice")
    bot.deny(old, "carol", "long ago")
    half_an_hour_ago = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z",
                                     time.gmtime(time.time() - 1800))
    with bot.db.begin() as conn:  # an execution that ended before the poster started
        conn.execute(update(executions_table).where(executions_table.c.id == old)
                     .values(requested_at=half_an_hour_ago))
    fresh = bot.request("drain", {"node": "gpu02"}, "alice")
    client = RecordingClient()
    poster = Poster(bot, client, "C1", poll_seconds=0.1)
    poster.tick()
    assert [p["text"] for p in client.posts] == [
        f"drain 1.0.0 execution {fresh} requested by alice: awaiting approval"]
    poster.tick()
    assert len(client.posts) == 1 and client.updates == []  # nothing changed
    bot.approve(fresh, "carol")
    Poster(bot, client, "C1", poll_seconds=0.1).tick()  # a restarted poster
    assert len(client.posts) == 1  # not posted again
    assert f"execution {fresh}: approved" in client.updates[-1]["text"]
