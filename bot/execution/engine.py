"""The execution engine (``Engine``): drives an approved execution to its end, surviving its
own death (claims, fencing, heartbeats; see the class).

It acts on systems only through the actions and checks it is handed (``Parts``), writes
about an execution only under its claim, and never imports the command service or a surface.
"""

from __future__ import annotations

import contextvars
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import Connection, and_, bindparam, or_, select, text, update
from sqlalchemy import Engine as SqlEngine

from adapters.actions import (
    ActionContext,
    ActionError,
    ActionResult,
    ActionStopped,
    ActionTimeout,
)
from bot.config import Config
from bot.execution import capacity_guard, executions, locking
from bot.execution.checks.core import Checks, Outcome
from bot.execution.executions import ACTIVE, Execution, expire_if_due
from bot.execution.planning import Plan, PlannedCall, PlannedCheck, PlannedStep
from bot.runbooks.catalogue import Catalogue
from bot.runbooks.secrets import Unsealer
from bot.store import audit
from bot.store.schema import executions as executions_table
from bot.store.words import UNDER_WAY, Kind, State
from kit import logs
from kit.errors import Refused

ENGINE = "engine"  # the audit actor for what the engine does on its own
WATCH_SECONDS = 0.5  # how often the engine looks at cancel, claim and timeout while a step runs
# An engine that could not renew a lease for this share of it stops acting on its own:
# well before another engine may take the execution over.
STALE_SHARE = 0.6


class Parts(Protocol):
    """What the engine needs of the command service (bot.service.Service): settings, the
    database, the actions, the checks, and a way to plan an execution again."""

    @property
    def config(self) -> Config: ...

    @property
    def db(self) -> SqlEngine: ...

    @property
    def catalogue(self) -> Catalogue: ...

    @property
    def checks(self) -> Checks: ...

    def replan(self, ex: Execution) -> Plan: ...

    def unsealer(self, ex: Execution) -> Unsealer: ...

    def node_states(self, nodes: Sequence[str], execution_id: int) -> str: ...


class Reporter(Protocol):
    def __call__(self, execution_id: int, line: str) -> None: ...


def silent(execution_id: int, line: str) -> None:
    """A reporter that reports nothing (the audit log still has everything)."""


class _Stop(Exception):
    """This engine must stop driving the execution (claim lost, or handing over)."""


class _Hold(Exception):
    """The execution must wait for a person; the message says why and what to do."""


@dataclass
class Claim:
    """One engine's claim on one execution: its epoch, and what it knows of the last one."""

    execution_id: int
    epoch: int
    previous_owner: str | None
    previous_lease: float | None
    renewed: float = field(default_factory=time.monotonic)  # last renewal that succeeded
    lost: threading.Event = field(default_factory=threading.Event)
    reason: str = ""
    running: dict[int, ActionContext] = field(default_factory=dict)

    def lose(self, reason: str) -> None:
        if not self.lost.is_set():
            self.reason = reason
            self.lost.set()
        for ctx in list(self.running.values()):
            ctx.request_stop(f"this engine lost the execution: {reason}")


