"""Calling one step or undo of an execution (``Stepper``): its attempts and retries, the
action run in a worker thread and watched (a cancel, a lost claim, the timeout set its stop
flag), and its secret parameters unsealed only into the action's arguments and masked in all
that comes back before anything is stored.

It writes only under the engine's claim (``Claims.write``) and decides nothing about stages.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Connection, bindparam, select

from adapters.actions import (
    ActionContext,
    ActionError,
    ActionResult,
    ActionStopped,
    ActionTimeout,
)
from bot.execution import capacity_guard, executions
from bot.execution.checks.core import Checks
from bot.execution.claims import Claim, Claims, Stop, Store
from bot.execution.executions import Execution
from bot.execution.planning import PlannedCall, PlannedStep
from bot.runbooks.catalogue import Catalogue
from bot.runbooks.secrets import Unsealer
from bot.store.schema import executions as executions_table
from bot.store.words import Kind

WATCH_SECONDS = 0.5  # how often the engine looks at cancel, claim and timeout while a step runs


class StepParts(Store, Protocol):
    """What calling a step needs of the command service: the actions, the checks (a batch's
    capacity guard) and the execution's secret values."""

    @property
    def catalogue(self) -> Catalogue: ...

    @property
    def checks(self) -> Checks: ...

    def unsealer(self, ex: Execution) -> Unsealer: ...


class Reporter(Protocol):
    def __call__(self, execution_id: int, line: str) -> None: ...


def silent(execution_id: int, line: str) -> None:
    """A reporter that reports nothing (the audit log still has everything)."""


class Hold(Exception):
    """The execution must wait for a person; the message says why and what to do."""


# Between two attempts: (claim, execution, undoing) -> whether a cancel was asked; it raises
# Stop or Hold when the engine must not go on (Engine._boundary).
Boundary = Callable[[Claim, Execution, bool], bool]


