"""The engine: drives an execution from approval to its end, surviving its own death.

One execution at a time per call to ``drive``. An engine claims an execution by
writing its name and a lease into the row; a heartbeat thread renews the lease
(and the execution's locks) while it works. When an engine dies, its lease runs
out and any other engine (``runbook engine``, another replica, a new ``run
--wait``) claims the execution and resumes it: stages and steps already
finished are not run again, an interrupted step is run again (actions are
idempotent), and a ``resume: manual`` runbook is held for a person instead.

Every state change and step is written before and after it happens, together
with its audit event.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import and_, or_, select, update

from adapters.actions import ActionContext, ActionError, ActionResult, ActionTimeout
from bot import audit, executions, locking
from bot.checks import Outcome
from bot.executions import ACTIVE, Execution
from bot.planning import PlanError, PlannedCall, PlannedCheck, PlannedStep
from bot.service import Bot, Refused, expire_if_due
from bot.store.schema import executions as executions_table

ENGINE = "engine"  # the audit actor for what the engine does on its own


class Reporter(Protocol):
    def __call__(self, execution_id: int, line: str) -> None: ...


def silent(execution_id: int, line: str) -> None:
    """A reporter that reports nothing (the audit log still has everything)."""


class _Stop(Exception):
    """This engine must stop driving the execution (lease or locks lost)."""


@dataclass
class Engine:
    bot: Bot
    report: Reporter = silent
    owner: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
    )
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        self._driving: set[int] = set()
        self._lost: set[int] = set()
        self._guard = threading.Lock()
        self._beat = threading.Event()
        self._heart: threading.Thread | None = None
        self._handing_over = threading.Event()  # stop at the next boundary (run_pending)

    # --- claiming and the heartbeat ------------------------------------------------

    @property
    def _lease(self) -> float:
        return self.bot.config.engine.lease_seconds

    def claim(self, execution_id: int) -> tuple[bool, str | None]:
        """Take the execution unless another live engine has it; returns (claimed, last owner)."""
        now = time.time()
        with self.bot.engine.begin() as conn:
            previous = conn.execute(
                select(executions_table.c.owner).where(executions_table.c.id == execution_id)
            ).scalar()
            claimed = conn.execute(
                update(executions_table)
                .where(
                    executions_table.c.id == execution_id,
                    executions_table.c.state.in_(sorted(ACTIVE)),
                    or_(
                        executions_table.c.owner.is_(None),
                        executions_table.c.owner == self.owner,
                        executions_table.c.lease_until < now,
                    ),
                )
                .values(owner=self.owner, lease_until=now + self._lease)
            ).rowcount
        if claimed:
            with self._guard:
                self._driving.add(execution_id)
                self._lost.discard(execution_id)
            self._start_heart()
        return bool(claimed), previous

    def _let_go(self, execution_id: int) -> None:
        with self._guard:
            self._driving.discard(execution_id)
        with self.bot.engine.begin() as conn:
            conn.execute(
                update(executions_table)
                .where(executions_table.c.id == execution_id,
                       executions_table.c.owner == self.owner)
                .values(owner=None, lease_until=None)
            )

    def _start_heart(self) -> None:
        if self._heart is None or not self._heart.is_alive():
            self._heart = threading.Thread(target=self._heartbeat, name="lease", daemon=True)
            self._heart.start()

    def _heartbeat(self) -> None:
        while not self._beat.wait(self._lease / 3):
            with self._guard:
                ids = sorted(self._driving)
            if ids:
                self.renew(ids)

    def renew(self, ids: list[int]) -> None:
        now = time.time()
        lock_until = now + self.bot.config.engine.lock_ttl_seconds
        with self.bot.engine.begin() as conn:
            for execution_id in ids:
                renewed = conn.execute(
                    update(executions_table)
                    .where(executions_table.c.id == execution_id,
                           executions_table.c.owner == self.owner)
                    .values(lease_until=now + self._lease)
                ).rowcount
                if renewed:
                    locking.renew(conn, execution_id, lock_until)
                else:
                    with self._guard:
                        self._lost.add(execution_id)

    def close(self) -> None:
        self._beat.set()

    # --- driving -------------------------------------------------------------------

    def drive(self, execution_id: int, *, wait_for_approval: bool = True) -> Execution:
        """Drive the execution as far as it can go; returns it as it stands afterwards."""
        claimed, previous = self.claim(execution_id)
        if not claimed:
            return self._load(execution_id)
        try:
            self._drive(execution_id, previous, wait_for_approval)
        except _Stop as exc:
            self.report(execution_id, f"stopped driving: {exc}")
        finally:
            self._let_go(execution_id)
        return self._load(execution_id)

    def _load(self, execution_id: int) -> Execution:
        with self.bot.engine.connect() as conn:
            return executions.get(conn, execution_id)

    def _drive(self, execution_id: int, previous: str | None, wait: bool) -> None:
        ex = self._load(execution_id)
        if ex.state in ("running", "undoing") and not self._resumed(ex, previous):
            return
        while True:
            ex = self._load(execution_id)
            if ex.state == "awaiting_approval":
                with self.bot.engine.begin() as conn:
                    if expire_if_due(conn, ex):
                        self.report(ex.id, "expired: no approval before the deadline")
                        return
                if not wait:
                    return
                self.sleep(self.bot.config.engine.poll_seconds)
            elif ex.state == "approved":
                self._start(ex)
            elif ex.state in ("running", "undoing"):
                self._run(ex)
                return
            else:
                return

    def _resumed(self, ex: Execution, previous: str | None) -> bool:
        """Record a takeover; hold a manual-resume runbook. True when driving may go on."""
        with self.bot.engine.begin() as conn:
            if ex.resume_requested:
                executions.set_fields(conn, ex.id, resume_requested=False)
                audit.append(conn, "resumed", ENGINE, {"stage": ex.stage, "by": "request"}, ex.id)
                self.report(ex.id, f"resumed at stage {ex.stage}")
                return True
            if ex.resume == "manual" and ex.state == "running":
                executions.set_fields(conn, ex.id, state="held", owner=None, lease_until=None)
                audit.append(conn, "held", ENGINE, {
                    "stage": ex.stage, "previous_engine": previous,
                    "why": "the engine driving it stopped; the runbook says resume: manual",
                }, ex.id)
                self.report(ex.id, f"held for a person (resume: manual): "
                                   f"`runbook resume {ex.id}` or `runbook cancel {ex.id}`")
                return False
            audit.append(conn, "resumed", ENGINE, {
                "stage": ex.stage, "previous_engine": previous}, ex.id)
        self.report(ex.id, f"resuming after engine {previous} stopped (stage {ex.stage})")
        return True

    def _start(self, ex: Execution) -> None:
        """Plan again; run only when the plan is the one that was approved."""
        try:
            given = {k: _text(v) for k, v in ex.params.items() if v is not None}
            plan = self.bot.plan(ex.runbook, given, break_glass=ex.plan.break_glass)
        except Refused as exc:
            with self.bot.engine.begin() as conn:
                executions.finish(conn, ex, "failed", ENGINE, f"cannot plan again: {exc}")
            self.report(ex.id, f"failed: cannot plan again: {exc}")
            return
        with self.bot.engine.begin() as conn:
            if plan.hash != ex.plan_hash and ex.approvals_required > 0:
                deadline = time.time() + plan.approval.expires_seconds
                executions.set_fields(conn, ex.id, state="awaiting_approval", plan=plan.to_json(),
                                      plan_hash=plan.hash, approval_deadline=deadline,
                                      version=plan.version, content_hash=plan.content_hash)
                audit.append(conn, "approval_voided", ENGINE, {
                    "approved_plan_hash": ex.plan_hash, "new_plan_hash": plan.hash,
                    "why": "the plan changed since it was approved; approve the new plan",
                }, ex.id)
                self.report(ex.id, "the plan changed since it was approved: approval voided, "
                                   "asking again")
                return
            approvers = executions.approvals_for(conn, ex.id, ex.plan_hash)
            executions.set_fields(conn, ex.id, state="running", stage="pre_checks",
                                  plan=plan.to_json(), plan_hash=plan.hash)
            audit.append(conn, "started", ENGINE, {
                "plan_hash": plan.hash, "approved_by": approvers, "engine": self.owner,
            }, ex.id)
        self.report(ex.id, f"started {ex.runbook} {ex.version}")

    # --- stages --------------------------------------------------------------------

    def _run(self, ex: Execution) -> None:
        if ex.state == "undoing" or ex.stage == "undo":
            self._undo(ex, "cancelled" if ex.cancel_requested else "failed", ex.error or "")
            return
        stage = ex.stage
        if stage == "pre_checks":
            failed = self._checks(ex, ex.plan.pre_checks, "pre-check")
            if failed:
                self._end(ex, "failed", f"{failed}; nothing was run")
                return
            stage = self._stage(ex, "steps")
        if stage == "steps":
            failure = self._steps(ex)
            if failure is not None:
                self._fail(ex, failure)
                return
            stage = self._stage(ex, "post_checks")
        if stage == "post_checks":
            failed = self._checks(ex, ex.plan.post_checks, "post-check")
            if failed:
                self._fail(ex, failed)
                return
        self._end(ex, "succeeded", None)

    def _stage(self, ex: Execution, stage: str) -> str:
        with self.bot.engine.begin() as conn:
            executions.set_fields(conn, ex.id, stage=stage)
        return stage

    def _checks(self, ex: Execution, checks: list[PlannedCheck], label: str) -> str | None:
        for check in checks:
            self._boundary(ex)
            if check.skipped:
                with self.bot.engine.begin() as conn:
                    audit.append(conn, "check_skipped", ENGINE,
                                 {"stage": label, "check": check.name, "why": "when is false"},
                                 ex.id)
                continue
            outcome = self._evaluate(check)
            if not outcome.passed and check.kind == "capacity" and ex.plan.break_glass:
                outcome = Outcome(True, outcome.value,
                                  f"overridden by break-glass: {outcome.detail}", outcome.extra)
            with self.bot.engine.begin() as conn:
                audit.append(conn, "check_evaluated", ENGINE, {
                    "stage": label, "check": check.name, "kind": check.kind, "spec": check.spec,
                    "expect": check.expect, "value": outcome.value, "passed": outcome.passed,
                    "detail": outcome.detail,
                }, ex.id)
            verdict = "passed" if outcome.passed else "FAILED"
            self.report(ex.id, f"{label} {check.name}: {verdict} ({outcome.detail})")
            if not outcome.passed:
                return f"{label} {check.name!r} failed: {outcome.detail}"
        return None

    def _evaluate(self, check: PlannedCheck) -> Outcome:
        try:
            return self.bot.checks.evaluate(check)
        except Exception as exc:  # an evaluator bug must fail the check, never pass it
            return Outcome(False, None, f"{type(exc).__name__}: {exc}")

    def _steps(self, ex: Execution) -> str | None:
        states = self._states(ex)
        for position, step in enumerate(ex.plan.steps):
            done = states.get(("do", step.id))
            if done is not None and done.state in ("succeeded", "skipped"):
                continue
            self._boundary(ex)
            if self._cancel_requested(ex):
                return "cancelled"
            if step.skipped:
                self._skip(ex, step, position)
                continue
            call = PlannedCall(step.action, step.args, step.operations)
            error = self._call(ex, step, call, "do", position, done.attempt if done else 0)
            if error is not None:
                # a step that stopped because of a cancel request ends as a cancel
                return "cancelled" if self._cancel_requested(ex) else (
                    f"step {step.id} failed: {error}")
        return None

    def _states(self, ex: Execution) -> dict[tuple[str, str], executions.StepState]:
        with self.bot.engine.connect() as conn:
            return executions.step_states_of(conn, ex.id)

    def _skip(self, ex: Execution, step: PlannedStep, position: int) -> None:
        with self.bot.engine.begin() as conn:
            executions.save_step(conn, ex.id, "do", step.id, position, state="skipped")
            audit.append(conn, "step_skipped", ENGINE, {"step": step.id, "why": "when is false"},
                         ex.id)
        self.report(ex.id, f"step {step.id}: skipped (when: false)")

    def _call(self, ex: Execution, step: PlannedStep, call: PlannedCall, phase: str,
              position: int, attempts_before: int) -> str | None:
        """Run one action with retries; returns the last error, or None on success."""
        label = step.id if phase == "do" else f"{step.id} (undo)"
        error = "not run"
        for attempt in range(attempts_before + 1, attempts_before + step.retries + 2):
            with self.bot.engine.begin() as conn:
                executions.save_step(conn, ex.id, phase, step.id, position, state="running",
                                     attempt=attempt, started_at=_now(), error=None)
                audit.append(conn, f"{'step' if phase == 'do' else 'undo'}_started", ENGINE, {
                    "step": step.id, "action": call.action, "args": call.args,
                    "operations": call.operations, "attempt": attempt,
                }, ex.id)
            self.report(ex.id, f"step {label}: running ({'; '.join(call.operations)})")
            try:
                result = self._invoke(ex, step, call)
            except Exception as exc:
                error = str(exc) if isinstance(exc, ActionError) else (
                    f"{type(exc).__name__}: {exc}")
                retry = attempt < attempts_before + step.retries + 1
                self._record(ex, step, phase, position, "failed", error=error, attempt=attempt,
                             retry=retry)
                self.report(ex.id, f"step {label}: failed: {error}"
                                   + (" (retrying)" if retry else ""))
                if retry:
                    self.sleep(step.retry_delay_seconds)
                    self._boundary(ex)
                continue
            self._record(ex, step, phase, position, "succeeded", result=result, attempt=attempt)
            self.report(ex.id, f"step {label}: done: {result.summary}")
            return None
        return error

    def _invoke(self, ex: Execution, step: PlannedStep, call: PlannedCall) -> ActionResult:
        action = self.bot.catalogue.get(call.action)
        args = action.Arguments.model_validate(call.args)
        timeout = step.timeout_seconds
        ctx = ActionContext(
            execution_id=ex.id, step_id=step.id, deadline=time.monotonic() + timeout,
            fencing_token=ex.fencing_token,
            progress=lambda line: self.report(ex.id, f"step {step.id}: {line}"),
            cancelled=lambda: self._cancel_requested(ex),
        )
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["result"] = action.run(args, ctx)
            except BaseException as exc:  # handed to the engine's thread below
                box["error"] = exc

        worker = threading.Thread(target=target, name=f"step-{step.id}", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            raise ActionTimeout(f"did not finish within {timeout:g}s (the step's timeout)")
        if "error" in box:
            raise box["error"]
        result = box["result"]
        assert isinstance(result, ActionResult)
        return result

    def _record(self, ex: Execution, step: PlannedStep, phase: str, position: int, state: str,
                *, attempt: int, result: ActionResult | None = None, error: str | None = None,
                retry: bool = False) -> None:
        kind = {"do": "step", "undo": "undo"}[phase] + (
            "_finished" if state == "succeeded" else "_failed")
        data: dict[str, Any] = {"step": step.id, "attempt": attempt, "state": state}
        if result is not None:
            data.update(summary=result.summary, details=dict(result.details),
                        changed=result.changed)
        if error is not None:
            data.update(error=error, will_retry=retry)
        with self.bot.engine.begin() as conn:
            executions.save_step(
                conn, ex.id, phase, step.id, position, state=state, finished_at=_now(),
                error=error, result=data if result is not None else None,
            )
            audit.append(conn, kind, ENGINE, data, ex.id)

    # --- endings -------------------------------------------------------------------

    def _fail(self, ex: Execution, reason: str) -> None:
        if reason == "cancelled":
            self._undo(ex, "cancelled", "cancelled on request")
        elif ex.plan.on_failure == "leave":
            self._end(ex, "failed", f"{reason}; completed steps left as they are "
                                    "(on_failure: leave)")
        else:
            self._undo(ex, "failed", reason)

    def _undo(self, ex: Execution, final: str, reason: str) -> None:
        with self.bot.engine.begin() as conn:
            executions.set_fields(conn, ex.id, state="undoing", stage="undo", error=reason)
            audit.append(conn, "undo_started", ENGINE, {"reason": reason}, ex.id)
        self.report(ex.id, f"undoing completed steps: {reason}")
        states = self._states(ex)
        undone: list[str] = []
        failed: list[str] = []
        for position in reversed(range(len(ex.plan.steps))):
            step = ex.plan.steps[position]
            done = states.get(("do", step.id))
            if step.undo is None or done is None:
                continue
            if not _needs_undo(step, done):
                if done.state == "succeeded":
                    self._note_unchanged(ex, step)
                continue
            previous = states.get(("undo", step.id))
            if previous is not None and previous.state == "succeeded":
                undone.append(step.id)
                continue
            self._boundary(ex, cancelling=True)
            error = self._call(ex, step, step.undo, "undo", position,
                               previous.attempt if previous else 0)
            (failed if error else undone).append(step.id if not error else f"{step.id}: {error}")
        summary = reason + (f"; undone: {', '.join(undone)}" if undone else "; nothing to undo")
        if failed:
            summary += f"; UNDO FAILED (needs a person): {'; '.join(failed)}"
        self._end(ex, final, summary)

    def _note_unchanged(self, ex: Execution, step: PlannedStep) -> None:
        with self.bot.engine.begin() as conn:
            audit.append(conn, "undo_skipped", ENGINE, {
                "step": step.id, "why": "the step found everything already done and changed "
                                        "nothing, so there is nothing of ours to undo"}, ex.id)
        self.report(ex.id, f"step {step.id} (undo): skipped, the step changed nothing")

    def _end(self, ex: Execution, state: str, error: str | None) -> None:
        with self.bot.engine.begin() as conn:
            executions.finish(conn, executions.get(conn, ex.id), state, ENGINE, error)
        self.report(ex.id, f"{state}" + (f": {error}" if error else ""))

    def _boundary(self, ex: Execution, cancelling: bool = False) -> None:
        """Between steps: stop if this engine lost the execution or its locks."""
        with self._guard:
            lost = ex.id in self._lost
        if lost:
            raise _Stop(f"execution {ex.id}: another engine took it over (lease lost)")
        if self._handing_over.is_set():
            raise _Stop(f"execution {ex.id}: this engine stopped (no longer the leader, or "
                        "shutting down); another engine resumes it here")
        with self.bot.engine.connect() as conn:
            holds = locking.holds(conn, ex.id, ex.fencing_token, len(ex.plan.locks))
        if not holds and not cancelling:
            raise _Stop(f"execution {ex.id} no longer holds its locks (fencing token "
                        f"{ex.fencing_token})")

    def _cancel_requested(self, ex: Execution) -> bool:
        with self.bot.engine.connect() as conn:
            flag = conn.execute(
                select(executions_table.c.cancel_requested)
                .where(executions_table.c.id == ex.id)
            ).scalar()
        return bool(flag)

    # --- the engine loop -----------------------------------------------------------------

    def runnable(self) -> list[tuple[int, str]]:
        """Active executions no live engine drives: (id, state)."""
        now = time.time()
        with self.bot.engine.connect() as conn:
            rows = conn.execute(
                select(executions_table.c.id, executions_table.c.state)
                .where(
                    executions_table.c.state.in_(sorted(ACTIVE)),
                    or_(executions_table.c.owner.is_(None),
                        and_(executions_table.c.lease_until < now)),
                )
                .order_by(executions_table.c.id)
            )
            return [(row.id, row.state) for row in rows]

    def run_pending(self, *, once: bool = False, stop: threading.Event | None = None,
                    hand_over: bool = False) -> None:
        """Drive runnable executions, each in its own thread (at most engine.max_parallel).

        Requests still waiting for approval are only checked for expiry here; they
        start once approved. With ``once``, return when nothing is left to run. With
        ``hand_over``, ``stop`` also stops the executions being driven at their next step
        boundary (a step under way finishes first) and lets them go for another engine
        (`runbook serve` losing the leadership); without it they are driven to their end.
        """
        stop = stop or threading.Event()
        workers: dict[int, threading.Thread] = {}
        limit = self.bot.config.engine.max_parallel
        while not stop.is_set():
            for execution_id, worker in list(workers.items()):
                if not worker.is_alive():
                    del workers[execution_id]
            for execution_id, state in self.runnable():
                if execution_id in workers:
                    continue
                if state == "awaiting_approval":
                    self.drive(execution_id, wait_for_approval=False)
                elif len(workers) < limit:
                    worker = threading.Thread(
                        target=self.drive, args=(execution_id,),
                        kwargs={"wait_for_approval": False}, name=f"execution-{execution_id}",
                        daemon=True,
                    )
                    worker.start()
                    workers[execution_id] = worker
            if once and not workers and not any(s != "awaiting_approval"
                                                for _, s in self.runnable()):
                return
            stop.wait(self.bot.config.engine.poll_seconds)
        if hand_over:
            self._handing_over.set()
        for worker in workers.values():
            worker.join()


def _needs_undo(step: PlannedStep, done: executions.StepState) -> bool:
    """Undo what this execution changed: succeeded steps that changed something, and failed
    steps marked undo_if_failed. A step that found everything already done changed nothing,
    so undoing it would undo someone else's work (resume a node another person drained)."""
    if done.state == "failed":
        return step.undo_if_failed
    if done.state != "succeeded":
        return False
    return bool((done.result or {}).get("changed", True))


def _now() -> str:
    from bot.store.db import now_iso

    return now_iso()


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


__all__ = ["Engine", "PlanError", "Reporter", "silent"]
