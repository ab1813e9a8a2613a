"""The contract between the engine and every action an adapter provides.

An action is a small object registered under a dotted name (``slurm.drain``,
``host.run``). The engine knows nothing about Slurm or Kubernetes: it validates a
step's ``with:`` mapping against the action's ``Arguments`` model, asks the action
to ``plan()`` (the concrete operations an on-call engineer will recognise, e.g.
``scontrol update NodeName=gpu07 State=DRAIN Reason="XID 79"``) and later to
``run()``.

Actions must be idempotent: ``run()`` reads the current state first, so running a
step twice (after a crash between "started" and "finished") equals running it once.

This module lives in ``adapters`` because adapters implement it and must never
import ``bot``; the engine imports it from here.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Protocol

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*([smhd]))+\s*$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")


def _seconds(value: Any) -> Any:
    """Seconds as a number, or written like 90s, 30m, 2h, 1h30m, 1d."""
    if isinstance(value, str):
        stripped = value.strip()
        try:
            return float(stripped)
        except ValueError:
            pass
        if not _DURATION.match(stripped):
            raise ValueError(f"{value!r} is not a duration: give seconds or e.g. 90s, 30m, 2h")
        return sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(stripped))
    return value


# A duration argument: seconds, or text like "90s", "30m", "2h", "1h30m".
Seconds = Annotated[float, BeforeValidator(_seconds), Field(gt=0)]


class ActionError(Exception):
    """An action failed; the message is shown to people verbatim, so make it say what to do."""


class ActionTimeout(ActionError):
    """An action did not finish before its deadline."""


class ActionStopped(ActionError):
    """The engine asked the action to stop (a cancel, a lost claim, the step's timeout);
    the action stopped where it was, and the engine decides what comes next."""


# Waiting actions look at the stop flag at least this often (seconds): a cancel reaches a
# step that waits for a job or a person within about a second.
MAX_PAUSE = 1.0


class StrictArguments(BaseModel):
    """Base for every action's arguments: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class ActionResult:
    """What a step did: a one-line summary for people plus structured details for the audit log."""

    summary: str
    details: Mapping[str, Any] = field(default_factory=dict)
    changed: bool = True


@dataclass
class ActionContext:
    """What the engine hands an action at run time.

    ``deadline`` is a ``time.monotonic()`` value: long-running actions must pass the
    remaining time on to subprocesses and API calls. ``progress`` publishes a line
    to the requester (terminal, chat thread). ``fencing_token`` is the token of the
    execution's locks; adapters that support fencing pass it on.

    ``stop`` is set by the engine when the action must stop: a cancel, the engine lost
    its claim on the execution, or the step's timeout passed. An action that waits
    calls ``checkpoint`` and sleeps at most ``pause(...)`` seconds between polls, so it
    stops within about a second; it never needs to undo anything itself.
    """

    execution_id: int
    step_id: str
    deadline: float
    fencing_token: int = 0
    progress: Callable[[str], None] = lambda line: None
    # True once someone asked to cancel the execution (read by the engine's watcher)
    cancelled: Callable[[], bool] = lambda: False
    stop: threading.Event = field(default_factory=threading.Event)
    stop_reason: str = ""

    def remaining(self) -> float:
        """Seconds left before the deadline (never negative)."""
        return max(0.0, self.deadline - time.monotonic())

    def request_stop(self, reason: str) -> None:
        """The engine's side: ask the action to stop, saying why."""
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()

    def stopping(self) -> bool:
        if not self.stop.is_set() and self.cancelled():
            self.request_stop("the execution was cancelled")
        return self.stop.is_set()

    def checkpoint(self, what: str) -> None:
        """Between polls: ActionStopped when asked to stop, ActionTimeout past the deadline."""
        if self.stopping():
            raise ActionStopped(f"{self.step_id}: stopped while {what}: {self.stop_reason}")
        if time.monotonic() >= self.deadline:
            raise ActionTimeout(f"{self.step_id}: timed out while {what}")

    # the older name: every caller gets the stop check too
    check_deadline = checkpoint

    def pause(self, seconds: float) -> float:
        """How long to sleep before the next poll: ``seconds``, capped at MAX_PAUSE and at
        the deadline (never negative)."""
        return max(0.0, min(seconds, MAX_PAUSE, self.remaining()))


class Action(Protocol):
    """One operation of an external system, as the engine sees it."""

    name: ClassVar[str]
    Arguments: ClassVar[type[StrictArguments]]
    # Actions are idempotent unless they say otherwise (class attribute ``idempotent =
    # False``): the engine never re-runs such a step blindly after a crash in it.

    def plan(self, args: Any) -> list[str]:
        """The concrete operations ``run`` would perform, one line each; no side effects."""
        ...

    def run(self, args: Any, ctx: ActionContext) -> ActionResult:
        """Perform the operations; idempotent; raise ActionError on failure."""
        ...


class ActionBase:
    """Base of an adapter's action classes: the two methods every action has."""

    name: ClassVar[str]
    Arguments: ClassVar[type[StrictArguments]]

    def plan(self, args: Any) -> list[str]:
        raise NotImplementedError

    def run(self, args: Any, ctx: ActionContext) -> ActionResult:
        raise NotImplementedError


class ActionSet:
    """The actions of one adapter over one backend and configuration.

    Subclasses name their ``action_classes`` and set ``backend``, ``config`` and
    ``_sleep`` (what their actions poll with); each class is built as
    ``cls(backend, config, sleep)``.
    """

    action_classes: ClassVar[tuple[Any, ...]]
    backend: Any
    config: Any
    _sleep: Callable[[float], None]

    def all(self) -> list[Action]:
        return [cls(self.backend, self.config, self._sleep) for cls in self.action_classes]

    def by_name(self) -> dict[str, Action]:
        return {action.name: action for action in self.all()}

