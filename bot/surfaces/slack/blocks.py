"""Block Kit for plans, progress, summaries and proposals (with a plain-text fallback)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bot.execution import locking
from bot.execution.executions import Execution, StepState
from bot.execution.planning import Plan, PlannedCheck
from bot.runbooks.params import params_text
from bot.store.words import State
from bot.surfaces.fleet_text import fleet_line, node_status
from kit.durations import format_duration

# Block Kit limits: 3000 characters per section text, 50 blocks per message.
SECTION_LIMIT = 2900
STEP_MARK = {"pending": "⚪", "running": "🔵", "succeeded": "✅", "failed": "❌",
             "skipped": "⏭️", "undone": "↩️", "undo_failed": "⚠️"}
STATE_MARK = {State.AWAITING_APPROVAL: "🟡", State.APPROVED: "🟢", State.RUNNING: "🔵",
              State.UNDOING: "🟠", State.HELD: "⏸️", State.SUCCEEDED: "✅", State.FAILED: "❌",
              State.DENIED: "⛔", State.EXPIRED: "⌛", State.CANCELLED: "🚫"}


@dataclass(frozen=True)
class Message:
    text: str  # the notification / fallback text
    blocks: list[dict[str, Any]]


def _section(text: str) -> dict[str, Any]:
    if len(text) > SECTION_LIMIT:
        text = text[:SECTION_LIMIT] + "…"
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def _context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text[:SECTION_LIMIT]}]}


def _button(text: str, action_id: str, value: str, style: str | None = None) -> dict[str, Any]:
    button: dict[str, Any] = {"type": "button", "action_id": action_id, "value": value,
                              "text": {"type": "plain_text", "text": text}}
    if style:
        button["style"] = style
    return button


def _code(lines: Sequence[str]) -> str:
    return "```" + "\n".join(lines).replace("```", "'''") + "```"


def _title(ex: Execution) -> str:
    mark = STATE_MARK.get(ex.state, "")
    return (f"{mark} *{ex.runbook} {ex.version}* — execution {ex.id} — "
            f"*{ex.state.replace('_', ' ')}*")


def _checks(title: str, checks: list[PlannedCheck]) -> list[str]:
    active = [c for c in checks if not c.skipped]
    if not active:
        return []
    return [f"*{title}*"] + [
        f"• {c.name}" + (f" (expect {c.expect})" if c.expect else "") for c in active]


def capacity_lines(plan: Plan) -> list[str]:
    guards = [c for c in plan.pre_checks if c.kind == "capacity" and not c.skipped]
    lines = [f"• {c.name}: " + ", ".join(f"{k} {v}" for k, v in c.spec.items()) for c in guards]
    lines += [f"• now: {line}" for line in plan.capacity]
    if plan.break_glass:
        lines.append("• break-glass (one extra approval): the runbook's capacity floor is "
                     "overridden, never the site floor")
    lines += [f"• break-glass: {guard.describe()}" for guard in plan.weakened_guards]
    if plan.outside_window:
        lines.append("• outside a maintenance window: the runbook requires one, so this "
                     "needs one extra (break-glass) approval")
    return lines or ["• no capacity guard in this runbook"]


def plan_message(ex: Execution, approvers: list[str], now: float | None = None) -> Message:
    """The request as people decide on it: operations, locks, capacity, checks, risk."""
    plan = ex.plan
    operations = [f"{n}. {s.id}: " + "; ".join(s.operations)
                  for n, s in enumerate(plan.steps, 1) if not s.skipped]
    blocks = [
        _section(_title(ex)),
        _context(f"requested by *{ex.requested_by}* · risk *{plan.risk}* · "
                 + (f"change `{plan.change}` · " if plan.change else "")
                 + f"parameters `{params_text(plan.params)}`"),
        _section("*Operations*\n" + _code(operations or ["(none)"])),
        _section("*Locks*: "
                 + (", ".join(f"`{lock}`" for lock in locking.compact(plan.locks))
                    or "none")
                 + "\n*Capacity*\n" + "\n".join(capacity_lines(plan))),
    ]
    checks = _checks("Pre-checks", plan.pre_checks) + _checks("Post-checks", plan.post_checks)
    if checks:
        blocks.append(_section("\n".join(checks)))
    if plan.warnings:  # a repeat offender, an alert that resolved since it proposed this
        blocks.append(_section("\n".join(f"⚠️ *{w}*" for w in plan.warnings)))
    blocks.append(_section(_approval_line(ex, approvers, now)))
    if ex.state == State.AWAITING_APPROVAL:
        value = f"{ex.id}:{ex.plan_hash}"
        blocks.append({"type": "actions", "block_id": f"decide-{ex.id}", "elements": [
            _button("Approve", "approve", value, "primary"),
            _button("Deny", "deny", value, "danger")]})
    blocks.append(_context(f"plan hash `{ex.plan_hash[:16]}` · `runbook show {ex.id}`"))
    text = (f"{ex.runbook} {ex.version} execution {ex.id} requested by {ex.requested_by}: "
            f"{ex.state.replace('_', ' ')}")
    return Message(text, blocks)


def _approval_line(ex: Execution, approvers: list[str], now: float | None) -> str:
    line = (f"*Approval*: {len(approvers)}/{ex.approvals_required} "
            f"({ex.plan.approval.describe()})")
    if approvers:
        line += " — approved by " + ", ".join(approvers)
    if ex.state == State.AWAITING_APPROVAL and ex.approval_deadline is not None:
        left = max(0.0, ex.approval_deadline - (now or time.time()))
        at = time.strftime("%H:%M UTC", time.gmtime(ex.approval_deadline))
        line += f"\n⏳ expires at {at} (in {int(left // 60)} min)"
    return line


def step_lines(ex: Execution, states: dict[tuple[str, str], StepState]) -> list[str]:
    lines = []
    for step in ex.plan.steps:
        do = states.get(("do", step.id))
        undo = states.get(("undo", step.id))
        state = "skipped" if step.skipped else (do.state if do else "pending")
        if undo is not None:
            state = "undone" if undo.state == "succeeded" else (
                "undo_failed" if undo.state == "failed" else state)
        lines.append(f"{STEP_MARK.get(state, '•')} {step.id} — {state.replace('_', ' ')}")
        status = node_status(do.result) if do is not None and undo is None else None
        if status is not None:  # a step over many nodes: its node states, in this message
            lines.append(f"      {fleet_line(status)}")
    return lines


def progress_message(ex: Execution, approvers: list[str],
                     states: dict[tuple[str, str], StepState]) -> Message:
    """The root message once the request is decided: a line per step."""
    if ex.state == State.AWAITING_APPROVAL:
        return plan_message(ex, approvers)
    blocks = [
        _section(_title(ex)),
        _context(f"requested by *{ex.requested_by}*"
                 + (f" · approved by {', '.join(approvers)}" if approvers else "")
                 + f" · parameters `{params_text(ex.params)}`"),
        _section("\n".join(step_lines(ex, states)) or "no steps"),
    ]
    if ex.error:
        blocks.append(_section(f"*{'Reason' if ex.terminal else 'Note'}*: {ex.error}"))
    if ex.state in (State.RUNNING, State.APPROVED, State.HELD):
        blocks.append({"type": "actions", "block_id": f"steer-{ex.id}", "elements": [
            _button("Cancel", "cancel", str(ex.id), "danger")]})
    blocks.append(_context(f"details in the thread · `runbook show {ex.id}`"))
    return Message(f"{ex.runbook} execution {ex.id}: {ex.state}", blocks)


def summary_text(ex: Execution, checks: list[dict[str, Any]], duration: float | None) -> str:
    """The final word in the thread: outcome, duration, every check's result, the ID."""
    lines = [f"{STATE_MARK.get(ex.state, '')} *{ex.runbook} {ex.version}* execution {ex.id} "
             f"ended *{ex.state}*" + (f" after {format_duration(duration)}" if duration else "")]
    if ex.error:
        lines.append(f"reason: {ex.error}")
    if checks:
        lines.append("*Checks*")
        lines += [f"{'✅' if c['passed'] else '❌'} {c['check']}: value {c['value']} "
                  f"({c['detail']})" for c in checks]
    else:
        lines.append("no check was evaluated")
    lines.append(f"audit: `runbook show {ex.id}` · `runbook audit verify`")
    return "\n".join(lines)


