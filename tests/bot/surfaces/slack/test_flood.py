"""A burst of Slack requests against the real server (uvicorn on a socket) and the lab's Slack
fake started alone: 50 signed slash commands sent at once are all acknowledged and each
answered once at its response_url, redeliveries of them run nothing twice, and requests not
signed with the app's secret are refused (401) before the bot does any work for them; a
button click, acknowledged the same way, decides as the command it stands for; the work
waits for a pause in the acknowledgements, but never longer than PATIENCE."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from bot.runtime.httpserver import HttpServer, Settings
from bot.runtime.serving import application
from bot.service import Service
from bot.store.schema import chat_deliveries, executions
from bot.surfaces.slack.app import PATIENCE, QUIET
from bot.surfaces.slack.surface import SlackSurface
from tests.bot.surfaces.slack.slackhelp import FakeSlack, SlackClientSide, standalone_fake
from tests.conftest import BotFactory

SENDERS = 50
RUNBOOK = {
    "name": "note", "version": "1.0.0", "summary": "leave a note", "risk": "low",
    "params": {"n": {"type": "int", "required": True}},
    "approval": {"required": 1, "approvers": ["group:gpu-leads"], "expires": "30m"},
    "steps": [{"id": "note", "action": "chat.notify", "with": {"message": "note {{ n }}"}}],
}


class Flooded:
    def __init__(self, bot: Service, surface: SlackSurface, slack: SlackClientSide) -> None:
        self.bot, self.surface, self.slack = bot, surface, slack

    @property
    def fake(self) -> FakeSlack:
        return self.slack.fake

    def send_all(self, bodies: list[str], **kwargs: Any) -> list[int]:
        """Each body sent from its own sender, all at once; the HTTP statuses."""
        start = threading.Barrier(len(bodies))

        def send(body: str) -> int:
            start.wait(30)
            return self.slack.post(body, **kwargs)[0]

        with ThreadPoolExecutor(len(bodies)) as pool:
            return list(pool.map(send, bodies))

    def posts(self, bodies: list[str]) -> list[int]:
        """How many answers each body's response_url got, once the work is done."""
        self.surface.work.shutdown(wait=True)  # everything acknowledged has run
        found = {r["id"]: len(r["posts"]) for r in self.fake.responses()}
        return [found.get(response_id(body), 0) for body in bodies]

    def count(self, table: Any) -> int:
        with self.bot.db.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def response_id(body: str) -> str:
    from urllib.parse import parse_qs

    return parse_qs(body)["response_url"][0].rsplit("/", 1)[1]


@pytest.fixture
def flooded(make_bot: BotFactory, tmp_path: Path) -> Iterator[Flooded]:
    with standalone_fake(tmp_path) as (fake, secrets):
        bot = make_bot({"note": RUNBOOK}, slack={"channel": "C0RUNBOOK",
                                                 "users": {"U0ALICE": "alice",
                                                           "U0CAROL": "carol"}})
        surface = SlackSurface(bot, secrets)
        server = HttpServer(application(bot, surface.routes(), alerts_token=None),
                            "127.0.0.1", 0, Settings(grace=1))
        server.start()
        try:
            url = f"http://127.0.0.1:{server.port}/slack/events"
            yield Flooded(bot, surface, SlackClientSide(url, secrets.signing_secret or "", fake))
        finally:
            server.stop()
            surface.work.shutdown(wait=True)


def test_fifty_commands_at_once_are_all_acknowledged_and_answered_once(
        flooded: Flooded) -> None:
    bodies = [flooded.slack.command_body(f"run note n={n}", "U0ALICE") for n in range(SENDERS)]
    redelivered = bodies[:10]  # Slack retries some: the same trigger_id, sent again
    started = time.monotonic()
    statuses = flooded.send_all(bodies + redelivered)
    print(f"{len(statuses)} acknowledged in {time.monotonic() - started:.2f}s")
    assert statuses == [200] * (SENDERS + len(redelivered))
    assert flooded.posts(bodies) == [1] * SENDERS
    assert flooded.count(executions) == SENDERS  # one run each, redeliveries or not
    assert flooded.count(chat_deliveries) == SENDERS


