"""``--json``: what the commands that show something print for scripts, one shape each.

Each function turns what a command shows into plain JSON data; docs/json-output.md documents
every shape, and a test per command checks its keys and types. Durations are numbers of
seconds (``*_seconds``), times ISO text in UTC, as stored. Nothing here reads or changes state.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from bot.execution.executions import Execution, StepState
from bot.execution.planning import Plan
from bot.runbooks.loading import LoadedRunbook
from bot.schedule.scheduling import next_fire, utc_iso
from bot.surfaces.fleet_text import node_status


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, default=str)


def runbook_item(loaded: LoadedRunbook) -> dict[str, Any]:
    """``list`` (a list of these) and ``validate``'s ``runbooks``."""
    rb = loaded.runbook
    return {"name": rb.name, "version": rb.version, "risk": rb.risk, "summary": rb.summary,
            "path": str(loaded.path), "content_hash": loaded.content_hash}


def describe(loaded: LoadedRunbook, policy: str) -> dict[str, Any]:
    rb = loaded.runbook
    params = {name: {"type": spec.type, "required": spec.required, "default": spec.default,
                     "description": spec.description, "choices": spec.choices,
                     "weakens_guard": spec.weakens_guard}
              for name, spec in rb.params.items()}
    steps = [{"id": s.id, "action": s.action, "description": s.description,
              "undo": s.undo.action if s.undo else None} for s in rb.steps]
    return {**runbook_item(loaded), "description": rb.description, "params": params,
            "approval": policy, "steps": steps, "resume": rb.resume,
            "on_failure": rb.on_failure}


def plan(found: Plan) -> dict[str, Any]:
    """The plan as approved (its hashed body, every key present) with its hash and what is
    shown beside it (warnings, the capacity guard's numbers)."""
    return {"propose_on_failure": None, "outside_window": False, "weakened_guards": [],
            "change": None, **found.body(), "hash": found.hash, "warnings": found.warnings,
            "capacity": found.capacity}


def execution(ex: Execution, approvers: list[str],
              states: Mapping[tuple[str, str], StepState] | None = None) -> dict[str, Any]:
    """``status``, and ``show``'s ``execution``."""
    node_states = {}
    for (phase, step_id), state in sorted((states or {}).items(),
                                          key=lambda i: i[1].position):
        status = node_status(state.result) if phase == "do" else None
        if status is not None:
            node_states[step_id] = dict(status)
    return {"id": ex.id, "runbook": ex.runbook, "version": ex.version, "state": str(ex.state),
            "stage": ex.stage, "params": ex.params, "requested_by": ex.requested_by,
            "requested_at": ex.requested_at, "finished_at": ex.finished_at, "error": ex.error,
            "approvals_required": ex.approvals_required, "approved_by": approvers,
            "approval": ex.plan.approval.describe(), "break_glass": ex.break_glass,
            "change": ex.change, "source": ex.source, "plan_hash": ex.plan_hash,
            "content_hash": ex.content_hash, "node_states": node_states}


def timeline(ex: Execution, approvers: list[str], states: Mapping[tuple[str, str], StepState],
             events: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """``show``: the execution and its audit events, oldest first."""
    return {"execution": execution(ex, approvers, states),
            "events": [{**event, "kind": str(event["kind"])} for event in events]}


def validation(found: Iterable[LoadedRunbook], problems: list[str]) -> dict[str, Any]:
    return {"ok": not problems, "runbooks": [runbook_item(loaded) for loaded in found],
            "problems": problems}


def plain(value: Any) -> dict[str, Any]:
    """A stored record as its fields: ``versions``, ``proposals``, ``breaker``."""
    return dataclasses.asdict(value)


def schedule(found: Any) -> dict[str, Any]:
    coming = next_fire(found)
    return {**dataclasses.asdict(found), "when": found.when,
            "next_fire": utc_iso(coming) if coming else None}


def window(found: Any) -> dict[str, Any]:
    return {**dataclasses.asdict(found), "ends_at": utc_iso(found.end)}