@dataclass
class Stepper:
    """Calls the steps and undos of the executions one engine drives."""

    service: StepParts
    claims: Claims
    report: Reporter
    sleep: Callable[[float], None]
    boundary: Boundary

    def cancel_requested(self, ex: Execution) -> bool:
        with self.service.db.connect() as conn:
            return cancel_flag(conn, ex.id)

    def call(self, claim: Claim, ex: Execution, step: PlannedStep, call: PlannedCall,
             phase: str, position: int, attempts_before: int) -> str | None:
        """Run one action with retries; returns the last error, or None on success."""
        label = step.id if phase == "do" else f"{step.id} (undo)"
        error = "not run"
        last = attempts_before + step.retries + 1
        for attempt in range(attempts_before + 1, last + 1):
            with self.claims.write(claim) as conn:
                executions.save_step(conn, ex.id, phase, step.id, position, state="running",
                                     attempt=attempt, started_at=_now(), error=None)
                kind = Kind.STEP_STARTED if phase == "do" else Kind.UNDO_STARTED
                self.claims.event(conn, kind, {
                    "step": step.id, "action": call.action, "args": call.args,
                    "operations": call.operations, "attempt": attempt, "epoch": claim.epoch,
                }, ex.id)
            self.report(ex.id, f"step {label}: running ({'; '.join(call.operations)})")
            seal = Unsealer()  # the step's secret values, masked in all that comes back
            try:
                seal = self.service.unsealer(ex)
                result = _masked(seal, self._invoke(claim, ex, step, call, phase, seal))
            except (Stop, Hold):
                raise
            except Exception as exc:
                error = seal.mask_text(str(exc) if isinstance(exc, ActionError) else (
                    f"{type(exc).__name__}: {exc}"))
                stopped = isinstance(exc, ActionStopped) or (
                    phase == "do" and self.cancel_requested(ex))
                retry = attempt < last and not stopped
                self._record(claim, ex, step, phase, position, "failed", error=error,
                             attempt=attempt, retry=retry)
                self.report(ex.id, f"step {label}: failed: {error}"
                                   + (" (retrying)" if retry else ""))
                if not retry:
                    return error
                if self._pause(claim, ex, step.retry_delay_seconds, phase):
                    return error  # cancelled while waiting: no further attempt
                continue
            self._record(claim, ex, step, phase, position, "succeeded", result=result,
                         attempt=attempt)
            self.report(ex.id, f"step {label}: done: {result.summary}")
            return None
        return error

    def _pause(self, claim: Claim, ex: Execution, seconds: float, phase: str) -> bool:
        """Wait before a retry, but not past a cancel or a lost claim; True when a step (not
        an undo) was cancelled meanwhile, so that no further attempt starts. The wait is
        counted in ``sleep`` calls, not read off the clock: an engine given a fake ``sleep``
        does not spin (querying the cancel flag) until the real seconds have gone by."""
        left = seconds
        while left > 0:
            if claim.lost.is_set() or (phase == "do" and self.cancel_requested(ex)):
                break
            pause = min(left, WATCH_SECONDS)
            self.sleep(pause)
            left -= pause
        cancelled = self.boundary(claim, ex, phase == "undo")
        return cancelled and phase == "do"

    def _invoke(self, claim: Claim, ex: Execution, step: PlannedStep, call: PlannedCall,
                phase: str, seal: Unsealer) -> ActionResult:
        """Run the action in a worker thread and watch it: a cancel (of a step, not of an
        undo), a lost claim or the timeout set the action's stop flag; the engine goes on
        only once the action returned. Secret values reach only the action's arguments."""
        action = self.service.catalogue.get(call.action)
        args = action.Arguments.model_validate(seal.unseal(call.args))
        timeout = step.timeout_seconds
        ctx = ActionContext(
            execution_id=ex.id, step_id=step.id, deadline=time.monotonic() + timeout,
            fencing_token=ex.fencing_token,
            progress=lambda line: self.report(ex.id, seal.mask_text(f"step {step.id}: {line}")),
            status=lambda data: self._save_status(claim, ex, step, phase, seal.mask(data)),
            capacity_guard=capacity_guard.batch_guard(ex.plan, self.service.checks.evaluate),
            earlier=lambda step_id: self._earlier(ex.id, step_id),
        )
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["result"] = action.run(args, ctx)
            except BaseException as exc:  # handed to the engine's thread below
                box["error"] = exc

        # the action's own log lines name the execution (kit.logs): its context goes along
        worker = threading.Thread(target=contextvars.copy_context().run, args=(target,),
                                  name=f"step-{step.id}", daemon=True)
        claim.running[id(ctx)] = ctx
        try:
            worker.start()
            self._watch(claim, ex, ctx, worker, phase, timeout)
        finally:
            if not worker.is_alive():
                claim.running.pop(id(ctx), None)
        return _outcome(box, ctx, timeout)

    def _earlier(self, execution_id: int, step_id: str) -> Mapping[str, Any] | None:
        """The details an earlier step of the execution succeeded with (ActionContext.earlier),
        as recorded on its step row: also after a restart of the engine."""
        with self.service.db.connect() as conn:
            found = executions.step_states_of(conn, execution_id).get(("do", step_id))
        if found is None or found.state != "succeeded" or not found.result:
            return None
        details = found.result.get("details")
        return details if isinstance(details, Mapping) else None

    def _save_status(self, claim: Claim, ex: Execution, step: PlannedStep, phase: str,
                     data: Mapping[str, Any]) -> None:
        """A running step's structured state (``ActionContext.status``: a fleet drain's node
        states), kept on its step row for the chat message and ``runbook status``. A write
        that fails is dropped: the next one, or the step's end, says more."""
        position = next(i for i, s in enumerate(ex.plan.steps) if s.id == step.id)
        try:
            with self.claims.write(claim) as conn:
                executions.save_step(conn, ex.id, phase, step.id, position,
                                     result={"status": dict(data)})
        except Exception:  # a lost claim or a busy database: the watcher acts on it
            pass

    def _watch(self, claim: Claim, ex: Execution, ctx: ActionContext,
               worker: threading.Thread, phase: str, timeout: float) -> None:
        """Every ``WATCH_SECONDS`` while the action runs, set its stop flag on a lost claim,
        a cancel (of a step, not of an undo) or the step's timeout: a cancel reaches a
        running step within about a second. Undo starts only after the action returned; one
        that does not stop within ``engine.stop_grace_seconds`` leaves the execution held for
        a person (or let go, when the claim was lost), never undone beside it."""
        grace = self.service.config.engine.stop_grace_seconds
        asked: float | None = None
        while True:
            worker.join(WATCH_SECONDS)
            if not worker.is_alive():
                return
            self.claims.check_stale(claim)
            if claim.lost.is_set():
                ctx.request_stop(f"this engine lost the execution: {claim.reason}")
            elif phase == "do" and self.cancel_requested(ex):
                ctx.request_stop("the execution was cancelled")
            if time.monotonic() >= ctx.deadline:
                ctx.request_stop(f"the step's timeout ({timeout:g}s) passed")
            if ctx.stop.is_set() and asked is None:
                asked = time.monotonic()
            if asked is not None and time.monotonic() - asked > grace:
                if claim.lost.is_set():
                    raise Stop(f"execution {ex.id}: {claim.reason}; step {ctx.step_id} did "
                                f"not stop within {grace:g}s")
                raise Hold(f"step {ctx.step_id} was asked to stop ({ctx.stop_reason}) and did "
                            f"not within {grace:g}s: it may still be running. Nothing was "
                            f"undone. Check the systems it acts on, then `runbook resume "
                            f"{ex.id}` or `runbook cancel {ex.id}`")

    def _record(self, claim: Claim, ex: Execution, step: PlannedStep, phase: str,
                position: int, state: str, *, attempt: int, result: ActionResult | None = None,
                error: str | None = None, retry: bool = False) -> None:
        if phase == "do":
            kind = Kind.STEP_FINISHED if state == "succeeded" else Kind.STEP_FAILED
        else:
            kind = Kind.UNDO_FINISHED if state == "succeeded" else Kind.UNDO_FAILED
        data: dict[str, Any] = {"step": step.id, "attempt": attempt, "state": state}
        if result is not None:
            data.update(summary=result.summary, details=dict(result.details),
                        changed=result.changed)
        if error is not None:
            data.update(error=error, will_retry=retry)
        with self.claims.write(claim) as conn:
            # a failed step keeps the node states it published last (ActionContext.status)
            kept = {"result": data} if result is not None else {}
            executions.save_step(conn, ex.id, phase, step.id, position, state=state,
                                 finished_at=_now(), error=error, **kept)
            self.claims.event(conn, kind, data, ex.id)


