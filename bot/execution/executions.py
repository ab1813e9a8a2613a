"""Executions and their step states, as rows; every change goes with its audit event.

Rows only: no decision on who may do what (bot.execution.approval, bot.service) and no
running (bot.execution.engine). ``Execution`` lists the states.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, delete, select, update

from bot.execution import followups, locking
from bot.execution.planning import Plan, plan_from_json
from bot.store import audit, words
from bot.store.db import now_iso
from bot.store.schema import (
    approvals,
    execution_nodes,
    execution_secrets,
    executions,
    step_states,
)
from bot.store.words import Kind, State
from kit.canonical import canonical

TERMINAL = words.TERMINAL  # ended: nothing more happens to it
ACTIVE = words.ACTIVE  # engines pick these up; held ones wait for a person


class NotFound(Exception):
    """No execution with that ID."""


@dataclass(frozen=True)
class Execution:
    """One execution as stored. States: ``awaiting_approval`` -> ``approved`` -> ``running``
    (stages pre_checks, steps, post_checks) -> ``succeeded``; or ``undoing`` -> ``failed`` /
    ``cancelled``; ``denied`` and ``expired`` end a request before anything ran; ``held``
    waits for a person (an engine died in a step that must not be re-run blindly, a step did
    not stop after its timeout, the execution lost its locks).
    """

    id: int
    runbook: str
    version: str
    content_hash: str
    params: dict[str, Any]
    requested_by: str
    requested_at: str
    state: State
    stage: str
    plan: Plan
    plan_hash: str
    approvals_required: int
    approval_deadline: float | None
    resume: str
    owner: str | None
    lease_until: float | None
    cancel_requested: bool
    resume_requested: bool
    fencing_token: int
    error: str | None
    finished_at: str | None
    row_version: int = 0
    epoch: int = 0
    source: str | None = None  # who asked through what: cli, chat, alert, schedule, window
    break_glass: bool = False
    checks_failed: int = 0  # checks that failed (the console's filter; the log has each)
    change: str | None = None  # the request's change reference (as in its plan)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


def _from_row(row: Any) -> Execution:
    data = dict(row._mapping)
    data["state"] = State(data["state"])
    data["params"] = json.loads(data["params"])
    data["plan"] = plan_from_json(json.loads(data["plan"]))
    return Execution(**data)


def get(conn: Connection, execution_id: int) -> Execution:
    row = conn.execute(select(executions).where(executions.c.id == execution_id)).first()
    if row is None:
        raise NotFound(f"there is no execution {execution_id}")
    return _from_row(row)


def find(conn: Connection, *, states: frozenset[str] | None = None,
         runbook: str | None = None, user: str | None = None, node: str | None = None,
         limit: int = 200) -> list[Execution]:
    """Executions, newest first. ``node``: those whose plan locked it (a node inside a
    hostlist parameter too: ``execution_nodes``)."""
    query = select(executions).order_by(executions.c.id.desc()).limit(limit)
    if node:
        query = query.where(executions.c.id.in_(
            select(execution_nodes.c.execution_id).where(execution_nodes.c.node == node)))
    if states is not None:
        query = query.where(executions.c.state.in_(sorted(states)))
    if runbook:
        query = query.where(executions.c.runbook == runbook)
    if user:
        query = query.where(executions.c.requested_by == user)
    return [_from_row(row) for row in conn.execute(query)]


def create(conn: Connection, plan: Plan, user: str, resume: str, deadline: float | None,
           source: str = "cli") -> int:
    """The row of a new request, and the nodes its plan locks (``execution_nodes``)."""
    state = State.AWAITING_APPROVAL if plan.approval.required > 0 else State.APPROVED
    result = conn.execute(
        executions.insert().values(
            runbook=plan.runbook, version=plan.version, content_hash=plan.content_hash,
            params=canonical(plan.params), requested_by=user, requested_at=now_iso(),
            state=state, stage="approval", plan=plan.to_json(), plan_hash=plan.hash,
            approvals_required=plan.approval.required, approval_deadline=deadline,
            resume=resume, cancel_requested=False, resume_requested=False, fencing_token=0,
            source=source[:16], break_glass=plan.break_glass, checks_failed=0,
            change=plan.change,
        )
    )
    key = result.inserted_primary_key
    assert key is not None
    execution_id = int(key[0])
    nodes = sorted({lock.removeprefix("node:") for lock in plan.locks
                    if lock.startswith("node:")})
    if nodes:
        conn.execute(execution_nodes.insert(),
                     [{"node": node, "execution_id": execution_id} for node in nodes])
    if plan.sealed:
        conn.execute(execution_secrets.insert(), [
            {"execution_id": execution_id, "name": name, "sealed": sealed}
            for name, sealed in sorted(plan.sealed.items())])
    return execution_id


def sealed_secrets(conn: Connection, execution_id: int) -> dict[str, str]:
    """An unfinished execution's secret parameters, as ciphertexts (name -> sealed)."""
    rows = conn.execute(select(execution_secrets.c.name, execution_secrets.c.sealed)
                        .where(execution_secrets.c.execution_id == execution_id))
    return {row.name: row.sealed for row in rows}


def count_failed_check(conn: Connection, execution_id: int) -> None:
    """One more failed check, in the transaction of its ``check_evaluated`` event."""
    conn.execute(update(executions).where(executions.c.id == execution_id)
                 .values(checks_failed=executions.c.checks_failed + 1))


