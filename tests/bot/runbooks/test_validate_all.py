"""`runbook validate` names every problem of a file in one pass: one invalid part (a step id
used twice, an unknown field in a step, a bad parameter) no longer hides the problems of the
others, and its own parts are not reported twice; and a host.run command or command check
that the configuration does not allow-list is refused (the shipped runbooks only warned)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.config import shipped_runbooks
from bot.runbooks.catalogue import KNOWN
from bot.runbooks.loading import RunbookError, load_all, load_text
from bot.surfaces import cli

ARGUMENTS = {name: known[0] for name, known in KNOWN.items()}
COMMANDS = ["selftest-uname", "selftest-python"]


def problems(book: dict[str, Any], commands: list[str] | None = None) -> list[str]:
    with pytest.raises(RunbookError) as failed:
        load_text(yaml.safe_dump(book, sort_keys=False), Path("rb.yaml"), ARGUMENTS, commands)
    return [p.split(": ", 1)[1] for p in failed.value.problems]  # without FILE:LINE


def book(*steps: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"name": "rb", "version": "1.0.0", "summary": "t", "risk": "low",
            "params": {"node": {"type": "node", "required": True}}, **more,
            "steps": list(steps)}


def say(step_id: str, message: str = "hi", **more: Any) -> dict[str, Any]:
    return {"id": step_id, "action": "chat.notify", "with": {"message": message}, **more}


def test_a_duplicate_step_id_hides_nothing_after_it() -> None:
    found = problems(book(say("a"), say("a"), {"id": "c", "action": "slurm.drian"},
                          say("d", "{{ nod }}")))
    assert found == [
        'steps: step id "a" is used twice (steps[0] and steps[1])',
        'steps[2].action: unknown action "slurm.drian" (did you mean "slurm.drain"?)',
        'steps[3].with.message: template uses "nod", which is not a parameter '
        '(did you mean "node"?)']


def test_an_invalid_step_hides_neither_the_others_nor_a_duplicate_id() -> None:
    found = problems(book(say("a", "{{ nod }}"), say("a"), say("c", retrys=2),
                          {"id": "d", "action": "chat.notify", "with": {"mesage": "x"}}))
    assert found == [  # nothing about the parts of the invalid step c
        "steps[2].retrys: unknown field",
        'steps[1].id: step id "a" is used twice (steps[0] and steps[1])',
        'steps[3].with.mesage: chat.notify takes no argument "mesage" (did you mean '
        '"message"?)',
        'steps[3].with: chat.notify needs the argument "message"',
        'steps[0].with.message: template uses "nod", which is not a parameter '
        '(did you mean "node"?)']


def test_an_invalid_parameter_keeps_its_name_for_templates() -> None:
    found = problems(book(say("a", "{{ reason }}"), params={
        "node": {"type": "node", "required": True},
        "reason": {"type": "txt"}}))
    assert len(found) == 1 and found[0].startswith("params.reason.type: Input should be")


def test_an_invalid_pre_check_is_not_taken_for_a_missing_capacity_guard() -> None:
    drain = {"id": "drain", "action": "slurm.drain",
             "with": {"nodes": "{{ node }}", "reason": "x"}}
    broken = {"name": "guard", "capacity": {"pool_of": "{{ node }}"}, "bogus": 1}
    found = problems(book(drain, pre_checks=[broken]))
    assert found == ["pre_checks[0].bogus: unknown field"]
    assert any("add a capacity pre-check" in p for p in problems(book(drain)))


def test_a_host_command_must_be_allow_listed() -> None:
    found = problems(book(
        {"id": "a", "action": "host.run", "with": {"command": "selftest-unme"},
         "undo": {"action": "host.run", "with": {"command": "reboot-all"}}},
        {"id": "b", "action": "host.run", "with": {"command": "{{ node }}"}},  # a template
        say("c"), post_checks=[{"name": "x", "command": "selftest-pythn", "expect": "== 0"}]),
        COMMANDS)
    assert found == [
        'steps[0].with.command: "selftest-unme" is not an allow-listed host command '
        '(host_commands: selftest-python, selftest-uname) (did you mean "selftest-uname"?)',
        'steps[0].undo.with.command: "reboot-all" is not an allow-listed host command '
        '(host_commands: selftest-python, selftest-uname)',
        'post_checks[0].command: "selftest-pythn" is not an allow-listed host command '
        '(host_commands: selftest-python, selftest-uname) (did you mean "selftest-python"?)']


def test_without_an_allow_list_host_commands_are_not_judged() -> None:
    text = yaml.safe_dump(book({"id": "a", "action": "host.run",
                                "with": {"command": "site-only"}}))
    assert load_text(text, Path("rb.yaml"), ARGUMENTS).name == "rb"  # the bot's own load


def test_the_shipped_runbooks_are_exempt_their_site_commands() -> None:
    found = load_all([shipped_runbooks()], ARGUMENTS, COMMANDS, exempt=shipped_runbooks())
    assert "restore-etcd" in found
    with pytest.raises(RunbookError, match='"etcd-switch" is not an allow-listed'):
        load_all([shipped_runbooks() / "restore-etcd.yaml"], ARGUMENTS, COMMANDS)


@pytest.fixture
def bare(tmp_path: Path) -> Iterator[None]:
    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith("RUNBOOK_")]:
        del os.environ[key]
    os.environ["XDG_STATE_HOME"] = str(tmp_path / "state")
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_runbook_validate_refuses_a_command_and_warns_for_the_shipped(
        bare: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump(book({"id": "a", "action": "host.run",
                                         "with": {"command": "selftest-unme"}})))
    assert cli.main(["validate", str(mine)]) == 2
    assert '"selftest-unme" is not an allow-listed host command' in capsys.readouterr().err
    assert cli.main(["validate"]) == 0
    out, err = capsys.readouterr()
    assert "ok " in out and "restore-etcd runs the host command(s) etcd-switch" in err


def test_a_file_missing_required_fields_is_still_checked() -> None:
    found = problems({"name": "rb", "params": {}, "steps": [say("a", "{{ nod }}")]})
    assert found[:3] == ["version: Field required", "summary: Field required",
                         "risk: Field required"]
    assert found[3].startswith('steps[0].with.message: template uses "nod"')
    assert problems({"name": "rb"}) == ["version: Field required", "summary: Field required",
                                        "risk: Field required", "steps: Field required"]
