"""The chat grammar and the terminal chat in script mode: answers for every command, a
request approved by a second person (/as in lab configs), helpful errors for anything else."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bot.service import Service
from bot.surfaces.chat import commands
from bot.surfaces.chat.terminal import run_chat
from tests.bot import fakes
from tests.bot.execution.test_engine import record, runbook
from tests.conftest import BotFactory


@pytest.fixture
def bot(make_bot: BotFactory) -> Service:
    fakes.reset()
    return make_bot({"demo": runbook([record("a", "{{ node }}")], risk="medium")})


def chat(bot: Service, script: str, user: str = "alice") -> tuple[int, str]:
    out = io.StringIO()
    code = run_chat(bot, user, lines=script.splitlines(), out=out)
    return code, out.getvalue()


def test_request_then_approval_by_another_person(bot: Service) -> None:
    code, text = chat(bot, """
        run demo node=gpu02
        /as bob
        approve 1
        /as carol
        approve 1
    """)
    assert "execution 1: demo 1.0.0 requested by alice; waiting for approval" in text
    assert "bob may not approve demo" in text
    assert "execution 1: approved by carol (1/1), plan " in text and "; now approved" in text
    assert "[1] succeeded" in text  # the chat's own engine ran it before leaving
    assert code == 1  # one answer was a refusal
    assert fakes.JOURNAL == [("test.record", "gpu02")]


@pytest.mark.parametrize("line, expected", [
    ("aprove 1", 'Did you mean "approve"?'),
    ("run dmeo node=gpu01", 'did you mean "demo"?'),
    ("run demo node=gpu01;reboot", "is not a node name"),
    ('run demo node="gpu01', "check the quotes"),
    ("approve x", "usage: approve ID"),
    ("status 99", "there is no execution 99"),
    ("node gpu9", "did you mean"),
    ("", "runbook commands:"),
    ("confirm 1 maybe", "usage: confirm ID [yes|no]"),  # once answered yes
    ("confirm 1 yes step=Bad!", "usage: confirm ID [yes|no] [step=STEP] [plan=HASH]"),
    ("confirm 1 no plan=abc", "usage: confirm ID [yes|no] [step=STEP] [plan=HASH]"),
    ("confirm 1 no note=x", "usage: confirm ID [yes|no] [step=STEP] [plan=HASH]"),
])
def test_helpful_answers(bot: Service, line: str, expected: str) -> None:
    assert expected in commands.handle(bot, line, "alice").text


@pytest.mark.parametrize("line, kind", [
    ("list", "read"), ("help", "read"), ("", "read"), ("status 3", "read"), ("proposals", "read"),
    ("history node=gpu01", "read"), ("schedule", "read"), ("window show 2", "read"),
    ("aprove 1", "read"), ('run demo node="gpu01', "read"),  # answered with what is wrong
    ("approve 1", "decide"), ("deny 1 no", "decide"), ("confirm 1 no", "decide"),
    ("schedule approve 2", "decide"), ("window approve 2", "decide"),
    ("run demo node=gpu01", "act"), ("plan demo node=gpu01", "act"), ("cancel 1", "act"),
    ("proposal dismiss 1", "act"), ("schedule add demo node=gpu01 cron=x", "act"),
])
def test_what_a_line_does(line: str, kind: str) -> None:
    assert commands.kind_of(line) == kind


def test_plan_and_describe_and_history(bot: Service) -> None:
    assert "plan hash:" in commands.handle(bot, 'plan demo node=gpu03', "alice").text
    assert "demo 1.0.0 (risk medium)" in commands.handle(bot, "describe demo", "alice").text
    commands.handle(bot, "run demo node=gpu03", "alice")
    assert "demo awaiting_approval" in commands.handle(bot, "history node=gpu03", "bob").text


def test_history_and_the_node_view_find_a_node_inside_a_hostlist(make_bot: BotFactory
                                                                   ) -> None:
    """A request for gpu[02-04] touched gpu03: the history of gpu03 has it, gpu05's not."""
    fakes.reset()
    bot = make_bot({"demo": runbook([record("a", "{{ nodes }}")], risk="medium",
                                    params={"nodes": {"type": "nodes", "required": True}},
                                    locks=[])})
    commands.handle(bot, "run demo nodes=gpu[02-04]", "alice")
    assert "1: demo awaiting_approval" in commands.handle(bot, "history node=gpu03", "bob").text
    assert commands.handle(bot, "history node=gpu05", "bob").text == "no executions"
    from bot.surfaces import nodeview

    (view,) = nodeview.build(bot, ["gpu04"])
    assert [ex["id"] for ex in view.executions] == [1]


def test_as_refused_without_lab(make_bot: BotFactory) -> None:
    fakes.reset()
    bot = make_bot({"demo": runbook([record("a", "a")])}, lab=False)
    _, text = chat(bot, "/as carol\n")
    assert "only available when the configuration says lab: true" in text


def test_runbook_chat_script_mode(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    env["XDG_STATE_HOME"] = str(tmp_path)
    subprocess.run([sys.executable, "-m", "bot", "db", "init"], env=env, check=True,
                   capture_output=True, timeout=60)  # the first command on a new install
    done = subprocess.run([sys.executable, "-m", "bot", "chat"], input="run selftest\n",
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "queued: it runs now" in done.stdout and "[1] succeeded" in done.stdout
