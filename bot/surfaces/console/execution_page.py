"""GET /ui/executions/{id}: one execution's whole trail: the plan its approvers saw, the
decisions on it, its steps and checks, who steered it, its runbook version, and each of its
audit events with its place in the chain checked. Secrets masked; 404 for what the viewer
may not see."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

from bot.execution import executions
from bot.execution.executions import Execution
from bot.runbooks import versions
from bot.store import queries
from bot.store.db import Connection
from bot.store.words import Kind
from bot.surfaces.console import trail
from bot.surfaces.console.app import Ask, BadRequest, NotFound, PageRoute
from bot.surfaces.console.scope import masked, masked_text, secret_values, visible

MAX_ID = 2**63 - 1  # the largest ID a database column holds


@dataclass(frozen=True)
class Decision:
    user: str
    decision: str  # approve | deny
    plan_hash: str
    at: str
    reason: str
    surface: str  # where it was given, when the log says
    current: bool  # bound to the plan the execution has now
    seq: int | None  # its audit event


def execution(ask: Ask) -> Response:
    execution_id = parse_id(str(ask.path["id"]))
    with ask.service.db.connect() as conn:
        ex = _visible(ask, conn, execution_id)
        hidden = secret_values(ex.params)
        events = trail.events(conn, ex.id, hidden)
        decided = decisions(conn, ex, events, hidden)
        asked = [masked(dict(row), hidden) for row in queries.questions(conn, ex.id)]
        previous = versions.before(conn, ex.runbook, ex.version)
    return ask.page(
        "execution.html", ex=ex, params=masked(ex.params, hidden),
        error=masked_text(ex.error or "", hidden), plan=masked(ex.plan.body(), hidden),
        requested=_first(events, Kind.REQUESTED), plans=trail.of_kinds(events, trail.PLAN_KINDS),
        decisions=decided, refusals=trail.of_kinds(events, [Kind.APPROVAL_REFUSED]),
        attempts=trail.attempts(events), undo_starts=trail.undo_starts(events),
        checks=trail.checks(events), steering=trail.of_kinds(events, trail.STEERING),
        confirmations=asked, previous=previous, events=events,
        nodes=sorted(lock.removeprefix("node:") for lock in ex.plan.locks
                     if lock.startswith("node:")),
        broken=[event for event in events if not event.mark.ok])


def parse_id(text: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise BadRequest(f"an execution ID is a number, not {text[:40]!r}")
    if len(text) > 19 or int(text) > MAX_ID:
        raise NotFound(f"there is no execution {text[:40]}")
    return int(text)


def _visible(ask: Ask, conn: Connection, execution_id: int) -> Execution:
    """The execution, when this viewer may see it; the same 404 when it does not exist."""
    try:
        ex = executions.get(conn, execution_id)
    except executions.NotFound:
        ex = None
    if ex is None or not visible(ask.viewer, ex.runbook, ask.service.config):
        raise NotFound(f"there is no execution {execution_id}")
    return ex


def decisions(conn: Connection, ex: Execution, events: list[trail.Event],
              hidden: frozenset[str] = frozenset()) -> list[Decision]:
    """Every approval and denial, each bound to the plan hash its author saw, with where it
    was given when the audit event says (approved ahead on a schedule or a window)."""
    said = {(e.actor, e.kind, str(e.data.get("plan_hash", ""))): e for e in events
            if e.kind in (Kind.APPROVED, Kind.DENIED)}
    found = []
    for row in queries.decisions(conn, ex.id):
        kind = Kind.APPROVED if row["decision"] == "approve" else Kind.DENIED
        event = said.get((row["user"], kind, row["plan_hash"]))
        found.append(Decision(row["user"], row["decision"], row["plan_hash"], row["at"],
                              masked_text(row["reason"] or "", hidden), _surface(event),
                              row["plan_hash"] == ex.plan_hash, event.seq if event else None))
    return found


def _surface(event: trail.Event | None) -> str:
    if event is None:
        return "not in the log"
    data: dict[str, Any] = event.data
    if data.get("ahead"):
        return f"approved ahead, on {data['ahead']}"
    return str(data.get("source") or data.get("surface") or "not recorded")


def _first(events: list[trail.Event], kind: Kind) -> trail.Event | None:
    return next((event for event in events if event.kind == kind), None)


ROUTES: list[PageRoute] = [("/executions/{id}", execution, ("GET",))]
