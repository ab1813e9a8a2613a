"""Bounded waits for the engine's tests: a drive, or the engine loop, that does not end fails
the test with an AssertionError instead of hanging it. The bound is counted in the engine's
own turns (each reads the execution once), so a run that never ends (an approval not asked
for, a state not written) fails within a hundred turns, however loaded the machine; a
wall-clock deadline is the backstop for a wait inside one turn."""

from __future__ import annotations

import threading
from typing import Any

from bot.execution.claims import Stop
from bot.execution.engine import Engine
from bot.execution.executions import Execution

TURNS = 100  # reads of the execution by one engine; a drive of these tests needs under ten
DEADLINE = 30.0  # seconds; every drive of these tests ends within a few


class Bound:
    """Counts the engine's turns; ``over`` is set once the call ended or the turns ran out."""

    def __init__(self, engine: Engine, what: str, turns: int = TURNS) -> None:
        self.engine, self.what, self.turns = engine, what, turns
        self.over = threading.Event()
        self.overran = ""
        self.count = 0
        read = engine._load

        def counted(execution_id: int) -> Execution:
            self.count += 1
            if self.count > turns:
                self.overran = f"{what} went round more than {turns} turns without ending"
                self.over.set()
                raise AssertionError(self.overran)
            return read(execution_id)

        engine._load = counted  # type: ignore[method-assign]

    def call(self, call: Any, seconds: float, stop: threading.Event | None = None) -> Any:
        """Run ``call`` in a daemon thread; its value, or its exception raised here. Fails the
        test once the turns ran out or ``seconds`` passed, telling the engine to stop."""
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = call()
            except BaseException as exc:  # raised in the test's thread below
                box["error"] = exc
            finally:
                self.over.set()

        worker = threading.Thread(target=target, name=self.what, daemon=True)
        worker.start()
        ended = self.over.wait(seconds)
        if self.overran or not ended:
            halt(self.engine, stop)
            raise AssertionError(self.overran or f"{self.what} did not end within {seconds:g}s")
        worker.join()
        vars(self.engine).pop("_load", None)  # the engine's own again, for its next call
        if "error" in box:
            raise box["error"]
        return box.get("value")


def drive(engine: Engine, execution_id: int, *, seconds: float = DEADLINE,
          **kwargs: Any) -> Execution:
    """``engine.drive(execution_id, **kwargs)``, failing the test if it does not end."""
    bound = Bound(engine, f"driving execution {execution_id}")
    result = bound.call(lambda: engine.drive(execution_id, **kwargs), seconds)
    assert isinstance(result, Execution)
    return result


def run_pending_once(engine: Engine, *, seconds: float = DEADLINE) -> None:
    """``engine.run_pending(once=True)``, failing the test if the loop does not end (an
    execution it drives never does)."""
    stop = threading.Event()
    bound = Bound(engine, "the engine loop (once)")
    bound.call(lambda: engine.run_pending(once=True, stop=stop), seconds, stop)


def halt(engine: Engine, stop: threading.Event | None = None) -> None:
    """Tell an engine that overran to stop: at its next write (its claims are lost), step
    boundary (handing over), wait for approval (its sleep raises) or loop turn (``stop``)."""
    if stop is not None:
        stop.set()
    engine._handing_over.set()
    engine.sleep = _stopped
    for claim in engine.claims.held():
        claim.lose("the test's bound ran out")


def _stopped(seconds: float) -> None:
    raise Stop("the test's bound ran out")
