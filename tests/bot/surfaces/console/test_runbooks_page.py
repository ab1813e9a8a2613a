"""/ui/runbooks: the list (current version, risk, summary; runbooks only recorded), each
one's versions with when they were first seen and their content hash, and two versions
side by side with removed and added lines marked in words as well as colours; unknown
names and versions are 404s, files that do not load a message, secrets masked."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bot.service import Service
from bot.surfaces.console import sidebyside
from tests.bot.surfaces.console.pagehelp import Element, as_user, client, overrides, parse
from tests.conftest import BotFactory

SECRET = "default-db-passw0rd"
V1: dict[str, Any] = {
    "name": "demo", "version": "1.0.0", "summary": "first words", "risk": "low",
    "params": {"node": {"type": "node", "required": True},
               "db_password": {"type": "text", "default": SECRET}},
    "steps": [{"id": "a", "action": "test.record", "with": {"key": "one"}},
              {"id": "gone", "action": "test.record", "with": {"key": "two"}}],
}


def v2() -> dict[str, Any]:
    """1.0.0 with a description inserted, a step removed, other words on two lines."""
    body = copy.deepcopy(V1)
    return {"name": "demo", "version": "1.1.0", "summary": "second words",
            "description": "now with a description", "risk": "medium",
            "params": body["params"], "steps": body["steps"][:1]}


@pytest.fixture
def bot(make_bot: BotFactory, sqlite_url: str) -> Service:
    old = {"demo": V1, "retired": {**V1, "name": "retired", "summary": "not any more"}}
    make_bot(old, sqlite_url, **overrides()).runbooks()
    bot = make_bot({"demo": v2()}, sqlite_url, **overrides())
    bot.runbooks()
    return bot


def page(bot: Service, path: str, status: int = 200) -> Element:
    answer = client(bot).get(path, headers=as_user("alice"))
    assert answer.status_code == status, answer.text[:2000]
    assert SECRET not in answer.text
    return parse(answer.text)


def test_the_list(bot: Service) -> None:
    rows = page(bot, "/ui/runbooks").one("table").rows()
    assert rows == [["demo", "1.1.0", "medium", "second words", "2"],
                    ["retired", "no runbook file has it now (recorded versions only)", "1"]]


def test_a_runbook_and_its_versions(bot: Service) -> None:
    doc = page(bot, "/ui/runbooks/demo")
    assert doc.one("h1").text() == "Runbook demo 1.1.0"
    described = doc.one("pre").text()
    assert "demo 1.1.0 (risk medium): second words" in described
    assert "db_password (text, default [hidden])" in described
    table = doc.one("table")
    assert [(row[0], row[3]) for row in table.rows()] == [
        ("1.1.0 (current)", "diff with 1.0.0"), ("1.0.0", "first version")]
    assert all(row[1].startswith("20") and row[1].endswith("Z") for row in table.rows())
    hashes = [code.attrs["title"] for code in table.all("code", "hash")]
    assert len(hashes) == 2 and all(len(h) == 64 for h in hashes)
    links = {a.attrs["href"] for a in table.all("a")}
    assert "/ui/runbooks/demo/diff?from=1.0.0&to=1.1.0" in links
    assert "/ui/executions?runbook=demo&version=1.0.0" in links
    retired = page(bot, "/ui/runbooks/retired")
    assert "only its recorded versions are left" in retired.text()


def test_two_versions_side_by_side(bot: Service) -> None:
    doc = page(bot, "/ui/runbooks/demo/diff?from=1.0.0&to=1.1.0")
    table = doc.one("table", "diff")
    rows = table.all("tr")[1:]
    changes = [row.attrs["class"].removeprefix("diff-") for row in rows]
    assert {"same", "changed", "removed", "added"} <= set(changes)
    for row in rows:
        cells = row.all("td")
        old_marker, new_marker = cells[1].text(), cells[4].text()
        change = row.attrs["class"]
        assert old_marker == ("− removed" if change in ("diff-removed", "diff-changed") else "")
        assert new_marker == ("+ added" if change in ("diff-added", "diff-changed") else "")
        if old_marker:
            assert "diff-del" in cells[2].attrs["class"]
        if new_marker:
            assert "diff-add" in cells[5].attrs["class"]
    texts = {(row.all("td")[2].text(), row.all("td")[5].text()) for row in rows}
    assert ("version: 1.0.0", "version: 1.1.0") in texts
    assert any(old == "" and new == "description: now with a description" for old, new in texts)
    assert any(old == "- id: gone" and new == "" for old, new in texts)
    assert "line(s) differ" in doc.text()
    default = page(bot, "/ui/runbooks/demo/diff").one("h1").text()
    assert default == "demo: 1.0.0 → 1.1.0"  # the latest against the one before


def test_unknown_runbooks_and_versions(bot: Service) -> None:
    missing = page(bot, "/ui/runbooks/demo/diff?from=0.9.0&to=1.1.0", status=404)
    assert "demo 0.9.0 has never been seen (known versions: 1.0.0, 1.1.0)" in missing.text()
    page(bot, "/ui/runbooks/nosuch", status=404)
    page(bot, "/ui/runbooks/nosuch/diff", status=404)
    page(bot, "/ui/runbooks/Bad_Name", status=400)
    page(bot, "/ui/runbooks/demo/diff?from=" + "9" * 500, status=404)


def test_files_that_do_not_load_are_said_not_a_500(make_bot: BotFactory,
                                                   sqlite_url: str) -> None:
    make_bot({"demo": V1}, sqlite_url, **overrides()).runbooks()
    changed = {**V1, "summary": "same version, other text"}
    bot = make_bot({"demo": changed}, sqlite_url, **overrides())
    doc = page(bot, "/ui/runbooks")
    assert "Bump the version when you change a runbook" in doc.one("div", "problem").text()
    assert doc.one("table").rows()[0][0] == "demo"
    assert "1.0.0" in page(bot, "/ui/runbooks/demo").one("table").text()


def test_side_by_side_rows() -> None:
    old = "name: demo\nversion: 1.0.0\nrisk: low\nsteps: []\n"
    new = "name: demo\nversion: 1.1.0\ndescription: new\nrisk: medium\nsteps: []\nend\n"
    rows = sidebyside.rows(old, new)
    assert [(r.old_number, r.old, r.new_number, r.new, r.change) for r in rows] == [
        (1, "name: demo", 1, "name: demo", "same"),
        (2, "version: 1.0.0", 2, "version: 1.1.0", "changed"),
        (None, "", 3, "description: new", "added"),
        (3, "risk: low", 4, "risk: medium", "changed"),
        (4, "steps: []", 5, "steps: []", "same"),
        (None, "", 6, "end", "added")]
    assert [(r.old_marker, r.new_marker) for r in rows][1:3] == [("−", "+"), ("", "+")]
    assert sidebyside.rows("x\n", "") == [sidebyside.Row(1, "x", None, "", "removed")]
    unlike = sidebyside.rows("alpha\n", "omega\n")  # nothing alike: no pairing
    assert [r.change for r in unlike] == ["removed", "added"]