# Built once: the engine reads it at every step (a statement built per call costs more than
# the query itself on SQLite).
_CANCEL_FLAG = select(executions_table.c.cancel_requested).where(
    executions_table.c.id == bindparam("id"))


def cancel_flag(conn: Connection, execution_id: int) -> bool:
    return bool(conn.execute(_CANCEL_FLAG, {"id": execution_id}).scalar())


def _outcome(box: dict[str, Any], ctx: ActionContext, timeout: float) -> ActionResult:
    """What the action's thread left: its result, or its error (a stop because the
    timeout passed is a timeout)."""
    if "error" in box:
        error = box["error"]
        if isinstance(error, ActionStopped) and "timeout" in ctx.stop_reason:
            raise ActionTimeout(f"did not finish within {timeout:g}s (the step's timeout): "
                                f"{error}")
        raise error
    result = box["result"]
    assert isinstance(result, ActionResult)
    return result


def _masked(seal: Unsealer, result: ActionResult) -> ActionResult:
    if not seal.values:
        return result
    return ActionResult(summary=seal.mask_text(result.summary),
                        details=seal.mask(dict(result.details)), changed=result.changed)


def _now() -> str:
    from bot.store.db import now_iso

    return now_iso()



__all__ = ["WATCH_SECONDS", "Boundary", "Hold", "Reporter", "StepParts", "Stepper",
           "cancel_flag", "silent"]
