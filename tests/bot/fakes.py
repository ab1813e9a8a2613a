"""Actions for engine tests: they record what they did in a journal the test reads.

They follow the action contract (plan/run, idempotent run) so the engine is
exercised exactly as with real adapters.
"""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

from adapters.actions import ActionContext, ActionError, ActionResult, StrictArguments

JOURNAL: list[tuple[str, str]] = []  # (action, key) in the order they ran
STATE: dict[str, bool] = {}  # key -> "done", so running twice changes nothing the second time
FAILURES: dict[str, int] = {}  # key -> failures left
GATES: dict[str, threading.Event] = {}
STARTED: dict[str, threading.Event] = {}
EXITS: list[str] = []  # gate keys in the order their actions returned
_running = threading.Lock()
CONCURRENCY = {"now": 0, "max": 0}  # gate actions running at once (two engines, one step)


def reset() -> None:
    JOURNAL.clear()
    STATE.clear()
    FAILURES.clear()
    GATES.clear()
    STARTED.clear()
    EXITS.clear()
    CONCURRENCY.update(now=0, max=0)


class KeyArguments(StrictArguments):
    key: str


class RecordAction:
    """Sets STATE[key]; idempotent."""

    name: ClassVar[str] = "test.record"
    Arguments: ClassVar[type[StrictArguments]] = KeyArguments

    def plan(self, args: Any) -> list[str]:
        return [f"record {args.key}"]

    def run(self, args: Any, ctx: ActionContext) -> ActionResult:
        JOURNAL.append((self.name, args.key))
        changed = not STATE.get(args.key, False)
        STATE[args.key] = True
        return ActionResult(summary=f"recorded {args.key}", changed=changed)


class ForgetAction:
    """The undo of RecordAction."""

    name: ClassVar[str] = "test.forget"
    Arguments: ClassVar[type[StrictArguments]] = KeyArguments

    def plan(self, args: Any) -> list[str]:
        return [f"forget {args.key}"]

    def run(self, args: Any, ctx: ActionContext) -> ActionResult:
        JOURNAL.append((self.name, args.key))
        STATE[args.key] = False
        return ActionResult(summary=f"forgot {args.key}")


class FlakyAction:
    """Fails while FAILURES[key] > 0."""

    name: ClassVar[str] = "test.flaky"
    Arguments: ClassVar[type[StrictArguments]] = KeyArguments

    def plan(self, args: Any) -> list[str]:
        return [f"flaky {args.key}"]

    def run(self, args: Any, ctx: ActionContext) -> ActionResult:
        JOURNAL.append((self.name, args.key))
        if FAILURES.get(args.key, 0) > 0:
            FAILURES[args.key] -= 1
            raise ActionError(f"{args.key} failed on purpose")
        return ActionResult(summary=f"{args.key} worked")


class GateArguments(StrictArguments):
    key: str
    seconds: float = 10.0
    ignore_stop: bool = False  # a misbehaving action that never looks at its stop flag


class GateAction:
    """Blocks until GATES[key] is set (or ``seconds`` pass): for cancel and timeout tests."""

    name: ClassVar[str] = "test.gate"
    Arguments: ClassVar[type[StrictArguments]] = GateArguments

    def plan(self, args: Any) -> list[str]:
        return [f"wait at gate {args.key}"]

    def run(self, args: Any, ctx: ActionContext) -> ActionResult:
        JOURNAL.append((self.name, args.key))
        STARTED.setdefault(args.key, threading.Event()).set()
        gate = GATES.setdefault(args.key, threading.Event())
        until = time.monotonic() + args.seconds
        with _running:
            CONCURRENCY["now"] += 1
            CONCURRENCY["max"] = max(CONCURRENCY["max"], CONCURRENCY["now"])
        try:
            while not gate.is_set() and time.monotonic() < until:
                if not args.ignore_stop:
                    ctx.checkpoint(f"waiting at gate {args.key}")
                gate.wait(min(0.05, max(0.0, until - time.monotonic())))
        finally:
            with _running:
                CONCURRENCY["now"] -= 1
            EXITS.append(args.key)
        return ActionResult(summary=f"passed gate {args.key}")


def test_actions() -> list[Any]:
    return [RecordAction(), ForgetAction(), FlakyAction(), GateAction()]
