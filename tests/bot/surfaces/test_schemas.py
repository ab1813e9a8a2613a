"""The JSON Schemas editors check files with, and docs/actions.md: the committed copies are
what `runbook schema` and `runbook docs actions` make now; every shipped runbook and the
example configuration validate against them (jsonschema) and name them on their modeline;
and the schema catches what it is for (an unknown action, an argument it does not take)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from bot.surfaces import cli

ROOT = Path(__file__).resolve().parents[3]
RUNBOOKS = sorted((ROOT / "runbooks").glob("*.yaml"))
CONFIGS = [ROOT / "deploy" / "kubernetes" / "base" / "config" / "config.yaml"]
MODELINE = "# yaml-language-server: $schema="


def printed(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    assert cli.main(list(args)) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(("args", "committed"), [
    (["schema", "runbook"], "docs/schema/runbook.schema.json"),
    (["schema", "config"], "docs/schema/config.schema.json"),
    (["docs", "actions"], "docs/actions.md"),
])
def test_the_committed_copy_is_up_to_date(args: list[str], committed: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert printed(capsys, *args) == (ROOT / committed).read_text(), (
        f"{committed} is out of date: runbook {' '.join(args)} > {committed}")


def validator(kind: str) -> Any:
    schema = json.loads((ROOT / "docs" / "schema" / f"{kind}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def modeline_target(path: Path) -> Path:
    first = path.read_text().splitlines()[0]
    assert first.startswith(MODELINE), f"{path.name}: the first line names no schema"
    return (path.parent / first.removeprefix(MODELINE)).resolve()


@pytest.mark.parametrize("path", RUNBOOKS, ids=lambda p: p.stem)
def test_a_shipped_runbook_names_and_passes_the_runbook_schema(path: Path) -> None:
    assert modeline_target(path) == ROOT / "docs" / "schema" / "runbook.schema.json"
    problems = [f"{list(e.absolute_path)}: {e.message}"
                for e in validator("runbook").iter_errors(yaml.safe_load(path.read_text()))]
    assert not problems


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_an_example_configuration_names_and_passes_the_config_schema(path: Path) -> None:
    assert modeline_target(path) == ROOT / "docs" / "schema" / "config.schema.json"
    problems = [f"{list(e.absolute_path)}: {e.message}"
                for e in validator("config").iter_errors(yaml.safe_load(path.read_text()))]
    assert not problems


def test_the_runbook_schema_knows_each_action_s_arguments() -> None:
    book = yaml.safe_load((ROOT / "runbooks" / "drain-node.yaml").read_text())
    check = validator("runbook")
    step = next(i for i, s in enumerate(book["steps"]) if s["action"] == "slurm.drain")

    def problems(change: Any) -> list[str]:
        changed = copy.deepcopy(book)
        change(changed["steps"][step])
        return [e.message for e in check.iter_errors(changed)]

    assert any("'reasn' was unexpected" in p for p in problems(
        lambda s: s["with"].update(reasn="x")))
    assert any("'reason' is a required property" in p for p in problems(
        lambda s: s["with"].pop("reason")))
    assert any("'slurm.drian' is not one of" in p for p in problems(
        lambda s: s.update(action="slurm.drian")))
    assert any("is not valid under any of the given schemas" in p for p in problems(
        lambda s: s["with"].update(failed_check="maybe")))
    # a template stands for any value; a duration argument takes a duration as text
    assert problems(lambda s: s["with"].update(failed_check="{{ flag }}")) == []
    wait = copy.deepcopy(book)
    wait["steps"][step] = {"id": "w", "action": "slurm.wait_idle",
                           "with": {"nodes": "gpu01", "timeout": "2h"}}
    assert [e.message for e in check.iter_errors(wait)] == []


def test_the_config_schema_refuses_an_unknown_key() -> None:
    found = [e.message for e in validator("config").iter_errors({"inventroy": {}})]
    assert any("'inventroy' was unexpected" in p for p in found)


def test_the_actions_page_names_every_action_and_its_arguments() -> None:
    from bot.runbooks.catalogue import ACTION_CLASSES

    page = (ROOT / "docs" / "actions.md").read_text()
    for name, (cls, _) in ACTION_CLASSES.items():
        section = page.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
        for argument in cls.Arguments.model_fields:
            assert f"| `{argument}` |" in section, (name, argument)
