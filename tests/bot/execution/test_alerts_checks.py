"""``alerts`` checks (bot.execution.checks.monitoring) over the fake Alertmanager: a silenced
or inhibited alert is still firing and fails the check (the bot's own maintenance-window
silence must not hide a failing GPU), naming the silence by ID, creator and comment;
``include_silenced: false`` leaves them out; the option belongs to alerts checks only and
is in a plan (and its hash) only when given."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from adapters.actions import ActionError
from adapters.alertmanager.actions import BOT_AUTHOR
from adapters.alertmanager.backend import Alert, AlertmanagerUnavailable
from adapters.alertmanager.fake import FakeAlertmanager
from bot.execution.checks.core import Checks, Outcome
from bot.execution.checks.monitoring import MAX_COMMENT, AlertsEvaluator
from bot.execution.planning import PlannedCheck
from bot.runbooks.model import CheckSpec
from tests.conftest import BotFactory

WANTED = {"node": "gpu04", "severity": "critical"}
IGNORES = " (include_silenced: false ignores them)"


def alert(name: str, fingerprint: str, node: str = "gpu04", **status: Any) -> Alert:
    return Alert(labels={"alertname": name, "node": node, "severity": "critical"},
                 annotations={}, state="active", starts_at=datetime.now(UTC),
                 fingerprint=fingerprint, **status)


def evaluate(alertmanager: FakeAlertmanager, include_silenced: bool | None = None) -> Outcome:
    spec: dict[str, Any] = {"alerts": WANTED}
    if include_silenced is not None:
        spec["include_silenced"] = include_silenced
    check = PlannedCheck(name="no critical alert", kind="alerts", spec=spec, expect=None,
                         for_seconds=0, within_seconds=0, timeout_seconds=5)
    return Checks({"alerts": AlertsEvaluator(alertmanager)}, sleep=lambda s: None).evaluate(check)


def window_silence(alertmanager: FakeAlertmanager, comment: str) -> str:
    """The silence a maintenance window's open-window run makes (runbooks/open-window.yaml)."""
    return alertmanager.create_silence({"node": "gpu04|gpu05"}, None,
                                       datetime.now(UTC) + timedelta(hours=4), BOT_AUTHOR,
                                       comment, regex=["node"])


def test_an_alert_the_bots_own_window_silenced_still_fails_the_check_naming_the_silence(
) -> None:
    alertmanager = FakeAlertmanager()
    alertmanager.firing.append(alert("GpuXidFallenOffBus", "f1"))
    silence = window_silence(alertmanager, "maintenance window 7: firmware")
    outcome = evaluate(alertmanager)
    assert (outcome.passed, outcome.value) == (False, 1)
    assert outcome.detail == (
        "firing: GpuXidFallenOffBus; silenced, counted all the same: GpuXidFallenOffBus on "
        f'gpu04 by silence {silence} (gpu-runbook-bot: "maintenance window 7: firmware")'
        + IGNORES)
    (shown,) = outcome.extra["silences"]
    assert (shown["silence_id"], shown["created_by"], shown["comment"]) == (
        silence, BOT_AUTHOR, "maintenance window 7: firmware")


def test_include_silenced_false_leaves_silenced_and_inhibited_alerts_out() -> None:
    alertmanager = FakeAlertmanager()
    alertmanager.firing += [alert("GpuXidFallenOffBus", "f1"),
                            alert("GpuHot", "f2", inhibited_by=("f9",))]
    alertmanager.create_silence({"alertname": "GpuXidFallenOffBus"}, None,
                                datetime.now(UTC) + timedelta(hours=1), "alice", "known")
    outcome = evaluate(alertmanager, include_silenced=False)
    assert (outcome.passed, outcome.value, outcome.detail) == (
        True, 0, f"no alert firing for {WANTED} (silenced and inhibited alerts not counted)")
    alertmanager.firing.append(alert("GpuFellOff", "f3"))  # neither: it still counts
    outcome = evaluate(alertmanager, include_silenced=False)
    assert (outcome.passed, outcome.value, outcome.detail) == (False, 1, "firing: GpuFellOff")