def test_requests_not_signed_by_slack_are_refused_before_any_work(
        flooded: Flooded, monkeypatch: pytest.MonkeyPatch) -> None:
    touched: list[str] = []

    def spy(what: str) -> Any:
        def called(*args: Any) -> None:
            touched.append(what)
        return called

    monkeypatch.setattr(flooded.surface.listeners, "acknowledged", spy("listeners"))
    monkeypatch.setattr(flooded.surface.app, "dispatch", spy("bolt"))
    monkeypatch.setattr("bot.surfaces.slack.surface.parse_body", spy("parsed"))
    bodies = [flooded.slack.command_body(f"run note n={n}", "U0ALICE") for n in range(SENDERS)]
    click = flooded.slack.click_body("approve", "1:" + "0" * 64, "U0ALICE")
    assert flooded.send_all(bodies, secret="not-the-signing-secret") == [401] * SENDERS
    assert flooded.send_all([click], timestamp=int(time.time()) - 301) == [401]  # stale
    assert flooded.send_all(bodies[:5], headers={"X-Slack-Signature": "v0=" + "0" * 64}) == \
        [401] * 5
    assert touched == []
    assert flooded.posts(bodies) == [0] * SENDERS
    assert flooded.count(chat_deliveries) == 0 and flooded.count(executions) == 0
    assert flooded.fake.calls("chat.postEphemeral") == []


def test_a_click_acknowledged_at_once_decides_as_its_command(flooded: Flooded) -> None:
    execution = flooded.bot.get(flooded.bot.request("note", {"n": "1"}, "alice"))
    assert execution.state == "awaiting_approval"
    value = f"{execution.id}:{execution.plan_hash}"
    clicks = [flooded.slack.click_body("approve", value, "U0CAROL") for _ in range(2)]
    assert flooded.send_all(clicks + clicks) == [200] * 4  # each click delivered twice
    flooded.surface.work.shutdown(wait=True)
    assert flooded.bot.get(execution.id).state == "approved"
    answers = flooded.fake.calls("chat.postEphemeral")
    assert len(answers) == 2, answers  # one a click, not one a delivery


def test_work_waits_for_a_pause_in_the_acknowledgements_but_not_for_ever(
        flooded: Flooded, monkeypatch: pytest.MonkeyPatch) -> None:
    listeners = flooded.surface.listeners
    ran: list[tuple[float, float]] = []  # each piece of work: when it started and ended

    def work(body: Any, respond: Any) -> None:
        started = time.monotonic()
        time.sleep(QUIET * 5)
        ran.append((started, time.monotonic()))

    monkeypatch.setattr(listeners, "_command", work)

    def command(trigger: str) -> float:
        """Acknowledge a command; when (no later than its work's start)."""
        before = time.monotonic()
        assert listeners.acknowledged({"command": "/runbook", "text": "help",
                                       "user_id": "U0ALICE", "trigger_id": trigger,
                                       "response_url": flooded.fake.url + "/nowhere"})
        return before

    command("trigger-alone")
    flooded.fake.wait(lambda: ran, 10, "the work of a lone command")
    assert ran[0][0] - listeners.last_ack >= QUIET
    stop = threading.Event()

    def acknowledging() -> None:  # acknowledgements that never pause
        while not stop.is_set():
            listeners.last_ack = time.monotonic()
            time.sleep(QUIET / 10)

    busy = threading.Thread(target=acknowledging)
    busy.start()
    try:
        during = [command(f"trigger-during-{n}") for n in range(3)]
        flooded.fake.wait(lambda: len(ran) == 4, 10, "the work during a burst")
    finally:
        stop.set()
        busy.join()
    assert all(started - during[0] >= PATIENCE for started, _ in ran[1:])
    in_turn = sorted(ran[1:])
    assert all(ended <= then for (_, ended), (then, _) in pairwise(in_turn)), in_turn
    assert not listeners.burst.locked()