@dataclass
class Engine:
    """The execution engine: drives approved executions through pre-checks, steps and
    post-checks to their end, undoing completed steps in reverse on a failure or a cancel.

    It owns its claims, one per execution it drives: a claim writes ``owner`` and a lease
    into the row and bumps its ``epoch``; every later write is one transaction fenced on
    that epoch (``_write``), so an engine that lost its claim writes nothing more. A
    heartbeat renews the leases and the execution's locks (``_heartbeat``); another engine
    takes over only once a lease ran out, and resumes from the persisted stage and step
    states (``_resumed``). It runs only a plan approved under its own policy (``_start``),
    and what it cannot safely decide is *held* for a person. It reaches systems only through
    the actions and checks of ``Parts`` (a ``Service``, which it never imports). A surface
    calls ``drive`` for one execution, or ``run_pending`` for the loop (``runbook engine``,
    the leader of ``runbook serve``); ``report`` gets its progress lines.
    """

    service: Parts  # the command service
    report: Reporter = silent
    owner: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
    )
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        self._claims: dict[int, Claim] = {}
        self._guard = threading.Lock()
        self._beat = threading.Event()
        self._heart: threading.Thread | None = None
        self._handing_over = threading.Event()  # stop at the next boundary (run_pending)
        # Fault injection for the lab's kill -9 tests (lab configurations only): the process
        # kills itself right after committing the audit event named here ("kind" or
        # "kind:step"), so each stage boundary can be crashed at deterministically.
        self._crash_after = (os.environ.get("RUNBOOK_LAB_CRASH_AFTER") or None
                             if self.service.config.lab else None)
        self._written = threading.local()

    # --- claiming and the heartbeat ------------------------------------------------

    @property
    def _lease(self) -> float:
        return self.service.config.engine.lease_seconds

    def claim(self, execution_id: int) -> tuple[bool, str | None]:
        """Take the execution unless another live engine has it; returns (claimed, last owner)."""
        taken = self._claim(execution_id)
        return taken is not None, taken.previous_owner if taken else None

    def _claim(self, execution_id: int) -> Claim | None:
        now = time.time()
        table = executions_table
        with self.service.db.begin() as conn:
            before = conn.execute(
                select(table.c.owner, table.c.lease_until).where(table.c.id == execution_id)
            ).first()
            epoch = conn.execute(
                update(table)
                .where(
                    table.c.id == execution_id,
                    table.c.state.in_(sorted(ACTIVE)),
                    or_(table.c.owner.is_(None), table.c.lease_until < now),
                )
                .values(owner=self.owner, lease_until=now + self._lease, epoch=table.c.epoch + 1,
                        row_version=table.c.row_version + 1)
                .returning(table.c.epoch)
            ).scalar()
        if epoch is None or before is None:
            return None
        taken = Claim(execution_id, int(epoch), before.owner, before.lease_until)
        with self._guard:
            old = self._claims.get(execution_id)
            if old is not None:
                old.lose("this engine claimed it again")
            self._claims[execution_id] = taken
        self._start_heart()
        return taken

    def _let_go(self, claim: Claim) -> None:
        with self._guard:
            if self._claims.get(claim.execution_id) is claim:
                del self._claims[claim.execution_id]
        if claim.lost.is_set() or claim.running:
            return  # the lease runs out by itself; the next engine waits for that
        with self.service.db.begin() as conn:
            conn.execute(
                update(executions_table)
                .where(executions_table.c.id == claim.execution_id,
                       executions_table.c.epoch == claim.epoch,
                       executions_table.c.owner == self.owner)
                .values(owner=None, lease_until=None)
            )

    def _start_heart(self) -> None:
        if self._heart is None or not self._heart.is_alive():
            self._heart = threading.Thread(target=self._heartbeat, name="lease", daemon=True)
            self._heart.start()

    def _heartbeat(self) -> None:
        """Every fifth of a lease, renew the leases of this engine's claims and their
        executions' locks. While the database is away it keeps trying; a claim not renewed
        for ``STALE_SHARE`` of a lease is given up by itself (``_check_stale``) and its
        running actions are told to stop, well before another engine may take it over."""
        while not self._beat.wait(self._lease / 5):
            with self._guard:
                claims = list(self._claims.values())
            if not claims:
                continue
            try:
                self.renew(claims)
            except Exception as exc:  # the database is away: keep trying, give up in time
                for claim in claims:
                    self._check_stale(claim, f"{type(exc).__name__}: {exc}")

    def renew(self, claims: list[Claim]) -> None:
        now = time.time()
        lock_until = now + self.service.config.engine.lock_ttl_seconds
        with self.service.db.begin() as conn:
            renewed: list[Claim] = []
            for claim in claims:
                if claim.lost.is_set():
                    continue
                if conn.execute(
                    update(executions_table)
                    .where(executions_table.c.id == claim.execution_id,
                           executions_table.c.epoch == claim.epoch,
                           executions_table.c.owner == self.owner)
                    .values(lease_until=now + self._lease)
                ).rowcount:
                    locking.renew(conn, claim.execution_id, lock_until)
                    renewed.append(claim)
                else:
                    claim.lose("another engine claimed it (its lease had run out)")
        for claim in renewed:  # only once the transaction committed
            claim.renewed = time.monotonic()

    def _check_stale(self, claim: Claim, why: str = "") -> None:
        """Give the claim up when the lease may be running out without a renewal."""
        silent_for = time.monotonic() - claim.renewed
        if silent_for > self._lease * STALE_SHARE:
            claim.lose(f"could not renew its lease for {silent_for:.0f}s"
                       + (f" ({why[:200]})" if why else ""))

    def close(self) -> None:
        self._beat.set()

    # --- writing under the claim ------------------------------------------------------

    @contextmanager
    def _write(self, claim: Claim) -> Iterator[Connection]:
        """A transaction that commits only while this engine's claim is the current one."""
        self._check_stale(claim)
        if claim.lost.is_set():
            raise _Stop(f"execution {claim.execution_id}: {claim.reason}")
        self._written.events = []
        with self.service.db.begin() as conn:
            if not conn.execute(_FENCE, {"id": claim.execution_id, "epoch": claim.epoch,
                                         "owner": self.owner}).rowcount:
                claim.lose("another engine claimed it")
                raise _Stop(f"execution {claim.execution_id}: another engine took it over")
            yield conn
        if self._crash_after and self._crash_after in self._written.events:
            os.kill(os.getpid(), signal.SIGKILL)

    def _event(self, conn: Connection, kind: Kind, data: dict[str, Any],
               execution_id: int) -> None:
        audit.append(conn, kind, ENGINE, data, execution_id)
        if self._crash_after:
            self._written.events = [*getattr(self._written, "events", []), kind,
                                    f"{kind}:{data.get('step', data.get('check', ''))}"]

    # --- driving -------------------------------------------------------------------

    def drive(self, execution_id: int, *, wait_for_approval: bool = True) -> Execution:
        """Drive the execution as far as it can go; returns it as it stands afterwards.
        One execution per call; it does nothing when another live engine has it."""
        claim = self._claim(execution_id)
        if claim is None:
            return self._load(execution_id)
        try:
            with logs.execution(execution_id):  # the runbook too, once _drive has read it
                self._drive(claim, wait_for_approval)
        except _Stop as exc:
            self.report(execution_id, f"stopped driving: {exc}")
        except _Hold as exc:
            self._hold(claim, str(exc))
        finally:
            self._let_go(claim)
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
            with self._write(claim) as conn:
                executions.set_fields(conn, claim.execution_id, state=State.HELD, error=why)
                self._event(conn, Kind.HELD, {"why": why}, claim.execution_id)
        except _Stop as exc:
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
            with self._write(claim) as conn:
                executions.set_fields(conn, ex.id, resume_requested=False, error=None)
                self._event(conn, Kind.RESUMED, {"stage": ex.stage, "by": "request"}, ex.id)
            self.report(ex.id, f"resumed at stage {ex.stage}")
            return True
        in_flight = self._in_flight(ex)
        if in_flight is not None and not in_flight.idempotent and ex.state == State.RUNNING:
            raise _Hold(f"step {in_flight.id} ({in_flight.action}) was under way when the "
                        f"engine driving it ({previous}) stopped, and it is not idempotent: "
                        f"check what it did, then `runbook resume {ex.id}` to run it again or "
                        f"`runbook cancel {ex.id}` to undo")
        if ex.resume == "manual" and ex.state == State.RUNNING:
            raise _Hold(f"the engine driving it ({previous}) stopped at stage {ex.stage}; the "
                        f"runbook says resume: manual: `runbook resume {ex.id}` or "
                        f"`runbook cancel {ex.id}`")
        if in_flight is not None:
            self._wait_out_old_lease(claim)
        with self._write(claim) as conn:
            self._event(conn, Kind.RESUMED, {
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
        with self._write(claim) as conn:
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
            self._event(conn, Kind.STARTED, {
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
        with self._write(claim) as conn:
            if plan.approval.required > 0:
                self._ask_again(conn, ex, plan, Kind.APPROVAL_VOIDED, "; ".join(changes))
                return False
            self._event(conn, Kind.REPLANNED, {
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
        self._event(conn, kind, {
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
            if self._cancel_requested(ex):
                self._end(claim, ex, State.CANCELLED, "cancelled on request before any step ran")
                return
            if failed:
                self._end(claim, ex, State.FAILED, f"{failed}; nothing was run")
                return
            stage = self._stage(claim, ex, "steps")
        if stage == "steps":
            failure = self._steps(claim, ex)
            if failure is None and self._cancel_requested(ex):
                failure = "cancelled"
            if failure is not None:
                self._fail(claim, ex, failure)
                return
            stage = self._stage(claim, ex, "post_checks")
        if stage == "post_checks":
            failed = self._checks(claim, ex, ex.plan.post_checks, "post-check")
            if self._cancel_requested(ex):
                failed = "cancelled"
            if failed:
                self._fail(claim, ex, failed)
                return
        if not self._end(claim, ex, State.SUCCEEDED, None, expect={"cancel_requested": False}):
            self._fail(claim, ex, "cancelled")  # the cancel came in after the last look

    def _stage(self, claim: Claim, ex: Execution, stage: str) -> str:
        with self._write(claim) as conn:
            executions.set_fields(conn, ex.id, stage=stage)
        return stage

    def _checks(self, claim: Claim, ex: Execution, checks: list[PlannedCheck],
                label: str) -> str | None:
        for check in checks:
            if self._boundary(claim, ex):
                return "cancelled"
            if check.skipped:
                with self._write(claim) as conn:
                    self._event(conn, Kind.CHECK_SKIPPED,
                                 {"stage": label, "check": check.name, "why": "when is false"},
                                 ex.id)
                continue
            outcome = self._evaluate(claim, ex, check)
            if (not outcome.passed and check.kind == "capacity" and ex.plan.break_glass
                    and not outcome.extra.get("below_site_floor")):  # never the site floor
                outcome = Outcome(True, outcome.value,
                                  f"overridden by break-glass: {outcome.detail}", outcome.extra)
            with self._write(claim) as conn:
                self._event(conn, Kind.CHECK_EVALUATED, {
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
            self._check_stale(claim)
            return claim.lost.is_set() or self._cancel_requested(ex)

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
            error = self._call(claim, ex, step, call, "do", position,
                               done.attempt if done else 0)
            if error is not None:
                # a step that stopped because of a cancel request ends as a cancel
                return "cancelled" if self._cancel_requested(ex) else (
                    f"step {step.id} failed: {error}")
        return None

    def _states(self, ex: Execution) -> dict[tuple[str, str], executions.StepState]:
        with self.service.db.connect() as conn:
            return executions.step_states_of(conn, ex.id)

    def _skip(self, claim: Claim, ex: Execution, step: PlannedStep, position: int) -> None:
        with self._write(claim) as conn:
            executions.save_step(conn, ex.id, "do", step.id, position, state="skipped")
            self._event(conn, Kind.STEP_SKIPPED, {"step": step.id, "why": "when is false"},
                         ex.id)
        self.report(ex.id, f"step {step.id}: skipped (when: false)")

    def _call(self, claim: Claim, ex: Execution, step: PlannedStep, call: PlannedCall,
              phase: str, position: int, attempts_before: int) -> str | None:
        """Run one action with retries; returns the last error, or None on success."""
        label = step.id if phase == "do" else f"{step.id} (undo)"
        error = "not run"
        last = attempts_before + step.retries + 1
        for attempt in range(attempts_before + 1, last + 1):
            with self._write(claim) as conn:
                executions.save_step(conn, ex.id, phase, step.id, position, state="running",
                                     attempt=attempt, started_at=_now(), error=None)
                self._event(conn, Kind.STEP_STARTED if phase == "do" else Kind.UNDO_STARTED, {
                    "step": step.id, "action": call.action, "args": call.args,
                    "operations": call.operations, "attempt": attempt, "epoch": claim.epoch,
                }, ex.id)
            self.report(ex.id, f"step {label}: running ({'; '.join(call.operations)})")
            seal = Unsealer()  # the step's secret values, masked in all that comes back
            try:
                seal = self.service.unsealer(ex)
                result = _masked(seal, self._invoke(claim, ex, step, call, phase, seal))
            except (_Stop, _Hold):
                raise
            except Exception as exc:
                error = seal.mask_text(str(exc) if isinstance(exc, ActionError) else (
                    f"{type(exc).__name__}: {exc}"))
                stopped = isinstance(exc, ActionStopped) or (
                    phase == "do" and self._cancel_requested(ex))
                retry = attempt < last and not stopped
                self._record(claim, ex, step, phase, position, "failed", error=error,
                             attempt=attempt, retry=retry)
                self.report(ex.id, f"step {label}: failed: {error}"
                                   + (" (retrying)" if retry else ""))
                if not retry:
                    return error
                self._pause(claim, ex, step.retry_delay_seconds, phase)
                continue
            self._record(claim, ex, step, phase, position, "succeeded", result=result,
                         attempt=attempt)
            self.report(ex.id, f"step {label}: done: {result.summary}")
            return None
        return error

    def _pause(self, claim: Claim, ex: Execution, seconds: float, phase: str) -> None:
        """Wait before a retry, but not past a cancel or a lost claim. The wait is counted in
        ``sleep`` calls, not read off the clock: an engine given a fake ``sleep`` does not
        spin (querying the cancel flag) until the real seconds have gone by."""
        left = seconds
        while left > 0:
            if claim.lost.is_set() or (phase == "do" and self._cancel_requested(ex)):
                break
            pause = min(left, WATCH_SECONDS)
            self.sleep(pause)
            left -= pause
        self._boundary(claim, ex, cancelling=phase == "undo")

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
            with self._write(claim) as conn:
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
            self._check_stale(claim)
            if claim.lost.is_set():
                ctx.request_stop(f"this engine lost the execution: {claim.reason}")
            elif phase == "do" and self._cancel_requested(ex):
                ctx.request_stop("the execution was cancelled")
            if time.monotonic() >= ctx.deadline:
                ctx.request_stop(f"the step's timeout ({timeout:g}s) passed")
            if ctx.stop.is_set() and asked is None:
                asked = time.monotonic()
            if asked is not None and time.monotonic() - asked > grace:
                if claim.lost.is_set():
                    raise _Stop(f"execution {ex.id}: {claim.reason}; step {ctx.step_id} did "
                                f"not stop within {grace:g}s")
                raise _Hold(f"step {ctx.step_id} was asked to stop ({ctx.stop_reason}) and did "
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
        with self._write(claim) as conn:
            # a failed step keeps the node states it published last (ActionContext.status)
            kept = {"result": data} if result is not None else {}
            executions.save_step(conn, ex.id, phase, step.id, position, state=state,
                                 finished_at=_now(), error=error, **kept)
            self._event(conn, kind, data, ex.id)

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
        with self._write(claim) as conn:
            executions.set_fields(conn, ex.id, state=State.UNDOING, stage="undo", error=reason)
            self._event(conn, Kind.UNDO_STARTED, {"reason": reason}, ex.id)
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
            error = self._call(claim, ex, step, step.undo, "undo", position,
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
        with self._write(claim) as conn:
            self._event(conn, Kind.UNDO_SKIPPED, {
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
        with self._write(claim) as conn:
            ended = executions.finish(conn, executions.get(conn, ex.id), state, ENGINE, error,
                                      expect={"epoch": claim.epoch, **(expect or {})}, **data)
        if ended:
            self.report(ex.id, f"{state}" + (f": {error}" if error else ""))
        return ended

    def _boundary(self, claim: Claim, ex: Execution, cancelling: bool = False) -> bool:
        """Between steps: stop if this engine lost the execution; hold it if it lost its
        locks (someone else may be working on its nodes now). True when a cancel was asked
        (read on the same connection: one round trip per step)."""
        self._check_stale(claim)
        if claim.lost.is_set():
            raise _Stop(f"execution {ex.id}: {claim.reason}")
        if self._handing_over.is_set():
            raise _Stop(f"execution {ex.id}: this engine stopped (no longer the leader, or "
                        "shutting down); another engine resumes it here")
        with self.service.db.connect() as conn:
            holds = locking.holds(conn, ex.id, ex.fencing_token, len(ex.plan.locks))
            cancel = _cancel_flag(conn, ex.id)
        if not holds and not cancelling:
            raise _Hold(f"execution {ex.id} no longer holds its locks (fencing token "
                        f"{ex.fencing_token}): another execution may be working on its nodes. "
                        f"Check them, then `runbook cancel {ex.id}`")
        return cancel

    def _cancel_requested(self, ex: Execution) -> bool:
        with self.service.db.connect() as conn:
            return _cancel_flag(conn, ex.id)

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


# Built once: the engine runs these at every step (a statement built per call costs more
# than the query itself on SQLite). The fence takes the row (and on PostgreSQL locks it)
# only while the claim is still this engine's: the same compare-and-set as update_if.
_FENCE = text("UPDATE executions SET row_version = row_version + 1 "
              "WHERE id = :id AND epoch = :epoch AND owner = :owner")
_CANCEL_FLAG = select(executions_table.c.cancel_requested).where(
    executions_table.c.id == bindparam("id"))


def _cancel_flag(conn: Connection, execution_id: int) -> bool:
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


def _now() -> str:
    from bot.store.db import now_iso

    return now_iso()


__all__ = ["Claim", "Engine", "Reporter", "plan_changes", "silent"]