def set_fields(conn: Connection, execution_id: int, **fields: Any) -> None:
    """An unconditional write: only for rows nobody else can see yet (a new request)."""
    conn.execute(update(executions).where(executions.c.id == execution_id).values(**fields))


def update_if(conn: Connection, execution_id: int, expect: Mapping[str, Any],
              **fields: Any) -> bool:
    """Compare-and-set: write ``fields`` only when every column in ``expect`` still has
    its value (a set or frozenset of values: any of them). True when it was written.

    Changes of an execution row are compare-and-sets (the engine's other writes are fenced
    on its claim epoch, ``Engine._write``): the writer names what it expects to find (a
    state, the engine's claim epoch) and the write applies only when the row still is so,
    bumping ``row_version``. The caller writes its audit event in the same transaction, so
    a decision that lost a race leaves no trace but its refusal.

    On PostgreSQL the UPDATE also locks the row until the transaction ends, so a second
    writer waits and then finds the row as the first left it."""
    query = update(executions).where(executions.c.id == execution_id)
    for column, value in expect.items():
        if isinstance(value, (set, frozenset)):
            query = query.where(executions.c[column].in_(sorted(value)))
        else:
            query = query.where(executions.c[column] == value)
    values = {**fields, "row_version": executions.c.row_version + 1}
    return bool(conn.execute(query.values(**values)).rowcount)


def finish(
    conn: Connection, ex: Execution, state: State, actor: str, error: str | None = None,
    *, expect: Mapping[str, Any] | None = None, **data: Any,
) -> bool:
    """End an execution when it still is as ``expect`` says (default: not ended): final
    state, locks released, the ending in the audit log. False, with nothing written, when
    the row had changed."""
    guard = dict(expect) if expect is not None else {"state": words.NOT_ENDED}
    ended = update_if(conn, ex.id, guard, state=state, error=error, finished_at=now_iso(),
                      owner=None, lease_until=None)
    if not ended:
        return False
    released = locking.release(conn, ex.id)
    # an ended execution never runs again: its secrets are not kept past it
    conn.execute(delete(execution_secrets).where(execution_secrets.c.execution_id == ex.id))
    audit.append(conn, Kind.FINISHED, actor,
                 {"state": state, "error": error, "locks_released": released, **data}, ex.id)
    if state == State.FAILED:
        followups.propose(conn, ex.id, ex.runbook, ex.plan.propose_on_failure, error)
    return True


def approvals_for(conn: Connection, execution_id: int, plan_hash: str) -> list[str]:
    rows = conn.execute(
        select(approvals.c.user).where(
            approvals.c.execution_id == execution_id,
            approvals.c.plan_hash == plan_hash,
            approvals.c.decision == "approve",
        ).order_by(approvals.c.id)
    )
    return list(rows.scalars())


def record_decision(conn: Connection, execution_id: int, user: str, decision: str,
                    plan_hash: str, reason: str | None) -> None:
    """One decision per (execution, user, plan hash): the database refuses a second one
    (IntegrityError), whatever raced to record it."""
    conn.execute(approvals.insert().values(
        execution_id=execution_id, user=user, decision=decision, plan_hash=plan_hash,
        at=now_iso(), reason=reason,
    ))


# --- step states ---------------------------------------------------------------


@dataclass(frozen=True)
class StepState:
    step_id: str
    phase: str
    position: int
    state: str
    attempt: int
    started_at: str | None
    finished_at: str | None
    result: Mapping[str, Any] | None
    error: str | None


def step_states_of(conn: Connection, execution_id: int) -> dict[tuple[str, str], StepState]:
    rows = conn.execute(select(step_states).where(step_states.c.execution_id == execution_id))
    found = {}
    for row in rows:
        data = dict(row._mapping)
        data.pop("execution_id")
        data["result"] = json.loads(data["result"]) if data["result"] else None
        found[(row.phase, row.step_id)] = StepState(**data)
    return found


def save_step(conn: Connection, execution_id: int, phase: str, step_id: str, position: int,
              **fields: Any) -> None:
    if "result" in fields and fields["result"] is not None:
        fields["result"] = canonical(fields["result"])
    key = {"k_execution": execution_id, "k_phase": phase, "k_step": step_id}
    updated = conn.execute(_step_update(tuple(sorted(fields))), {**key, **fields})
    if updated.rowcount == 0:
        conn.execute(_STEP_INSERT, {"execution_id": execution_id, "phase": phase,
                                    "step_id": step_id, "position": position, **fields})


_STEP_INSERT = step_states.insert()


@functools.lru_cache(maxsize=64)
def _step_update(names: tuple[str, ...]) -> Any:
    """The step row's update of these columns, built once per set of columns (a statement
    built per call costs more than the write)."""
    return update(step_states).where(
        (step_states.c.execution_id == bindparam("k_execution"))
        & (step_states.c.phase == bindparam("k_phase"))
        & (step_states.c.step_id == bindparam("k_step"))
    ).values({name: bindparam(name) for name in names})


def expire_if_due(conn: Connection, ex: Execution) -> bool:
    """End an execution whose approval window has passed; True when it did."""
    if ex.approval_deadline is None or ex.approval_deadline > time.time():
        return False
    expect = {"state": State.AWAITING_APPROVAL, "approval_deadline": ex.approval_deadline}
    if not update_if(conn, ex.id, expect):  # approved or ended meanwhile
        return False
    audit.append(conn, Kind.EXPIRED, "bot", {"deadline": ex.approval_deadline}, ex.id)
    return finish(conn, ex, State.EXPIRED, "bot", "no approval before the deadline",
                             expect=expect)
