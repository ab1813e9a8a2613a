"""Pre- and post-checks: evaluate a planned check and say what was seen.

Checks fail closed: no data, an unreachable system or a kind this bot is not
configured for fails the check with the reason; it never passes it. A check
with ``for`` must hold at every poll for that long. A check that waits (``within``,
``for``) looks at the caller's ``stopping`` at least every second and, when asked to
stop, fails with ``stopped`` set (the engine tells that from a check that failed).
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from adapters.actions import MAX_PAUSE, ActionError
from adapters.host import HostCommand, run_check_command
from bot.execution.planning import PlannedCheck
from bot.runbooks.model import EXPECT
from kit.durations import format_duration, parse_duration

_OPS: dict[str, Callable[[float, float], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


STOPPED = "stopped: the execution was asked to stop (cancelled, or no longer driven here)"


@dataclass(frozen=True)
class Outcome:
    passed: bool
    value: Any
    detail: str
    extra: Mapping[str, Any] = field(default_factory=dict)
    # the check did not finish because the caller asked to stop (never passed); extra
    # carries {"stopped": True} too, for the audit log
    stopped: bool = False


def _never() -> bool:
    return False


class Evaluator(Protocol):
    def __call__(self, check: PlannedCheck, deadline: float) -> Outcome: ...


def compare(value: float, expect: str) -> bool:
    match = EXPECT.match(expect)
    if match is None:
        raise ValueError(f"bad expectation {expect!r}")
    return _OPS[match.group(1)](value, float(match.group(2)))


class CommandEvaluator:
    """``command:`` checks: an allow-listed host command whose exit code is the value."""

    def __init__(self, commands: Mapping[str, HostCommand]) -> None:
        self._commands = commands

    def __call__(self, check: PlannedCheck, deadline: float) -> Outcome:
        name = str(check.spec["command"])
        command = self._commands.get(name)
        if command is None:
            return Outcome(False, None, f'host command "{name}" is not allow-listed')
        try:
            code, output = run_check_command(
                command, max(0.1, min(command.timeout, deadline - time.monotonic()))
            )
        except ActionError as exc:
            return Outcome(False, None, str(exc))
        passed = compare(code, check.expect or "== 0")
        tail = output.strip().splitlines()[-1:] or [""]
        # name what ran: "Error: unhealthy cluster" alone does not say which system failed
        program = Path(command.argv[0]).name + (f": {command.description}"
                                                if command.description else "")
        return Outcome(passed, code, f"{name} ({program}) exit code {code} (expect "
                                     f"{check.expect}) {tail[0]}".strip(),
                       {"argv": command.argv, "output": output})


class FileEvaluator:
    """``file: {path, max_age}``: the file exists and is younger than max_age; value = age (s)."""

    def __call__(self, check: PlannedCheck, deadline: float) -> Outcome:
        spec = check.spec["file"]
        path = Path(str(spec.get("path", "")))
        try:
            limit = parse_duration(spec.get("max_age", "1d"))
        except ValueError as exc:
            return Outcome(False, None, f"max_age: {exc}")
        try:
            age = time.time() - path.stat().st_mtime
        except OSError as exc:
            return Outcome(False, None, f"{path}: {exc.strerror or exc}")
        if not path.is_file():
            return Outcome(False, None, f"{path} is not a file")
        return Outcome(age <= limit, round(age, 1),
                       f"{path} is {format_duration(age)} old (at most {format_duration(limit)})")


class Checks:
    """Evaluators by check kind; a kind with none configured fails closed."""

    def __init__(
        self, evaluators: Mapping[str, Evaluator], *, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self._evaluators = dict(evaluators)
        self._sleep = sleep

    def _pause(self, seconds: float, stopping: Callable[[], bool]) -> bool:
        """Sleep ``seconds`` in slices of at most MAX_PAUSE; False once ``stopping()``."""
        end = time.monotonic() + seconds
        while not stopping():
            left = end - time.monotonic()
            if left <= 0:
                return True
            self._sleep(min(left, MAX_PAUSE))
        return False

    @staticmethod
    def _stopped(outcome: Outcome, waiting: str) -> Outcome:
        return Outcome(False, outcome.value, f"{STOPPED} while {waiting}; last seen: "
                       f"{outcome.detail}", {**outcome.extra, "stopped": True}, stopped=True)

    def evaluate(self, check: PlannedCheck, poll_seconds: float = 2.0,
                 stopping: Callable[[], bool] = _never) -> Outcome:
        """One verdict: passes at once (or within ``within``), then holds ``for`` if asked.

        While waiting, ``stopping`` is looked at at least every second (the check is still
        evaluated every ``poll_seconds``); once it says so the verdict is a failure with
        ``stopped`` set."""
        evaluator = self._evaluators.get(check.kind)
        if evaluator is None:
            return Outcome(
                False, None, f"{check.kind} checks are not available in this configuration"
            )
        give_up = time.monotonic() + check.within_seconds
        deadline = give_up + check.for_seconds + check.timeout_seconds
        outcome = evaluator(check, deadline)
        while not outcome.passed and time.monotonic() < give_up:
            if not self._pause(min(poll_seconds, max(0.0, give_up - time.monotonic())),
                               stopping):
                return self._stopped(
                    outcome, f"waiting up to {format_duration(check.within_seconds)}")
            outcome = evaluator(check, deadline)
        if not outcome.passed:
            if check.within_seconds:
                return Outcome(False, outcome.value,
                               f"not within {format_duration(check.within_seconds)}: "
                               f"{outcome.detail}", outcome.extra)
            return outcome
        if check.for_seconds <= 0:
            return outcome
        held_until = time.monotonic() + check.for_seconds
        while time.monotonic() < held_until:
            if not self._pause(min(poll_seconds, max(0.0, held_until - time.monotonic())),
                               stopping):
                return self._stopped(
                    outcome, f"checking it holds for {format_duration(check.for_seconds)}")
            outcome = evaluator(check, deadline)
            if not outcome.passed:
                return Outcome(False, outcome.value, f"stopped holding: {outcome.detail}",
                               outcome.extra)
        return Outcome(True, outcome.value, f"held for {check.for_seconds:g}s: {outcome.detail}",
                       outcome.extra)
