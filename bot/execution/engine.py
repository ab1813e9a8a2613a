"""The execution engine (``Engine``): the state machine that drives an approved execution to
its end, surviving its own death. Its claims, their fence and heartbeat are in
``claims``; calling one step or undo, watched, is in ``stepping``.

It acts on systems only through the actions and checks it is handed (``Parts``), writes
about an execution only under its claim, and never imports the command service or a surface.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import Connection, and_, or_, select

from bot.execution import executions, locking
from bot.execution.checks.core import Outcome
from bot.execution.claims import ENGINE, Claim, Claims, Stop
from bot.execution.executions import ACTIVE, Execution, expire_if_due
from bot.execution.planning import Plan, PlannedCall, PlannedCheck, PlannedStep
from bot.execution.stepping import (
    WATCH_SECONDS,
    Hold,
    Reporter,
    StepParts,
    Stepper,
    cancel_flag,
    silent,
)
from bot.store.schema import executions as executions_table
from bot.store.words import UNDER_WAY, Kind, State
from kit import logs
from kit.errors import Refused


class Parts(StepParts, Protocol):
    """What the engine needs of the command service (bot.service.Service): settings, the
    database, the actions, the checks, and a way to plan an execution again."""

    def replan(self, ex: Execution) -> Plan: ...

    def node_states(self, nodes: Sequence[str], execution_id: int) -> str: ...


@dataclass
class Engine:
    """The execution engine: drives approved executions through pre-checks, steps and
    post-checks to their end, undoing completed steps in reverse on a failure or a cancel.

    It owns its claims (``claims``), one per execution it drives: a claim writes ``owner``
    and a lease into the row and bumps its ``epoch``; every later write is one transaction
    fenced on that epoch (``Claims.write``), so an engine that lost its claim writes nothing
    more. A heartbeat renews the leases and the execution's locks; another engine takes over
    only once a lease ran out, and resumes from the persisted stage and step states
    (``_resumed``). It runs only a plan approved under its own policy (``_start``), and what
    it cannot safely decide is *held* for a person. Each step and undo is called, watched,
    by its ``stepper``. It reaches systems only through the actions and checks of ``Parts``
    (a ``Service``, which it never imports). A surface calls ``drive`` for one execution, or
    ``run_pending`` for the loop (``runbook engine``, the leader of ``runbook serve``);
    ``report`` gets its progress lines.
    """

    service: Parts  # the command service
    report: Reporter = silent
    owner: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
    )
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        self.claims = Claims(self.service, self.owner)
        self._handing_over = threading.Event()  # stop at the next boundary (run_pending)
        # report and sleep are looked up at each call: a test may swap the engine's own
        self.stepper = Stepper(self.service, self.claims,
                               report=lambda execution_id, line: self.report(execution_id, line),
                               sleep=lambda seconds: self.sleep(seconds),
                               boundary=self._boundary)

    def claim(self, execution_id: int) -> tuple[bool, str | None]:
        """Take the execution unless another live engine has it; returns (claimed, last owner)."""
        taken = self.claims.take(execution_id)
        return taken is not None, taken.previous_owner if taken else None

    def close(self) -> None:
        self.claims.close()

    # --- driving -------------------------------------------------------------------

    def drive(self, execution_id: int, *, wait_for_approval: bool = True) -> Execution:
        """Drive the execution as far as it can go; returns it as it stands afterwards.
        One execution per call; it does nothing when another live engine has it."""
        claim = self.claims.take(execution_id)
        if claim is None:
            return self._load(execution_id)
        try:
            with logs.execution(execution_id):  # the runbook too, once _drive has read it
                self._drive(claim, wait_for_approval)
        except Stop as exc:
            self.report(execution_id, f"stopped driving: {exc}")
        except Hold as exc:
            self._hold(claim, str(exc))
        finally:
            self.claims.let_go(claim)
        return self._load(execution_id)

    def _load(self, execution_id: int) -> Execution:
        with self.service.db.connect() as conn:
            return executions.get(conn, execution_id)

    def _drive(self, claim: Claim, wait: bool) -> None:
        ex = self._load(claim.execution_id)
        with logs.execution(ex.id, ex.runbook):
            self._drive_loaded(claim, ex, wait)

    def _drive_loaded(self, claim: Claim, ex: Execution, wait: bool) -> None:
        if ex.state in UNDER_WAY and not self._resumed(claim, ex):
            return
        while True:
            ex = self._load(claim.execution_id)
            if ex.state == State.AWAITING_APPROVAL:
                with self.service.db.begin() as conn:
                    if expire_if_due(conn, ex):
                        self.report(ex.id, "expired: no approval before the deadline")
                        return
                if not wait:
                    return
                self.sleep(self.service.config.engine.poll_seconds)
            elif ex.state == State.APPROVED:
                self._start(claim, ex)
            elif ex.state in UNDER_WAY:
                self._run(claim, ex)
                return
            else:
                return

    def _hold(self, claim: Claim, why: str) -> None:
        try:
            with self.claims.write(claim) as conn:
                executions.set_fields(conn, claim.execution_id, state=State.HELD, error=why)
                self.claims.event(conn, Kind.HELD, {"why": why}, claim.execution_id)
        except Stop as exc:
            self.report(claim.execution_id, f"stopped driving: {exc}")
            return
        self.report(claim.execution_id, f"held for a person: {why}")

    def _resumed(self, claim: Claim, ex: Execution) -> bool:
        """Take over a running execution; hold it where re-running would be blind.

        Finished steps are not run again. A step that was under way is run again only after
        the old engine's lease has certainly expired (``_wait_out_old_lease``), and only when
        it is idempotent: ``host.run``, ``chat.confirm``, ``mariadb.restore`` and steps
        marked ``idempotent: false`` are held for a person instead, as is a running execution
        of a ``resume: manual`` runbook. ``runbook resume`` (``resume_requested``) goes on."""
        previous = claim.previous_owner
        if ex.resume_requested:
            with self.claims.write(claim) as conn:
                executions.set_fields(conn, ex.id, resume_requested=False, error=None)
                self.claims.event(conn, Kind.RESUMED, {"stage": ex.stage, "by": "request"}, ex.id)
            self.report(ex.id, f"resumed at stage {ex.stage}")
            return True
        in_flight = self._in_flight(ex)
        if in_flight is not None and not in_flight.idempotent and ex.state == State.RUNNING:
            raise Hold(f"step {in_flight.id} ({in_flight.action}) was under way when the "
                        f"engine driving it ({previous}) stopped, and it is not idempotent: "
                        f"check what it did, then `runbook resume {ex.id}` to run it again or "
                        f"`runbook cancel {ex.id}` to undo")
        if ex.resume == "manual" and ex.state == State.RUNNING:
            raise Hold(f"the engine driving it ({previous}) stopped at stage {ex.stage}; the "
                        f"runbook says resume: manual: `runbook resume {ex.id}` or "
                        f"`runbook cancel {ex.id}`")
        if in_flight is not None:
            self._wait_out_old_lease(claim)
        with self.claims.write(claim) as conn:
            self.claims.event(conn, Kind.RESUMED, {
                "stage": ex.stage, "previous_engine": previous,
                "step_under_way": in_flight.id if in_flight else None}, ex.id)
        self.report(ex.id, f"resuming after engine {previous} stopped (stage {ex.stage})")
        return True

    def _in_flight(self, ex: Execution) -> PlannedStep | None:
        """The step that was running when the last engine stopped, if any."""
        steps = {step.id: step for step in ex.plan.steps}
        for (_phase, step_id), state in self._states(ex).items():
            if state.state == "running" and step_id in steps:
                return steps[step_id]
        return None

    def _wait_out_old_lease(self, claim: Claim) -> None:
        """A step under way in the old engine is run again only once that engine's lease has
        certainly run out (plus the clock skew allowed between hosts)."""
        if claim.previous_lease is None:
            return
        until = claim.previous_lease + self.service.config.engine.clock_skew_seconds
        while (left := until - time.time()) > 0:
            time.sleep(min(left, WATCH_SECONDS))  # the real clock: leases are wall time

    def _start(self, claim: Claim, ex: Execution) -> None:
        """Plan the pinned version again against today's facts; run only a plan approved
        under its own policy (a different plan is approved again, never run on the old
        approvals)."""
        with self.service.db.connect() as conn:
            holds = locking.holds(conn, ex.id, ex.fencing_token, len(ex.plan.locks))
        if not holds:
            self._end(claim, ex, State.FAILED, "it lost its locks before it started (they "
                      "expired and another execution took them); nothing was run: request it "
                      "again", expect={"state": State.APPROVED})
            return
        try:
            plan = self.service.replan(ex)
        except Refused as exc:
            self._end(claim, ex, State.FAILED, f"cannot plan again: {exc}",
                      expect={"state": State.APPROVED})
            return
        if plan.hash != ex.plan_hash and not self._accept_new_plan(claim, ex, plan):
            return
        with self.claims.write(claim) as conn:
            approvers = executions.approvals_for(conn, ex.id, plan.hash)
            if len(approvers) < plan.approval.required:  # never run short of approvals
                self._ask_again(conn, ex, plan, Kind.APPROVAL_MISSING,
                                f"{len(approvers)} of {plan.approval.required} approvals")
                return
            if not executions.update_if(conn, ex.id, {"state": State.APPROVED},
                                        state=State.RUNNING,
                                        stage="pre_checks", plan=plan.to_json(),
                                        plan_hash=plan.hash):
                return  # cancelled meanwhile: the loop finds it ended
            self.claims.event(conn, Kind.STARTED, {
                "plan_hash": plan.hash, "approved_by": approvers, "engine": self.owner,
                "epoch": claim.epoch, "version": ex.version, "content_hash": ex.content_hash,
            }, ex.id)
        self.report(ex.id, f"started {ex.runbook} {ex.version}")

    def _accept_new_plan(self, claim: Claim, ex: Execution, plan: Plan) -> bool:
        """The plan made now differs from the one recorded: ask for approval again when the
        new plan's policy wants any (True: go ahead with the new plan)."""
        changes = plan_changes(ex.plan, plan)
        if sorted(plan.locks) != sorted(ex.plan.locks):
            self._end(claim, ex, State.FAILED, "the plan now needs other locks ("
                      + ", ".join(plan.locks) + "); nothing was run: request it again",
                      expect={"state": State.APPROVED}, changes=changes)
            return False
        with self.claims.write(claim) as conn:
            if plan.approval.required > 0:
                self._ask_again(conn, ex, plan, Kind.APPROVAL_VOIDED, "; ".join(changes))
                return False
            self.claims.event(conn, Kind.REPLANNED, {
                "old_plan_hash": ex.plan_hash, "new_plan_hash": plan.hash, "changes": changes,
                "why": "the plan made at start differs; its policy needs no approval",
            }, ex.id)
        return True

    def _ask_again(self, conn: Connection, ex: Execution, plan: Plan, kind: Kind,
                   what: str) -> None:
        deadline = time.time() + plan.approval.expires_seconds
        executions.update_if(conn, ex.id, {"state": State.APPROVED},
                             state=State.AWAITING_APPROVAL,
                             plan=plan.to_json(), plan_hash=plan.hash,
                             approvals_required=plan.approval.required,
                             approval_deadline=deadline)
        self.claims.event(conn, kind, {
            "approved_plan_hash": ex.plan_hash, "new_plan_hash": plan.hash,
            "required": plan.approval.required, "what": what,
            "why": "the plan to run is not the approved one: approve the new plan",
        }, ex.id)
        self.report(ex.id, f"the plan changed since it was approved ({what}): asking for "
                           "approval again")

    # --- stages --------------------------------------------------------------------

    def _run(self, claim: Claim, ex: Execution) -> None:
        """Run the stages from the persisted one. A cancel ends the execution ``cancelled``
        with its undo, whatever stage it was in; a failure undoes too (``_fail``)."""
        if ex.state == State.UNDOING or ex.stage == "undo":
            if ex.cancel_requested and ex.stage != "undo":  # a held execution cancelled
                reason = "cancelled on request" + (f" (it was held: {ex.error})"
                                                   if ex.error else "")
                self._undo(claim, ex, State.CANCELLED, reason)
            else:
                self._undo(claim, ex, State.CANCELLED if ex.cancel_requested else State.FAILED,
                           ex.error or "")
            return
        stage = ex.stage
        if stage == "pre_checks":
            failed = self._checks(claim, ex, ex.plan.pre_checks, "pre-check")
            if self.stepper.cancel_requested(ex):
                self._end(claim, ex, State.CANCELLED, "cancelled on request before any step ran")
                return
            if failed:
                self._end(claim, ex, State.FAILED, f"{failed}; nothing was run")
                return
            stage = self._stage(claim, ex, "steps")
        if stage == "steps":
            failure = self._steps(claim, ex)
            if failure is None and self.stepper.cancel_requested(ex):
                failure = "cancelled"
            if failure is not None:
                self._fail(claim, ex, failure)
                return
            stage = self._stage(claim, ex, "post_checks")
        if stage == "post_checks":
            failed = self._checks(claim, ex, ex.plan.post_checks, "post-check")
            if self.stepper.cancel_requested(ex):
                failed = "cancelled"
            if failed:
                self._fail(claim, ex, failed)
                return
        if not self._end(claim, ex, State.SUCCEEDED, None, expect={"cancel_requested": False}):
            self._fail(claim, ex, "cancelled")  # the cancel came in after the last look

    def _stage(self, claim: Claim, ex: Execution, stage: str) -> str:
        with self.claims.write(claim) as conn:
            executions.set_fields(conn, ex.id, stage=stage)
        return stage

    def _checks(self, claim: Claim, ex: Execution, checks: list[PlannedCheck],
                label: str) -> str | None:
        for check in checks:
            if self._boundary(claim, ex):
                return "cancelled"
            if check.skipped:
                with self.claims.write(claim) as conn:
                    self.claims.event(conn, Kind.CHECK_SKIPPED,
                                 {"stage": label, "check": check.name, "why": "when is false"},
                                 ex.id)
                continue
            outcome = self._evaluate(claim, ex, check)
            if (not outcome.passed and check.kind == "capacity" and ex.plan.break_glass
                    and not outcome.extra.get("below_site_floor")):  # never the site floor
                outcome = Outcome(True, outcome.value,
                                  f"overridden by break-glass: {outcome.detail}", outcome.extra)
            with self.claims.write(claim) as conn:
                self.claims.event(conn, Kind.CHECK_EVALUATED, {
                    "stage": label, "check": check.name, "kind": check.kind, "spec": check.spec,
                    "expect": check.expect, "value": outcome.value, "passed": outcome.passed,
                    "detail": outcome.detail,
                }, ex.id)
                if not outcome.passed:
                    executions.count_failed_check(conn, ex.id)
            verdict = "passed" if outcome.passed else "FAILED"
            self.report(ex.id, f"{label} {check.name}: {verdict} ({outcome.detail})")
            if not outcome.passed:
                return f"{label} {check.name!r} failed: {outcome.detail}"
        return None

    def _evaluate(self, claim: Claim, ex: Execution, check: PlannedCheck) -> Outcome:
        def stopping() -> bool:
            self.claims.check_stale(claim)
            return claim.lost.is_set() or self.stepper.cancel_requested(ex)

        try:
            return self.service.checks.evaluate(check, stopping=stopping)
        except Exception as exc:  # an evaluator bug must fail the check, never pass it
            return Outcome(False, None, f"{type(exc).__name__}: {exc}")

    def _steps(self, claim: Claim, ex: Execution) -> str | None:
        states = self._states(ex)
        for position, step in enumerate(ex.plan.steps):
            done = states.get(("do", step.id))
            if done is not None and done.state in ("succeeded", "skipped"):
                continue
            if self._boundary(claim, ex):
                return "cancelled"
            if step.skipped:
                self._skip(claim, ex, step, position)
                continue
            call = PlannedCall(step.action, step.args, step.operations)
            error = self.stepper.call(claim, ex, step, call, "do", position,
                               done.attempt if done else 0)
            if error is not None:
                # a step that stopped because of a cancel request ends as a cancel
                return "cancelled" if self.stepper.cancel_requested(ex) else (
                    f"step {step.id} failed: {error}")
        return None

    def _states(self, ex: Execution) -> dict[tuple[str, str], executions.StepState]:
        with self.service.db.connect() as conn:
            return executions.step_states_of(conn, ex.id)

    def _skip(self, claim: Claim, ex: Execution, step: PlannedStep, position: int) -> None:
        with self.claims.write(claim) as conn:
            executions.save_step(conn, ex.id, "do", step.id, position, state="skipped")
            self.claims.event(conn, Kind.STEP_SKIPPED, {"step": step.id, "why": "when is false"},
                         ex.id)
        self.report(ex.id, f"step {step.id}: skipped (when: false)")

    # --- endings -------------------------------------------------------------------

    def _fail(self, claim: Claim, ex: Execution, reason: str) -> None:
        if reason == "cancelled":
            self._undo(claim, ex, State.CANCELLED, "cancelled on request")
        elif ex.plan.on_failure == "leave":
            self._end(claim, ex, State.FAILED, f"{reason}; completed steps left as they are "
                                               "(on_failure: leave)")
        else:
            self._undo(claim, ex, State.FAILED, reason)

    def _undo(self, claim: Claim, ex: Execution, final: State, reason: str) -> None:
        with self.claims.write(claim) as conn:
            executions.set_fields(conn, ex.id, state=State.UNDOING, stage="undo", error=reason)
            self.claims.event(conn, Kind.UNDO_STARTED, {"reason": reason}, ex.id)
        self.report(ex.id, f"undoing completed steps: {reason}")
        states = self._states(ex)
        undone: list[str] = []
        failed: list[str] = []
        kept: list[str] = []  # steps that took GPUs out and have no undo: still out
        for position in reversed(range(len(ex.plan.steps))):
            step = ex.plan.steps[position]
            done = states.get(("do", step.id))
            if step.undo is None or done is None:
                if (done is not None and done.state == "succeeded" and _needs_undo(step, done)
                        and self.service.catalogue.takes_out(step.action)):
                    kept.append(step.id)
                continue
            if not _needs_undo(step, done):
                if done.state == "succeeded":
                    self._note_unchanged(claim, ex, step)
                continue
            previous = states.get(("undo", step.id))
            if previous is not None and previous.state == "succeeded":
                undone.append(step.id)
                continue
            self._boundary(claim, ex, cancelling=True)
            error = self.stepper.call(claim, ex, step, step.undo, "undo", position,
                               previous.attempt if previous else 0)
            (failed if error else undone).append(step.id if not error else f"{step.id}: {error}")
        summary = reason + (f"; undone: {', '.join(undone)}" if undone
                            else "" if failed else "; nothing to undo")
        if failed:
            summary += f"; UNDO FAILED (needs a person): {'; '.join(failed)}"
        if kept:
            summary += (f"; still out of service (no undo): {', '.join(reversed(kept))}: "
                        "the nodes stay out until a runbook returns them (resume-node)")
        self._end(claim, ex, final, summary)

    def _note_unchanged(self, claim: Claim, ex: Execution, step: PlannedStep) -> None:
        with self.claims.write(claim) as conn:
            self.claims.event(conn, Kind.UNDO_SKIPPED, {
                "step": step.id, "why": "the step found everything already done and changed "
                                        "nothing, so there is nothing of ours to undo"}, ex.id)
        self.report(ex.id, f"step {step.id} (undo): skipped, the step changed nothing")

    def _end(self, claim: Claim, ex: Execution, state: State, error: str | None,
             expect: dict[str, Any] | None = None, **data: Any) -> bool:
        """End the execution (compare-and-set on the claim and ``expect``); False when the
        row was not as expected (a cancel came in, say) and nothing was written."""
        if state in (State.FAILED, State.CANCELLED) and error:
            where = self.service.node_states([lock.removeprefix("node:") for lock in ex.plan.locks
                                          if lock.startswith("node:")], ex.id)
            error = f"{error}. {where}" if where else error
        with self.claims.write(claim) as conn:
            ended = executions.finish(conn, executions.get(conn, ex.id), state, ENGINE, error,
                                      expect={"epoch": claim.epoch, **(expect or {})}, **data)
        if ended:
            self.report(ex.id, f"{state}" + (f": {error}" if error else ""))
        return ended

    def _boundary(self, claim: Claim, ex: Execution, cancelling: bool = False) -> bool:
        """Between steps: stop if this engine lost the execution; hold it if it lost its
        locks (someone else may be working on its nodes now). True when a cancel was asked
        (read on the same connection: one round trip per step)."""
        self.claims.check_stale(claim)
        if claim.lost.is_set():
            raise Stop(f"execution {ex.id}: {claim.reason}")
        if self._handing_over.is_set():
            raise Stop(f"execution {ex.id}: this engine stopped (no longer the leader, or "
                        "shutting down); another engine resumes it here")
        with self.service.db.connect() as conn:
            holds = locking.holds(conn, ex.id, ex.fencing_token, len(ex.plan.locks))
            cancel = cancel_flag(conn, ex.id)
        if not holds and not cancelling:
            raise Hold(f"execution {ex.id} no longer holds its locks (fencing token "
                        f"{ex.fencing_token}): another execution may be working on its nodes. "
                        f"Check them, then `runbook cancel {ex.id}`")
        return cancel

    def _cancel_requested(self, ex: Execution) -> bool:
        with self.service.db.connect() as conn:
            return cancel_flag(conn, ex.id)

    # --- the engine loop -----------------------------------------------------------------

    def runnable(self) -> list[tuple[int, str]]:
        """Active executions no live engine drives: (id, state)."""
        now = time.time()
        with self.service.db.connect() as conn:
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
        limit = self.service.config.engine.max_parallel
        while not stop.is_set():
            for execution_id, worker in list(workers.items()):
                if not worker.is_alive():
                    del workers[execution_id]
            for execution_id, state in self.runnable():
                if execution_id in workers:
                    continue
                if state == State.AWAITING_APPROVAL:
                    self.drive(execution_id, wait_for_approval=False)
                elif len(workers) < limit:
                    worker = threading.Thread(
                        target=self.drive, args=(execution_id,),
                        kwargs={"wait_for_approval": False}, name=f"execution-{execution_id}",
                        daemon=True,
                    )
                    worker.start()
                    workers[execution_id] = worker
            if once and not workers and not any(s != State.AWAITING_APPROVAL
                                                for _, s in self.runnable()):
                return
            stop.wait(self.service.config.engine.poll_seconds)
        if hand_over:
            self._handing_over.set()
        for worker in workers.values():
            worker.join()




