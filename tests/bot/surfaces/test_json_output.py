"""``--json`` on every command that shows something: each prints one JSON document of the
shape docs/json-output.md gives (keys and their types checked here); and the human text
keeps durations readable (30m, not 1800s) and plans free of Python reprs."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.alerts import proposing
from bot.config import load_config
from bot.service import Service
from bot.store import db
from bot.surfaces import cli
from bot.surfaces.rendering import readable

NOTHING = type(None)
TEXT, NUMBER, OPT_TEXT = str, (int, float), (str, NOTHING)

# A stand-in open-window (a maintenance window plans one when it is created): the same
# parameters as the shipped one, a notification for its only step.
OPEN_WINDOW = {
    "name": "open-window", "version": "1.0.0", "summary": "json test", "risk": "low",
    "params": {"window": {"type": "int", "required": True},
               "nodes": {"type": "nodes", "required": True},
               "duration": {"type": "duration", "required": True},
               **{name: {"type": "text", "default": ""} for name in
                  ("reason", "slurm_nodes", "k8s_nodes", "alert_nodes")}},
    "steps": [{"id": "say", "action": "chat.notify", "with": {"message": "open"}}],
}


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The shipped selftest and a stand-in open-window; two nodes; an alert rule; the
    environment of the process set for in-process runs."""
    folder = tmp_path / "runbooks"
    folder.mkdir()
    shipped = Path(__file__).resolve().parents[3] / "runbooks" / "selftest.yaml"
    (folder / "selftest.yaml").write_text(shipped.read_text())
    (folder / "open-window.yaml").write_text(yaml.safe_dump(OPEN_WINDOW))
    (tmp_path / "bot.yaml").write_text(yaml.safe_dump({
        "database_url": f"sqlite:///{tmp_path / 'bot.db'}",
        "runbook_paths": [str(folder)],
        "inventory": {"nodes": ["gpu01", "gpu02"], "discover": False},
        "alert_rules": [{"match": {"alertname": "Test"}, "runbook": "selftest"}],
    }))
    db.connect(f"sqlite:///{tmp_path / 'bot.db'}").dispose()  # what `runbook db init` does
    saved = dict(os.environ)
    os.environ["RUNBOOK_CONFIG"] = str(tmp_path / "bot.yaml")
    try:
        yield dict(os.environ)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> Any:
    capsys.readouterr()
    assert cli.main(list(args)) == code
    return json.loads(capsys.readouterr().out)


def shape(value: Any, expected: dict[str, Any]) -> None:
    """Exactly these keys, each of these types."""
    assert isinstance(value, dict)
    assert sorted(value) == sorted(expected)
    for key, kind in expected.items():
        assert isinstance(value[key], kind), (key, value[key])


RUNBOOK = {"name": TEXT, "version": TEXT, "risk": TEXT, "summary": TEXT, "path": TEXT,
           "content_hash": TEXT}
EXECUTION = {"id": int, "runbook": TEXT, "version": TEXT, "state": TEXT, "stage": TEXT,
             "params": dict, "requested_by": TEXT, "requested_at": TEXT,
             "finished_at": OPT_TEXT, "error": OPT_TEXT, "approvals_required": int,
             "approved_by": list, "approval": TEXT, "break_glass": bool, "change": OPT_TEXT,
             "source": OPT_TEXT, "plan_hash": TEXT, "content_hash": TEXT, "node_states": dict}


