"""A Slack user the configuration does not name (``slack:<ID>``) gets what ``slack.unmapped``
says and nothing more, even where approvers and requesters are "*": under ``requester`` it
may request runs (run, schedule add, window create, proposal run) and steer its own; it may
never approve, deny or confirm, cancel or resume another's run, dismiss a proposal, pause or
remove another's schedule, open or cancel another's window, or reset the breaker. Each verb
is tried through the Slack listeners and again against the core, which decides alone."""

from __future__ import annotations

import pytest

from bot.alerts import breaker, proposing
from bot.config import Config
from bot.schedule import scheduling
from bot.service import Service
from bot.surfaces.chat import commands
from kit.errors import Refused
from tests.bot.surfaces.slack.test_slack_parts import RUNBOOK, click, listeners_for, slash
from tests.conftest import BotFactory

EVERYONE = {**RUNBOOK, "approval": {"required": 1, "approvers": ["*"], "expires": "30m"}}
ERIN = "slack:U0ERIN"


def make(make_bot: BotFactory) -> Service:
    return make_bot({"drain": EVERYONE}, requesters=["*"], approvers=["*"], slack={
        "channel": "C1", "users": {"U0CAROL": "carol", "U0ALICE": "alice"},
        "unmapped": "requester"})


def test_the_core_gives_star_to_an_unnamed_slack_user_only_to_request(
        make_bot: BotFactory) -> None:
    bot = make(make_bot)
    assert bot.config.matches(ERIN, ["*"], requesting=True)
    assert not bot.config.matches(ERIN, ["*"])
    assert bot.config.matches("carol", ["*"]) and bot.config.matches(ERIN, [f"user:{ERIN}"])
    readonly = make_bot({"drain": EVERYONE}, requesters=["*"], slack={"channel": "C1"})
    assert not readonly.config.matches(ERIN, ["*"], requesting=True)


def test_an_unnamed_slack_user_requests_and_steers_only_its_own(make_bot: BotFactory) -> None:
    bot = make(make_bot)
    listeners, _ = listeners_for(bot.config, bot)
    answer = slash(listeners, "U0ERIN", "run drain node=gpu02")
    own = bot.get(int(answer.split()[1].rstrip(":")))
    assert own.requested_by == ERIN
    others = bot.get(bot.request("drain", {"node": "gpu01"}, "alice"))
    assert "may not" in slash(listeners, "U0ERIN", f"cancel {others.id}")
    assert "may not" in click(listeners, "U0ERIN", "cancel", str(others.id))
    assert bot.get(others.id).state == "awaiting_approval"
    for verb in ("approve", "deny"):
        assert "may approve, deny or confirm" in click(listeners, "U0ERIN", verb,
                                                       f"{others.id}:{others.plan_hash}")
    assert bot.approvals(others.id) == []
    slash(listeners, "U0ERIN", f"cancel {own.id}")
    assert bot.get(own.id).state == "cancelled"


@pytest.mark.parametrize("line", [
    "breaker reset the pool is fine", "approve {other}", "deny {other} no", "cancel {other}",
])
def test_each_verb_the_core_refuses_whatever_the_surface_lets_through(
        make_bot: BotFactory, line: str) -> None:
    """The chat grammar straight into the core (as a surface that forgot the Slack check
    would): the service itself refuses."""
    bot = make(make_bot)
    other = bot.request("drain", {"node": "gpu01"}, "alice")
    reply = commands.handle(bot, line.format(other=other), ERIN)
    assert "may not" in reply.text or "may approve" in reply.text, reply.text
    assert bot.get(other).state == "awaiting_approval" and bot.approvals(other) == []


def test_breaker_schedules_and_windows_of_others_stay_theirs(make_bot: BotFactory) -> None:
    bot = make(make_bot)
    with pytest.raises(Refused, match="may not reset the breaker"):
        breaker.reset(bot, ERIN, "looks fine")
    sched = scheduling.add(bot, "drain", {"node": "gpu01"}, "alice", cron="0 2 * * SAT")
    for verb in ("pause", "remove"):
        with pytest.raises(Refused, match="may not"):
            scheduling.steer(bot, sched.id, ERIN, verb)
    with pytest.raises(Refused, match="may not dismiss proposals"):
        proposing.dismiss(bot, 999, ERIN, None)  # refused before the proposal is looked up
    mine = scheduling.add(bot, "drain", {"node": "gpu02"}, ERIN, cron="0 3 * * SAT")
    assert mine.created_by == ERIN  # requesting is what requester gives


def test_no_configured_person_may_be_named_like_an_unnamed_slack_user() -> None:
    with pytest.raises(ValueError, match="user names may not start with 'slack:'"):
        Config.model_validate({"slack": {"channel": "C1", "users": {"U1": "slack:bob"}}})
