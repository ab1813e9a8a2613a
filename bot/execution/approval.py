"""Who may decide on a run, and who may steer one: the two rules every surface shares.

Requests, approvals ahead, schedules and windows all ask these functions; nothing here
reads or writes the database.
"""

from __future__ import annotations

from bot.config import Config
from bot.execution.planning import ApprovalPolicy

NOBODY_FIX = "set approvers: in the configuration or approval.approvers in the runbook"


def unapprovable(policy: ApprovalPolicy, runbook: str,
                 requester: str | None = None) -> str | None:
    """Why no request of ``runbook`` under ``policy`` could ever be approved, or None: it
    needs approvals and names no approver (the configuration's ``approvers`` default to
    nobody), or names only people (``user:``) and fewer of them than it needs (the
    ``requester`` not counted unless the policy allows self-approval). Refused when it is
    asked for, rather than left waiting until it expires."""
    if policy.required == 0:
        return None
    needs = "1 approval" if policy.required == 1 else f"{policy.required} approvals"
    if not policy.approvers:
        return f"{runbook} needs {needs} but nobody may approve it: {NOBODY_FIX}"
    if not all(p.startswith("user:") for p in policy.approvers):
        return None  # "*" or a group: how many may approve is not known here
    named = {p.removeprefix("user:") for p in policy.approvers}
    if requester is not None and not policy.self_approval:
        named.discard(requester)
    if len(named) >= policy.required:
        return None
    who = ", ".join(sorted(named)) or "nobody"
    return (f"{runbook} needs {needs} but only {len(named)} person(s) may give one ({who}"
            + (f"; {requester} asked and may not approve it" if requester in
               {p.removeprefix("user:") for p in policy.approvers} else "")
            + f"): {NOBODY_FIX}")


def approval_problem(config: Config, policy: ApprovalPolicy, runbook: str, approver: str,
                     requester: str, *, asked: str | None = None,
                     denying: bool = False) -> str | None:
    """Why ``approver`` may not approve ``runbook`` asked for by ``requester``, or None.

    The runbook's approvers only, and not the requester unless the policy allows it (a
    requester may still deny). ``asked`` says what the requester did, for the message.
    """
    if not policy.approvers:
        return f"nobody may approve {runbook}: {NOBODY_FIX}"
    if not config.matches(approver, policy.approvers):
        return (f"{approver} may not approve {runbook}: its approvers are "
                f"{', '.join(policy.approvers)}")
    if approver == requester and not policy.self_approval and not denying:
        return f"{approver} {asked or f'requested {runbook}'} and may not approve it too"
    return None


def may_steer(config: Config, user: str, owner: str, approvers: list[str]) -> bool:
    """Cancel, resume, pause, remove, open early: whoever asked for the thing (the
    requester of an execution, the creator of a schedule or window) or one of the approvers
    of the runbook it runs."""
    return user == owner or config.matches(user, approvers)
