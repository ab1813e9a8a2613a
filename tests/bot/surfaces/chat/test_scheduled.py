"""The chat grammar's ``schedule`` and ``window`` verbs (and ``runbook schedule|window``,
which answer the same): adding, listing, approving ahead, pausing, refusing bad input with
what to fix; windows created, approved, shown and cancelled."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from datetime import UTC, datetime
from pathlib import Path

import pytest
import time_machine

from bot.runbooks.catalogue import Catalogue
from bot.schedule import scheduling, windows
from bot.service import Service
from bot.store import audit
from bot.surfaces import cli
from bot.surfaces.chat import commands
from bot.surfaces.chat.reply import Reply
from tests.bot import fakes
from tests.bot.execution.test_engine import record, runbook
from tests.bot.schedule.windowfakes import Systems
from tests.conftest import BotFactory

RUNBOOKS = Path(__file__).resolve().parents[4] / "runbooks"


@pytest.fixture
def bot(make_bot: BotFactory) -> Service:
    fakes.reset()
    made = make_bot({
        "demo": runbook([record("a", "{{ node }}")], risk="medium"),
        "open-window": (RUNBOOKS / "open-window.yaml").read_text(),
        "close-window": (RUNBOOKS / "close-window.yaml").read_text(),
    })
    systems = Systems(["gpu01", "gpu02", "gpu03", "gpu04"], ["gpu04"])
    made.catalogue = Catalogue([*made.catalogue._actions.values(), *systems.actions()])
    return systems.guarding(made)


@pytest.fixture(autouse=True)
def clock() -> Iterator[time_machine.Traveller]:
    with time_machine.travel(datetime(2026, 3, 2, 1, 0, tzinfo=UTC), tick=False) as traveller:
        yield traveller


def say(bot: Service, line: str, user: str = "alice") -> Reply:
    return commands.handle(bot, line, user)


def test_help_names_the_new_verbs(bot: Service) -> None:
    text = say(bot, "help").text
    assert 'schedule add NAME key=value... cron="0 2 * * SAT"' in text
    assert "window create NODES" in text


def test_schedule_add_list_approve_pause(bot: Service) -> None:
    reply = say(bot, 'schedule add demo node=gpu02 cron="0 2 * * SAT" tz=Europe/Istanbul '
                     "approve=ahead")
    assert reply.ok, reply.text
    assert reply.text.startswith('schedule 1: demo cron "0 2 * * SAT" Europe/Istanbul, next '
                                 "2026-03-06T23:00:00Z UTC; runs as alice")
    assert "schedule approve 1" in reply.text
    listed = say(bot, "schedule list").text
    assert "1: demo node=gpu02" in listed and "approved ahead by nobody yet" in listed
    assert not say(bot, "schedule approve 1", "bob").ok
    approved = say(bot, "schedule approve 1", "carol")
    assert approved.ok and "approved ahead by carol (1/1: carol)" in approved.text
    assert "approved ahead by carol" in say(bot, "schedule").text
    assert say(bot, "schedule pause 1").text == "schedule 1: paused (pause by alice)"
    assert "[paused]" in say(bot, "schedule list").text
    assert say(bot, "schedule resume 1").ok
    shown = say(bot, "schedule show 1").text
    assert "approval: ahead" in shown and "carol" in shown
    assert say(bot, "schedule remove 1").text == "schedule 1: removed (remove by alice)"
    assert say(bot, "schedule list").text == "no schedules"
    assert "[removed]" in say(bot, "schedule list all").text


@pytest.mark.parametrize("line, expected", [
    ('schedule add demo node=gpu02 cron="0 2 * *"', "a crontab has 5 fields"),
    ('schedule add demo node=gpu02 cron="0 2 * * *" tz=Nowhere/Land', "unknown time zone"),
    ('schedule add dmeo node=gpu02 at="2026-12-05 02:00"', 'did you mean "demo"'),
    ('schedule add demo node=gpu42 at="2026-12-05 02:00"', "not a known node"),
    ('schedule add demo node=gpu02 at="2026-01-05 02:00"', "is in the past"),
    ("schedule add demo node=gpu02", "give either cron="),
    ("schedule pause x", "usage: schedule add NAME"),
    ("schedule frobnicate 1", "usage: schedule add NAME"),
    ("schedule show 7", "there is no schedule 7"),
    ("window create gpu02 duration=2h", "usage: window create NODES"),
    ("window create gpu02 start=now duration=2h colour=blue", "usage: window create"),
    ("window show 3", "there is no maintenance window 3"),
    ('window create gpu[02-05] start=now duration=2h', "gpu05: not known node"),
    ('window create gpu[02-09] start=now duration=2h',
     'nodes "gpu[02-09]" names 8 nodes; the inventory holds 4'),
])
def test_helpful_refusals(bot: Service, line: str, expected: str) -> None:
    reply = say(bot, line)
    assert not reply.ok
    assert expected in reply.text
    assert scheduling.listing(bot, everything=True) == []
    assert windows.listing(bot, everything=True) == []


def test_runbooks_that_do_not_read_refuse_the_window_and_the_refusal_is_recorded(
        bot: Service) -> None:
    reply = say(bot, 'window create gpu02 start=now duration=2h runbooks="demo node"')
    assert not reply.ok
    assert 'runbooks: "demo node": "node" is not key=value' in reply.text
    assert windows.listing(bot, everything=True) == []
    with bot.db.connect() as conn:
        (event,) = [e for e in audit.events(conn) if e["kind"] == "window_refused"]
    assert event["data"]["runbooks"] == "demo node" and event["actor"] == "alice"


def test_window_create_approve_show_cancel(bot: Service) -> None:
    reply = say(bot, 'window create gpu[02-03] start="2026-03-02 04:00" duration=3h '
                     'reason="firmware update" runbooks="demo node=gpu02"')
    assert reply.ok, reply.text
    assert reply.text.startswith("window 1: gpu[02-03] from 2026-03-02 04:00 UTC for 3h, "
                                 "1 runbook(s) inside")
    assert "window approve 1" in reply.text
    assert "1: gpu[02-03] from 2026-03-02 04:00 UTC for 3h [scheduled]" in say(
        bot, "window list").text
    assert not say(bot, "window approve 1").ok  # alice created it
    assert say(bot, "window approve 1", "dave").ok
    shown = say(bot, "window show 1").text
    assert "approvals ahead: dave (open-window 1/1, demo 1/1" in shown
    assert "1. demo node=gpu02 — pending" in shown
    assert say(bot, "window cancel 1", "bob").ok is False
    assert say(bot, "window cancel 1").text == "window 1: cancelled (alice)"
    assert say(bot, "window list").text == "no maintenance windows"


def test_the_command_line_answers_the_same(bot: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_bot", lambda args: bot)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(["schedule", "add", "demo", "node=gpu02", "at=2026-12-05 02:00",
                         "--as", "alice"])
        bad = cli.main(["schedule", "add", "demo", "node=gpu02", "cron=0 2 * *", "--as", "bob"])
        listed = cli.main(["schedule", "list"])
    assert (code, bad, listed) == (0, 2, 0)
    assert "schedule 1: demo at 2026-12-05 02:00 UTC" in out.getvalue()
    assert "a crontab has 5 fields" in err.getvalue()
    assert scheduling.get(bot, 1).source == "cli"
