"""The contract between the engine and every action an adapter provides (``Action``, its
context and result) and the base classes adapters build their actions on.

It lives in ``adapters`` because adapters implement it and must never import ``bot``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from kit.durations import parse_duration

# A duration argument, in kit.durations' grammar: seconds, or text like "90s", "30m", "1h30m".
Seconds = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]


# ``takes_out = (WHOLE_POOL,)``: the action takes nodes of a whole pool out, as its
# operator chooses (the GPU Operator's driver upgrade), not nodes named in its arguments.
WHOLE_POOL = "*"


def takes_out(action: Any) -> tuple[str, ...]:
    """The arguments of ``action`` (an Action or its class) that name the nodes it takes out
    of service; () for one that takes nothing out."""
    return tuple(getattr(action, "takes_out", ()))


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

    ``status`` publishes a structured state of a long step (a fleet drain's node states, a
    JSON-able mapping): the engine keeps the latest on the step for the chat message and
    ``runbook status``; call it when the state changes, not per pod.

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
    status: Callable[[Mapping[str, Any]], None] = lambda data: None
    # True once someone asked to cancel the execution (read by the engine's watcher)
    cancelled: Callable[[], bool] = lambda: False
    stop: threading.Event = field(default_factory=threading.Event)
    stop_reason: str = ""
    # set by the engine from the plan's capacity guard: raises ActionError, with the guard's
    # verdict, when taking these nodes (the bot's names) out now would leave a pool under
    # its floor. An action that takes nodes out in batches calls guard_capacity before each.
    capacity_guard: Callable[[Sequence[str]], str] | None = None
    # the details of an earlier step of this execution that succeeded, by step id (None when
    # it did not run or did not succeed): swap-gpu's check reads the GPU's identity before
    earlier: Callable[[str], Mapping[str, Any] | None] = lambda step_id: None

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

    def guard_capacity(self, nodes: Sequence[str]) -> None:
        """Before taking ``nodes`` out: ActionError when the capacity guard says no (its
        verdict as the message); the verdict is published as progress when it says yes.
        Nothing is checked when the engine set no guard (a runbook without one)."""
        if self.capacity_guard is not None:
            self.progress(f"capacity guard: {self.capacity_guard(nodes)}")

    def pause(self, seconds: float) -> float:
        """How long to sleep before the next poll: ``seconds``, capped at MAX_PAUSE and at
        the deadline (never negative)."""
        return max(0.0, min(seconds, MAX_PAUSE, self.remaining()))


class Action(Protocol):
    """One operation of an external system, as the engine sees it.

    An action is registered under a dotted name (``slurm.drain``, ``host.run``). The engine
    knows nothing about Slurm or Kubernetes: it validates a step's ``with:`` mapping against
    ``Arguments``, asks ``plan()`` for the concrete operations an on-call engineer will
    recognise (``scontrol update NodeName=gpu07 State=DRAIN Reason="XID 79"``), and later
    calls ``run()``. ``run()`` reads the current state first, so running a step twice (after
    a crash between "started" and "finished") equals running it once.
    """

    name: ClassVar[str]
    Arguments: ClassVar[type[StrictArguments]]
    # Actions are idempotent unless they say otherwise (class attribute ``idempotent =
    # False``): the engine never re-runs such a step blindly after a crash in it.
    # An action that takes GPUs out of service (a drain, a cordon, a reservation that keeps
    # jobs off, a reboot, a driver or MIG change) says so with ``takes_out``: the names of
    # its arguments that hold those nodes, or WHOLE_POOL for one that acts on a whole pool
    # (the GPU Operator's driver). A runbook step that calls one must be covered by a
    # capacity guard (bot.runbooks.loading, bot.execution.planning).

    def plan(self, args: Any) -> list[str]:
        """The concrete operations ``run`` would perform, one line each; no side effects."""
        ...

    def run(self, args: Any, ctx: ActionContext) -> ActionResult:
        """Perform the operations; idempotent; raise ActionError on failure."""
        ...


BackendT = TypeVar("BackendT")
ConfigT = TypeVar("ConfigT")


class ActionBase(Generic[BackendT, ConfigT]):
    """Base of an adapter's action classes: one backend, one configuration, and the sleep
    its waits poll with (tests pass one that does not sleep)."""

    name: ClassVar[str]
    Arguments: ClassVar[type[StrictArguments]]

    def __init__(self, backend: BackendT, config: ConfigT,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.backend = backend
        self.config = config
        self._sleep = sleep

    def plan(self, args: Any) -> list[str]:
        raise NotImplementedError

    def run(self, args: Any, ctx: ActionContext) -> ActionResult:
        raise NotImplementedError


class ActionSet(Generic[BackendT, ConfigT]):
    """Every action of one adapter over one backend: an adapter declares its set once,

        class SlurmActions(ActionSet[SlurmBackend, SlurmConfig]):
            action_classes = ACTION_CLASSES
            default_config = SlurmConfig  # optional: SlurmActions(backend) then works

    and the engine takes ``SlurmActions(backend, config).all()``.
    """

    action_classes: ClassVar[tuple[type[ActionBase[Any, Any]], ...]]
    default_config: ClassVar[type[Any] | None] = None

    def __init__(self, backend: BackendT, config: ConfigT | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if config is None:
            if self.default_config is None:
                raise TypeError(f"{type(self).__name__} needs a configuration")
            config = self.default_config()
        self.backend = backend
        self.config: ConfigT = config
        self._sleep = sleep

    def all(self) -> list[Action]:
        return [cls(self.backend, self.config, self._sleep) for cls in self.action_classes]

    def by_name(self) -> dict[str, Action]:
        return {action.name: action for action in self.all()}


class ConnectingActionSet(ActionSet[BackendT, ConfigT]):
    """An ActionSet that builds its own backend from the configuration unless handed one:

        class PrometheusActions(ConnectingActionSet[PrometheusBackend, PrometheusConfig]):
            action_classes = ACTION_CLASSES
            backend_class = PrometheusApiBackend

    and ``PrometheusActions(config).all()`` (tests: ``PrometheusActions(config, fake)``).
    """

    backend_class: ClassVar[type[Any]]

    def __init__(self, config: ConfigT, backend: BackendT | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(backend if backend is not None else self.backend_class(config),
                         config, sleep)
