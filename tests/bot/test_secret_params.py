"""Secret parameters (``secret: true``, issue 28): the value reaches the action that runs, and
nothing else in clear: not a table of the database, the audit log, a log line, a progress
line, the plan, the chat, Slack. The plan binds it by a keyed fingerprint; the engine gets it
after a restart; a missing or other key fails closed; echoes (a failing command's argv and
stderr) are masked before they are stored; schedules and windows cannot keep one."""

from __future__ import annotations

import json
import logging
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select, text, update

from bot.execution.engine import Engine
from bot.runbooks.loading import RunbookError, load_text
from bot.runbooks.secrets import Unsealer
from bot.schedule import scheduling, windows
from bot.service import Service
from bot.store import audit
from bot.store.schema import execution_secrets, executions, metadata
from bot.surfaces import rendering
from bot.surfaces.chat import commands
from bot.surfaces.slack.blocks import plan_message
from kit.errors import Refused
from kit.secretbox import SecretBox
from tests.bot import fakes
from tests.conftest import BotFactory

SECRET = "s3cr3t-T0ken-9f8e7d"
KEY = "k" * 40
# prints its argument to stdout and stderr, then fails: the echo the engine must mask
ECHO = "import sys; print('got', sys.argv[-1]); print('bad token', repr(sys.argv[-1]), " \
       "file=sys.stderr); sys.exit(3)"


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    fakes.reset()
    monkeypatch.delenv("RUNBOOK_SECRET_KEY", raising=False)


