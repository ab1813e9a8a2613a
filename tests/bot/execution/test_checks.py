"""``Checks.evaluate``: a check that waits (``within``, ``for``) looks at ``stopping`` at
least every second, still evaluates only every ``poll_seconds``, and a stop is a failure
the engine can tell from a failing check (safety invariant 5)."""

from __future__ import annotations

from typing import Any

import pytest

from bot.execution.checks import core
from bot.execution.checks.core import Checks, Outcome
from bot.execution.planning import PlannedCheck


class Counting:
    """An evaluator that always answers ``passed`` and counts its calls."""

    def __init__(self, passed: bool) -> None:
        self.passed = passed
        self.calls = 0

    def __call__(self, check: PlannedCheck, deadline: float) -> Outcome:
        self.calls += 1
        return Outcome(self.passed, 3, f"value 3 (call {self.calls})", {"series": 1})


def check(within: float = 0.0, hold: float = 0.0) -> PlannedCheck:
    return PlannedCheck(name="c", kind="fake", spec={}, expect="== 0", for_seconds=hold,
                        within_seconds=within, timeout_seconds=10)


class Clock:
    """The checks' clock, set by the test: ``sleep`` moves it on and keeps each pause."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


ASKED = 0.2  # when, on the test's clock, the stop is asked for


def evaluate_with_stop(evaluator: Counting, planned: PlannedCheck,
                       monkeypatch: pytest.MonkeyPatch) -> tuple[Outcome, float, Clock]:
    """Evaluate with a stop asked ``ASKED`` seconds in; the outcome, and how long after the
    stop was asked the evaluation returned (both on the test's clock)."""
    clock = Clock()
    monkeypatch.setattr(core, "time", clock)
    outcome = Checks({"fake": evaluator}, sleep=clock.sleep).evaluate(
        planned, poll_seconds=30, stopping=lambda: clock.now >= ASKED)
    return outcome, clock.now - ASKED, clock


def test_within_stops_within_a_second_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    evaluator = Counting(passed=False)
    outcome, took, clock = evaluate_with_stop(evaluator, check(within=3600), monkeypatch)
    assert 0 <= took <= 1.0 and max(clock.pauses) <= 1.0
    assert not outcome.passed and outcome.stopped and outcome.extra["stopped"] is True
    assert outcome.detail.startswith("stopped: ") and "while waiting up to 1h" in outcome.detail
    assert "value 3 (call 1)" in outcome.detail and outcome.extra["series"] == 1
    assert evaluator.calls == 1  # evaluated at poll_seconds, not at every look at stopping


def test_for_stops_within_a_second_and_never_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    evaluator = Counting(passed=True)
    outcome, took, clock = evaluate_with_stop(evaluator, check(hold=3600), monkeypatch)
    assert 0 <= took <= 1.0 and max(clock.pauses) <= 1.0
    assert not outcome.passed and outcome.stopped
    assert "while checking it holds for 1h" in outcome.detail
    assert evaluator.calls == 1


def test_pauses_are_sliced_but_polls_keep_their_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(core, "time", clock)
    evaluator = Counting(passed=False)
    outcome = Checks({"fake": evaluator}, sleep=clock.sleep).evaluate(check(within=2.5),
                                                                     poll_seconds=2.0)
    assert not outcome.passed and not outcome.stopped
    assert outcome.detail.startswith("not within 2.5s: value 3 (call 3)")
    assert max(clock.pauses) <= 1.0
    assert evaluator.calls == 3  # at 0, 2 and 2.5 seconds
    assert clock.now == 2.5


def test_without_stopping_a_failing_check_is_not_marked_stopped() -> None:
    outcome = Checks({"fake": Counting(passed=False)}).evaluate(check())
    assert not outcome.passed and not outcome.stopped and "stopped" not in outcome.extra


def test_a_stop_does_not_cut_a_check_that_needs_no_wait() -> None:
    outcome: Any = Checks({"fake": Counting(passed=True)}).evaluate(
        check(), stopping=lambda: True)
    assert outcome.passed and not outcome.stopped