def plan_changes(old: Plan, new: Plan) -> list[str]:
    """What differs between two plans of one execution, for the audit log and the people
    asked to approve again."""
    changes: list[str] = []
    if old.approval != new.approval:
        changes.append(f"approval: {old.approval.describe()} -> {new.approval.describe()}")
    for flag in ("break_glass", "outside_window"):
        if getattr(old, flag) != getattr(new, flag):
            changes.append(f"{flag}: {getattr(old, flag)} -> {getattr(new, flag)}")
    before = [op for step in old.steps for op in step.operations]
    after = [op for step in new.steps for op in step.operations]
    changes += [f"operation removed: {op}" for op in before if op not in after]
    changes += [f"operation added: {op}" for op in after if op not in before]
    old_checks = {c.name: c.spec for c in old.pre_checks + old.post_checks}
    new_checks = {c.name: c.spec for c in new.pre_checks + new.post_checks}
    changes += [f"check changed: {name}" for name in sorted(set(old_checks) | set(new_checks))
                if old_checks.get(name) != new_checks.get(name)]
    if sorted(old.locks) != sorted(new.locks):
        changes.append(f"locks: {', '.join(old.locks)} -> {', '.join(new.locks)}")
    return changes or ["the plan's details changed (same operations)"]


def _needs_undo(step: PlannedStep, done: executions.StepState) -> bool:
    """Undo what this execution changed: succeeded steps that changed something, and failed
    steps marked undo_if_failed. A step that found everything already done changed nothing,
    so undoing it would undo someone else's work (resume a node another person drained)."""
    if done.state == "failed":
        return step.undo_if_failed
    if done.state != "succeeded":
        return False
    return bool((done.result or {}).get("changed", True))



__all__ = ["Claim", "Engine", "Parts", "Reporter", "plan_changes", "silent"]
