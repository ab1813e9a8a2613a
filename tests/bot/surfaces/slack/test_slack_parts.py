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


def listeners_for(config: Config, bot: Service) -> tuple[Listeners, FakeClient]:
    client = FakeClient()
    return Listeners(bot, client, Identities(config, client), Inline(),
                     lambda: None), client


def click(listeners: Listeners, user: str, action_id: str, value: str) -> None:
    listeners.button(lambda: None, {"user": {"id": user}, "channel": {"id": "C1"}},
                     {"action_id": action_id, "value": value})


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


def test_slack_user_groups_grant_approval(make_bot: BotFactory) -> None:
    bot = make_bot({"drain": RUNBOOK}, slack={
        "channel": "C1", "users": {"U0ALICE": "alice"}, "user_groups": {"S0LEADS": "gpu-leads"}})
    listeners, client = listeners_for(bot.config, bot)
    ex = bot.get(bot.request("drain", {"node": "gpu01"}, "alice"))
    click(listeners, "U0NOBODY", "deny", f"{ex.id}:{ex.plan_hash}")
    assert "may not" in client.calls[-1][1]["text"]
    click(listeners, "U0ERIN", "approve", f"{ex.id}:{ex.plan_hash}")
    assert bot.approvals(ex.id) == ["slack:U0ERIN"]


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