def runbook(steps: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
    return {
        "name": "keyed", "version": "1.0.0", "summary": "uses a token", "risk": "low",
        "params": {"node": {"type": "node", "required": True},
                   "token": {"type": "text", "secret": True, "required": True,
                             "pattern": "[A-Za-z0-9-]+"}, **params},
        "locks": ["node:{{ node }}"], "steps": steps,
    }


RECORD = [{"id": "use", "action": "test.record", "with": {"key": "Bearer {{ token }}"},
           "undo": {"action": "test.forget", "with": {"key": "Bearer {{ token }}"}}}]
ECHOING = [*RECORD, {"id": "call", "action": "host.run",
                     "with": {"command": "echo-fail", "args": ["{{ node }}", "{{ token }}"]}}]


def key_file(tmp_path: Path, key: str = KEY) -> str:
    path = tmp_path / f"key-{len(key)}-{key[:2]}"
    path.write_text(key + "\n")
    return str(path)


def make(make_bot: BotFactory, tmp_path: Path, steps: list[dict[str, Any]] = RECORD,
         key: str | None = KEY, approval: dict[str, Any] | None = None) -> Service:
    config: dict[str, Any] = {"host_commands": {"echo-fail": {
        "argv": [sys.executable, "-c", ECHO], "accepts_args": True}}}
    if key is not None:
        config["secrets"] = {"key_file": key_file(tmp_path, key)}
    body = runbook(steps) | ({"approval": approval} if approval else {})
    return make_bot({"keyed": body}, **config)


def same_store(bot: Service, tmp_path: Path, make_bot: BotFactory, key: str | None) -> Service:
    """Another process's view: the same database, a new service, maybe another key."""
    other = make(make_bot, tmp_path, key=key)
    other.db.dispose()
    return Service(config=other.config.model_copy(update={
        "database_url": bot.config.database_url, "runbook_paths": bot.config.runbook_paths}),
        db=bot.db, catalogue=other.catalogue, checks=other.checks, inventory=other.inventory)


def dump(bot: Service) -> str:
    """Every cell of every table, as text."""
    cells: list[str] = []
    with bot.db.connect() as conn:
        for table in metadata.sorted_tables:
            for row in conn.execute(select(table)):
                cells.extend(str(value) for value in row)
        for name in conn.execute(text("SELECT name FROM sqlite_master WHERE type='table'")):
            cells.extend(str(v) for row in conn.execute(text(f'SELECT * FROM "{name[0]}"'))
                         for v in row)
    return "\n".join(cells)


def drive(bot: Service, execution_id: int, lines: list[str] | None = None,
          wait: bool = True) -> Any:
    engine = Engine(bot, sleep=lambda s: None,
                    report=lambda i, line: (lines if lines is not None else []).append(line))
    try:
        return engine.drive(execution_id, wait_for_approval=wait)
    finally:
        engine.close()


def test_the_action_gets_the_value_and_nothing_stores_or_shows_it(
        make_bot: BotFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    bot = make(make_bot, tmp_path, ECHOING)
    plan = bot.plan("keyed", {"node": "gpu01", "token": SECRET})
    execution_id = bot.request("keyed", {"node": "gpu01", "token": SECRET}, "alice")
    lines: list[str] = []
    ex = drive(bot, execution_id, lines)
    assert ("test.record", f"Bearer {SECRET}") in fakes.JOURNAL  # the action got the value
    assert ("test.forget", f"Bearer {SECRET}") in fakes.JOURNAL  # and so did its undo
    assert ex.state == "failed" and "exited 3" in (ex.error or "")
    assert "bad token '[secret:token]'" in (ex.error or "")  # the echo, masked where it was
    shown = [dump(bot), *lines, *(r.getMessage() for r in caplog.records),
             rendering.plan_text(plan), plan.to_json(), json.dumps(plan_message(ex, []).blocks),
             commands.handle(bot, f"status {execution_id}", "alice").text,
             commands.handle(bot, "history", "alice").text]
    for where in shown:
        assert SECRET not in where
    assert "[secret:token:" in rendering.plan_text(plan)  # the plan says a secret is there
    with bot.db.connect() as conn:
        assert conn.execute(select(execution_secrets)).all() == []  # gone once it ended


def test_the_echo_of_a_secret_in_any_quoting_is_masked() -> None:
    value = "it's a pass word"
    seal = Unsealer({"[secret:pw:0123456789abcdef]": ("pw", value)})
    for text_ in (value, f"cmd '{value}'", f"cmd {json.dumps(value)}", f"x {value!r}",
                  f"run: a {shlex.quote(value)} b"):
        assert value not in seal.mask_text(text_) and "[secret:pw]" in seal.mask_text(text_)
    assert seal.mask({"argv": ["a", value], value: 1}) == {"argv": ["a", "[secret:pw]"],
                                                           "[secret:pw]": 1}
    assert seal.unseal({"k": ["x [secret:pw:0123456789abcdef] y"]}) == {"k": [f"x {value} y"]}
    assert seal.unseal("[secret:pw:ffffffffffffffff]") == "[secret:pw:ffffffffffffffff]"


def test_the_plan_binds_the_value_by_a_keyed_fingerprint(make_bot: BotFactory,
                                                          tmp_path: Path) -> None:
    bot = make(make_bot, tmp_path)
    first = bot.plan("keyed", {"node": "gpu01", "token": SECRET})
    again = bot.plan("keyed", {"node": "gpu01", "token": SECRET})
    other = bot.plan("keyed", {"node": "gpu01", "token": SECRET + "x"})
    assert first.hash == again.hash and first.hash != other.hash
    other_key = make(make_bot, tmp_path, key="z" * 40).plan(
        "keyed", {"node": "gpu01", "token": SECRET})
    assert other_key.hash != first.hash  # a fingerprint nobody without the key can compute
    assert first.params["token"] != other_key.params["token"]


def test_an_approval_covers_that_value_only(make_bot: BotFactory, tmp_path: Path) -> None:
    bot = make(make_bot, tmp_path, approval={"required": 1})
    execution_id = bot.request("keyed", {"node": "gpu01", "token": SECRET}, "alice")
    bot.approve(execution_id, "carol")
    box = SecretBox(KEY)  # someone who can write the database puts another value in
    with bot.db.begin() as conn:
        conn.execute(update(execution_secrets).values(sealed=box.seal("other-value")))
    ex = drive(bot, execution_id, wait=False)
    assert ex.state == "awaiting_approval" and fakes.JOURNAL == []
    with bot.db.connect() as conn:
        kinds = [e["kind"] for e in audit.events(conn)]
    assert "approval_voided" in kinds and "started" not in kinds


def test_a_restarted_engine_gets_the_value(make_bot: BotFactory, tmp_path: Path) -> None:
    bot = make(make_bot, tmp_path)
    execution_id = bot.request("keyed", {"node": "gpu01", "token": SECRET}, "alice")
    later = same_store(bot, tmp_path, make_bot, KEY)
    assert drive(later, execution_id).state == "succeeded"
    assert [("test.record", f"Bearer {SECRET}")] == fakes.JOURNAL


@pytest.mark.parametrize(("key", "said"), [(None, "no key to keep it"),
                                           ("y" * 40, "cannot be decrypted with this key")])
def test_a_missing_or_other_key_fails_closed(make_bot: BotFactory, tmp_path: Path,
                                             key: str | None, said: str) -> None:
    bot = make(make_bot, tmp_path)
    execution_id = bot.request("keyed", {"node": "gpu01", "token": SECRET}, "alice")
    ex = drive(same_store(bot, tmp_path, make_bot, key), execution_id)
    assert ex.state == "failed" and said in (ex.error or "") and fakes.JOURNAL == []


def test_the_key_from_the_environment_wins(make_bot: BotFactory, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNBOOK_SECRET_KEY", "e" * 40)
    bot = make(make_bot, tmp_path)
    fingerprint = bot.plan("keyed", {"node": "gpu01", "token": SECRET}).params["token"]
    assert SecretBox("e" * 40).fingerprint("keyed", "token", SECRET) in fingerprint
    monkeypatch.setenv("RUNBOOK_SECRET_KEY", "short")
    with pytest.raises(Refused, match="at least 32"):
        make(make_bot, tmp_path).plan("keyed", {"node": "gpu01", "token": SECRET})


def test_without_a_key_a_request_is_refused_and_nothing_is_kept(make_bot: BotFactory,
                                                               tmp_path: Path) -> None:
    bot = make(make_bot, tmp_path, key=None)
    with pytest.raises(Refused, match=r"secrets.key_file .* RUNBOOK_SECRET_KEY"):
        bot.request("keyed", {"node": "gpu01", "token": SECRET}, "alice")
    with bot.db.connect() as conn:
        assert conn.execute(select(executions)).all() == []
    assert SECRET not in dump(bot)


@pytest.mark.parametrize("raw", [{"node": "gpu01", "token": SECRET + "!"},  # pattern
                                 {"node": "gpu01", "tokn": SECRET},  # a tired typo
                                 {"node": "gpu99", "token": SECRET}])  # another parameter
def test_a_refused_request_keeps_no_secret(make_bot: BotFactory, tmp_path: Path,
                                           raw: dict[str, str]) -> None:
    bot = make(make_bot, tmp_path)
    with pytest.raises(Refused) as refused:
        bot.request("keyed", raw, "alice")
    assert SECRET not in str(refused.value) and SECRET not in dump(bot)
    reply = commands.handle(bot, "run keyed " + " ".join(f"{k}={v}" for k, v in raw.items()),
                            "alice")
    assert not reply.ok and SECRET not in reply.text


def test_schedules_and_windows_cannot_keep_a_secret(make_bot: BotFactory,
                                                    tmp_path: Path) -> None:
    bot = make(make_bot, tmp_path)
    with pytest.raises(Refused, match="a schedule cannot keep a secret parameter"):
        scheduling.add(bot, "keyed", {"node": "gpu01", "token": SECRET}, "alice",
                       cron="0 2 * * SAT")
    with pytest.raises(Refused, match="a window cannot keep a secret parameter"):
        windows.create(bot, "gpu01", "alice", start="2099-01-01 02:00", duration="2h",
                       runbooks=[("keyed", {"node": "gpu01", "token": SECRET})])
    assert SECRET not in dump(bot)


BAD_USES = [
    ({"token": {"type": "int", "secret": True}}, [], "applies to text parameters"),
    ({"token": {"type": "text", "secret": True, "default": "x"}}, [], "cannot have a default"),
    ({}, [{"id": "a", "action": "test.record", "with": {"key": "{{ token | upper }}"}}],
     "may be used only whole"),
    ({}, [{"id": "a", "action": "test.record", "with": {"key": "x"},
           "when": "token == 'a'"}], "may be used only in a step's with"),
]


@pytest.mark.parametrize(("params", "steps", "said"), BAD_USES)
def test_a_runbook_that_would_spill_a_secret_does_not_load(
        params: dict[str, Any], steps: list[dict[str, Any]], said: str) -> None:
    body = runbook(steps or RECORD, **params)
    with pytest.raises(RunbookError, match=said):
        load_text(yaml.safe_dump(body), Path("keyed.yaml"),
                  {"test.record": fakes.KeyArguments, "test.forget": fakes.KeyArguments})
    body["locks"] = ["node:{{ node }}", "token:{{ token }}"]
    with pytest.raises(RunbookError, match="may be used only in a step's with"):
        load_text(yaml.safe_dump(runbook(RECORD) | {"locks": body["locks"]}),
                  Path("keyed.yaml"),
                  {"test.record": fakes.KeyArguments, "test.forget": fakes.KeyArguments})