def test_an_inhibited_alert_counts_naming_what_inhibits_it() -> None:
    alertmanager = FakeAlertmanager()
    alertmanager.firing += [
        alert("NodeDown", "f1"),
        alert("GpuXidFallenOffBus", "f2", inhibited_by=("f1",)),
        alert("GpuHot", "f3", inhibited_by=("f7",)),  # its inhibitor is not among them
    ]
    outcome = evaluate(alertmanager)
    assert (outcome.passed, outcome.value) == (False, 3)
    assert outcome.detail == (
        "firing: GpuHot, GpuXidFallenOffBus, NodeDown; inhibited, counted all the same: "
        "GpuXidFallenOffBus on gpu04 by NodeDown on gpu04, GpuHot on gpu04 by alert f7"
        + IGNORES)


def test_a_silence_that_cannot_be_read_still_fails_the_check_by_its_id() -> None:
    class Unreadable(FakeAlertmanager):
        def get_silence(self, silence_id: str) -> Any:
            if silence_id == "s1":
                raise AlertmanagerUnavailable("Alertmanager at http://am is not answering")
            return super().get_silence(silence_id)

    alertmanager = Unreadable()
    alertmanager.firing += [alert("GpuXidFallenOffBus", "f1"),
                            alert("GpuHot", "f2", silenced_by=("gone",))]
    window_silence(alertmanager, "x" * (MAX_COMMENT + 50))  # s1
    alertmanager.create_silence({"alertname": "GpuXidFallenOffBus"}, None,
                                datetime.now(UTC) + timedelta(hours=1), "alice", "x" * 150)
    outcome = evaluate(alertmanager)
    assert outcome.passed is False
    assert outcome.detail == (
        "firing: GpuHot, GpuXidFallenOffBus; silenced, counted all the same: "
        "GpuXidFallenOffBus on gpu04 by silence s1 (not readable: Alertmanager at http://am "
        f'is not answering), silence s2 (alice: "{"x" * MAX_COMMENT}..."), GpuHot on gpu04 by '
        "silence gone (not found), silence s1 (not readable: Alertmanager at http://am is not "
        "answering)" + IGNORES)
    assert [s["silence_id"] for s in outcome.extra["silences"]] == ["s1", "s2", "gone"]


def test_alertmanager_not_answering_fails_closed() -> None:
    class Down(FakeAlertmanager):
        def alerts(self, filters: Any = None, **flags: bool) -> list[Alert]:
            raise AlertmanagerUnavailable("Alertmanager at http://am is not answering")

    outcome = evaluate(Down())
    assert (outcome.passed, outcome.value, outcome.detail) == (
        False, None, "Alertmanager at http://am is not answering")
    assert isinstance(AlertmanagerUnavailable("x"), ActionError)


def test_include_silenced_belongs_to_alerts_checks() -> None:
    assert CheckSpec.model_validate({"name": "c", "alerts": WANTED,
                                     "include_silenced": False}).include_silenced is False
    with pytest.raises(ValidationError, match="include_silenced belongs to an alerts check"):
        CheckSpec.model_validate({"name": "c", "promql": "up", "expect": "== 1",
                                  "include_silenced": False})


def test_a_plan_carries_include_silenced_only_when_it_is_false(make_bot: BotFactory) -> None:
    def checked(name: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "version": "1.0.0", "summary": "s", "risk": "low",
                "params": {"node": {"type": "node", "required": True}},
                "pre_checks": [{"name": "no critical alert",
                                "alerts": {"node": "{{ node }}"}, **extra}],
                "steps": [{"id": "a", "action": "chat.notify", "with": {"message": "x"}}]}

    bot = make_bot({"default": checked("default"),
                    "counted": checked("counted", include_silenced=True),
                    "ignored": checked("ignored", include_silenced=False)})
    specs = {name: bot.plan(name, {"node": "gpu04"}).pre_checks[0].spec
             for name in ("default", "counted", "ignored")}
    assert specs == {"default": {"alerts": {"node": "gpu04"}},
                     "counted": {"alerts": {"node": "gpu04"}},
                     "ignored": {"alerts": {"node": "gpu04"}, "include_silenced": False}}
