"""Text for people: plans, statuses and timelines, as the terminal and chat show them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from bot.execution import locking
from bot.execution.executions import Execution, StepState
from bot.execution.planning import Plan, PlannedCheck
from bot.runbooks.loading import LoadedRunbook
from bot.runbooks.params import params_text, value_text
from bot.store.words import UNDER_WAY, Kind
from bot.surfaces.fleet_text import fleet_line, node_status
from kit.durations import format_duration


def plan_text(plan: Plan) -> str:
    lines = [
        f"plan for {plan.runbook} {plan.version} (risk {plan.risk})",
        "parameters: " + params_text(plan.params),
        "locks: " + (", ".join(locking.compact(plan.locks)) or "none"),
        "approval: " + plan.approval.describe()
        + (" (break-glass: one more approval; the runbook's capacity floor is overridden, "
           "never the site floor)" if plan.break_glass else "")
        + (" (outside a maintenance window: the runbook requires one, so one more approval)"
           if plan.outside_window else ""),
    ]
    lines += [f"break-glass: {guard.describe()}" for guard in plan.weakened_guards]
    lines += [f"change: {plan.change}"] if plan.change else []
    lines += _checks("pre-checks", plan.pre_checks)
    lines += [f"capacity now: {line}" for line in plan.capacity]
    lines.append("steps:")
    for number, step in enumerate(plan.steps, 1):
        if step.skipped:
            lines.append(f"  {number}. {step.id} [{step.action}]: skipped (when is false)")
            continue
        lines.append(f"  {number}. {step.id} [{step.action}]"
                     + (f" (retries {step.retries})" if step.retries else ""))
        lines += [f"       {op}" for op in step.operations]
        if step.undo is not None:
            lines += [f"       undo: {op}" for op in step.undo.operations]
    lines += _checks("post-checks", plan.post_checks)
    if plan.on_failure == "leave":
        lines.append("on failure: completed steps are left as they are")
    if plan.propose_on_failure:
        follow = plan.propose_on_failure
        steps = follow.get("after_step") or []
        steps = [steps] if isinstance(steps, str) else steps
        when = f"if step {' or '.join(steps)} fails" if steps else "if it fails"
        lines.append(f"{when}: propose {follow['runbook']} "
                     f"{params_text(follow['params'])} (a person decides to run it)")
    lines += [f"WARNING: {warning}" for warning in plan.warnings]
    lines.append(f"plan hash: {plan.hash}")
    return "\n".join(lines)


def _checks(title: str, checks: list[PlannedCheck]) -> list[str]:
    if not checks:
        return [f"{title}: none"]
    lines = [f"{title}:"]
    for check in checks:
        if check.skipped:
            lines.append(f"  - {check.name}: skipped (when is false)")
            continue
        spec = ", ".join(f"{k} {v if isinstance(v, str) else readable(v)}"
                         for k, v in check.spec.items())
        expect = f", expect {check.expect}" if check.expect else ""
        held = f" for {format_duration(check.for_seconds)}" if check.for_seconds else ""
        lines.append(f"  - {check.name}: {spec}{expect}{held}")
    return lines


def readable(value: Any) -> str:
    """A value of a plan as people write it: ``pool_of=gpu07 min_free_gpus_after=8`` for a
    mapping, ``gpu01,gpu02`` for a list, never a Python repr."""
    if isinstance(value, Mapping):
        return " ".join(f"{k}={_nested(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ",".join(_nested(v) for v in value)
    return value_text(value)


def _nested(value: Any) -> str:
    return f"({readable(value)})" if isinstance(value, Mapping) else readable(value)


def describe_text(loaded: LoadedRunbook, policy: str) -> str:
    rb = loaded.runbook
    lines = [f"{rb.name} {rb.version} (risk {rb.risk}): {rb.summary}"]
    if rb.description:
        lines += ["", rb.description.strip(), ""]
    lines.append("parameters:" if rb.params else "parameters: none")
    for name, spec in rb.params.items():
        flags = "required" if spec.required else (
            f"default {spec.default}" if spec.default is not None else "optional")
        extra = f" one of {', '.join(spec.choices)}" if spec.choices else ""
        if spec.weakens_guard is not None:
            how = {"lower": "a lower", "higher": "a higher"}.get(spec.weakens_guard, "any other")
            flags += f"; {how} value weakens a guard: break-glass"
        lines.append(f"  {name} ({spec.type}, {flags}){extra}: {spec.description}".rstrip(": "))
    lines.append(f"approval: {policy}")
    lines.append("steps: " + ", ".join(f"{s.id} [{s.action}]" for s in rb.steps))
    lines.append(f"resume after a crash: {rb.resume}; on failure: {rb.on_failure}")
    lines.append(f"file: {loaded.path}  content sha256: {loaded.content_hash}")
    return "\n".join(lines)


def status_text(ex: Execution, approvers: list[str],
                states: Mapping[tuple[str, str], StepState] | None = None) -> str:
    lines = [
        f"execution {ex.id}: {ex.runbook} {ex.version} — {ex.state.upper()}",
        "parameters: " + params_text(ex.params),
        f"requested by {ex.requested_by} at {ex.requested_at}",
    ]
    if ex.approvals_required:
        lines.append(f"approvals: {len(approvers)}/{ex.approvals_required}"
                     + (f" ({', '.join(approvers)})" if approvers else "")
                     + f" — {ex.plan.approval.describe()}")
    if ex.state in UNDER_WAY:
        lines.append(f"stage: {ex.stage}")
    if ex.error:
        lines.append(f"{'reason' if ex.terminal else 'note'}: {ex.error}")
    for step_id, status in _node_states(states or {}):
        lines.append(f"{step_id}: {fleet_line(status)}")
    if ex.finished_at:
        lines.append(f"finished at {ex.finished_at}")
    lines.append(f"runbook content sha256 {ex.content_hash}; plan hash {ex.plan_hash}")
    return "\n".join(lines)


def _node_states(states: Mapping[tuple[str, str], StepState]
                 ) -> list[tuple[str, Mapping[str, Any]]]:
    """The steps over many nodes that published their node states (fleet_text)."""
    found = []
    for (phase, step_id), state in sorted(states.items(), key=lambda i: i[1].position):
        status = node_status(state.result) if phase == "do" else None
        if status is not None:
            found.append((step_id, status))
    return found


def timeline_text(events: Iterable[dict[str, Any]]) -> str:
    return "\n".join(
        f"{e['ts']}  #{e['seq']:<6} {e['kind']:<22} {e['actor']:<10} {event_detail(e)}"
        for e in events
    )


def event_detail(event: dict[str, Any]) -> str:
    """One line on what an audit event says, for a timeline."""
    data = event["data"]
    kind = event["kind"]
    if kind in (Kind.STEP_STARTED, Kind.UNDO_STARTED) and "operations" in data:
        return f"{data['step']} attempt {data['attempt']}: {'; '.join(data['operations'])}"
    if kind in (Kind.STEP_FINISHED, Kind.UNDO_FINISHED):
        return f"{data['step']}: {data.get('summary', '')}"
    if kind in (Kind.STEP_FAILED, Kind.UNDO_FAILED):
        return f"{data['step']}: {data.get('error', '')}"
    if kind == Kind.CHECK_EVALUATED:
        verdict = "passed" if data["passed"] else "FAILED"
        return f"{data['check']}: {verdict}, value {data['value']} ({data['detail']})"
    if kind == Kind.REQUESTED:
        params = " ".join(f"{k}={value_text(v)}" for k, v in data["params"].items())
        return f"{data['runbook']} {data['version']} {params} (sha256 {data['content_hash'][:12]})"
    if kind == Kind.FINISHED:
        return str(data["state"]) + (f": {data['error']}" if data.get("error") else "")
    return json.dumps(data, sort_keys=True)[:300]