def test_list_and_describe(env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    listed = run(capsys, "list", "--json")
    assert [item["name"] for item in listed] == ["open-window", "selftest"]
    for item in listed:
        shape(item, RUNBOOK)
    described = run(capsys, "describe", "selftest", "--json")
    shape(described, {**RUNBOOK, "description": TEXT, "params": dict, "approval": TEXT,
                      "steps": list, "resume": TEXT, "on_failure": TEXT})
    for step in described["steps"]:
        shape(step, {"id": TEXT, "action": TEXT, "description": TEXT, "undo": OPT_TEXT})
    for spec in described["params"].values():
        shape(spec, {"type": TEXT, "required": bool, "default": object, "description": TEXT,
                     "choices": (list, NOTHING), "weakens_guard": OPT_TEXT})


def test_validate(env: dict[str, str], capsys: pytest.CaptureFixture[str],
                  tmp_path: Path) -> None:
    good = run(capsys, "validate", "--json")
    shape(good, {"ok": bool, "runbooks": list, "problems": list})
    assert good["ok"] and len(good["runbooks"]) == 2
    (tmp_path / "bad.yaml").write_text("name: bad\nversion: 1\n")
    bad = run(capsys, "validate", str(tmp_path / "bad.yaml"), "--json", code=2)
    assert bad["ok"] is False and bad["runbooks"] == [] and bad["problems"]
    assert all(isinstance(p, str) and "bad.yaml" in p for p in bad["problems"])


def test_plan(env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    plan = run(capsys, "plan", "selftest", "--json")
    shape(plan, {"runbook": TEXT, "version": TEXT, "content_hash": TEXT, "risk": TEXT,
                 "params": dict, "locks": list, "approval": dict, "pre_checks": list,
                 "steps": list, "post_checks": list, "on_failure": TEXT, "break_glass": bool,
                 "outside_window": bool, "weakened_guards": list,
                 "propose_on_failure": (dict, NOTHING), "change": OPT_TEXT, "hash": TEXT,
                 "warnings": list, "capacity": list})
    shape(plan["approval"], {"required": int, "approvers": list, "self_approval": bool,
                             "expires_seconds": NUMBER})
    for step in plan["steps"]:
        assert {"id", "action", "args", "operations", "skipped", "undo",
                "timeout_seconds"} <= set(step)
        assert isinstance(step["operations"], list) and isinstance(step["args"], dict)


def test_status_show_history_and_versions(env: dict[str, str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "selftest", "--wait"]) == 0
    shape(run(capsys, "status", "1", "--json"), EXECUTION)
    shown = run(capsys, "show", "1", "--json")
    shape(shown, {"execution": dict, "events": list})
    shape(shown["execution"], EXECUTION)
    assert shown["execution"]["state"] == "succeeded"
    for event in shown["events"]:
        shape(event, {"seq": int, "ts": TEXT, "execution_id": int, "kind": TEXT,
                      "actor": TEXT, "data": dict, "prev_hash": TEXT, "hash": TEXT})
    history = run(capsys, "history", "--json")
    assert len(history) == 1
    shape(history[0], {"id": int, "runbook": TEXT, "version": TEXT, "state": TEXT,
                       "requested_by": TEXT, "requested_at": TEXT, "finished_at": OPT_TEXT,
                       "params": dict, "error": OPT_TEXT})
    versions = run(capsys, "versions", "selftest", "--json")
    assert len(versions) == 1
    shape(versions[0], {"name": TEXT, "version": TEXT, "content_hash": TEXT,
                        "first_seen": TEXT, "source": TEXT})


def test_proposals_and_breaker(env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    bot = Service.from_config(load_config())
    proposing.receive(bot, proposing.Webhook.model_validate({
        "version": "4", "status": "firing", "alerts": [{
            "status": "firing", "labels": {"alertname": "Test", "node": "gpu01"},
            "startsAt": "2026-12-01T00:00:00Z", "fingerprint": "abc"}]}))
    found = run(capsys, "proposals", "--json")
    assert len(found) == 1
    shape(found[0], {"id": int, "fingerprint": TEXT, "alertname": TEXT, "labels": dict,
                     "runbook": TEXT, "params": dict, "state": TEXT, "alert_status": TEXT,
                     "created_at": TEXT, "updated_at": TEXT, "execution_id": (int, NOTHING),
                     "note": OPT_TEXT, "alert_started_at": OPT_TEXT, "resolved_at": OPT_TEXT})
    shape(run(capsys, "breaker", "status", "--json"), {
        "tripped": bool, "event_seq": (int, NOTHING), "event_ts": OPT_TEXT,
        "event_actor": OPT_TEXT, "reason": OPT_TEXT, "held_out": dict, "pool_sizes": dict,
        "last_hour": list})


def test_schedules(env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["schedule", "add", "selftest", "cron=0 2 * * SAT"]) == 0
    listed = run(capsys, "schedule", "list", "--json")
    assert len(listed) == 1
    expected = {"id": int, "runbook": TEXT, "params": dict, "cron": OPT_TEXT, "at": OPT_TEXT,
                "timezone": TEXT, "approve": TEXT, "plan_hash": TEXT, "created_by": TEXT,
                "created_at": TEXT, "source": TEXT, "config_name": OPT_TEXT, "state": TEXT,
                "revision": int, "last_handled": OPT_TEXT, "last_outcome": OPT_TEXT,
                "last_execution_id": (int, NOTHING), "missed": int, "updated_at": TEXT,
                "when": TEXT, "next_fire": OPT_TEXT}
    shape(listed[0], expected)
    assert listed[0]["next_fire"].endswith("Z")
    shape(run(capsys, "schedule", "show", str(listed[0]["id"]), "--json"), expected)
    assert cli.main(["schedule", "pause", "1", "--json"]) == 2  # --json only shows


def test_windows(env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["window", "create", "gpu01", "start=2030-01-01 02:00",
                     "duration=4h"]) == 0
    listed = run(capsys, "window", "list", "--json")
    assert len(listed) == 1
    expected = {"id": int, "nodes": TEXT, "starts_at": TEXT, "duration_seconds": NUMBER,
                "reason": TEXT, "runbooks": list, "plans": list, "digest": TEXT,
                "created_by": TEXT, "created_at": TEXT, "state": TEXT,
                "open_execution_id": (int, NOTHING), "close_execution_id": (int, NOTHING),
                "runs": list, "report": OPT_TEXT, "updated_at": TEXT, "ends_at": TEXT}
    shape(listed[0], expected)
    assert listed[0]["duration_seconds"] == 4 * 3600
    shape(run(capsys, "window", "show", "1", "--json"), expected)


def test_plans_show_values_as_people_write_them() -> None:
    assert readable({"pool_of": "gpu07", "min_free_gpus_after": 8}) == (
        "pool_of=gpu07 min_free_gpus_after=8")
    assert readable(["gpu01", "gpu02"]) == "gpu01,gpu02"
    assert readable({"a": {"b": True}, "c": "x y"}) == 'a=(b=true) c="x y"'


def test_the_human_plan_says_30m_not_1800s(env: dict[str, str],
                                           capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    folder = tmp_path / "guarded"
    folder.mkdir()
    (folder / "guarded.yaml").write_text(yaml.safe_dump({
        "name": "guarded", "version": "1.0.0", "summary": "t", "risk": "medium",
        "approval": {"required": 1, "approvers": ["*"], "expires": "30m"},
        "pre_checks": [{"name": "a file", "file": {"path": "/etc/hostname",
                                                    "max_age": "1d"}}],
        "steps": [{"id": "say", "action": "chat.notify", "with": {"message": "hi"}}]}))
    config = yaml.safe_load(Path(env["RUNBOOK_CONFIG"]).read_text())
    Path(env["RUNBOOK_CONFIG"]).write_text(yaml.safe_dump({**config,
                                                           "runbook_paths": [str(folder)]}))
    capsys.readouterr()
    assert cli.main(["plan", "guarded"]) == 0
    text = capsys.readouterr().out
    assert "within 30m" in text and "1800s" not in text
    assert "file max_age=1d path=/etc/hostname" in text and "{'" not in text