def proposal_message(proposal: Any) -> Message:
    params = params_text(proposal.params)
    head = (f"🚨 *{proposal.alertname}* proposes *{proposal.runbook}* `{params}` "
            f"(proposal {proposal.id}, alert {proposal.alert_status})")
    blocks = [_section(head)]
    if proposal.state == "open":
        if proposal.note:  # why this runbook: the XID table, a repeat offender
            blocks.append(_context(proposal.note))
        value = str(proposal.id)
        blocks.append({"type": "actions", "block_id": f"proposal-{proposal.id}", "elements": [
            _button("Run", "run_proposal", value, "primary"),
            _button("Dismiss", "dismiss_proposal", value)]})
    else:
        extra = f" as execution {proposal.execution_id}" if proposal.execution_id else ""
        blocks.append(_context(f"{proposal.state}{extra}"
                               + (f": {proposal.note}" if proposal.note else "")))
    return Message(f"{proposal.alertname}: proposes {proposal.runbook} {params}", blocks)


def confirm_message(execution_id: int, step_id: str, question: str, plan_hash: str) -> Message:
    """The question with Yes/No buttons that carry the step and the plan it was asked for:
    a click that no longer matches what is pending is refused, never answers another."""
    value = f"{execution_id}:{step_id}:{plan_hash}"
    return Message(f"execution {execution_id} asks: {question}", [
        _section(f"❓ *{question}* (execution {execution_id}, step `{step_id}`)"),
        {"type": "actions", "block_id": f"confirm-{execution_id}", "elements": [
            _button("Yes", "confirm_yes", value, "primary"),
            _button("No", "confirm_no", value, "danger")]},
    ])


def answered_message(question: str, answer: str, who: str) -> Message:
    return Message(f"{question}: {answer} ({who})",
                   [_section(f"❓ *{question}* — answered *{answer}* by {who}")])
