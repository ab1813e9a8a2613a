"""One command grammar for every chat surface, answered by the core (``handle``).

No business logic here: the ``Service`` decides and records everything, and this module
knows no chat surface (Slack and ``runbook chat`` call it).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable

from adapters.actions import ActionError
from bot import commands
from bot.alerts import breaker
from bot.execution.planning import approval_policy
from bot.runbooks.model import STEP_ID
from bot.runbooks.params import ParamError, params_text
from bot.service import Service
from bot.store.words import State
from bot.surfaces import rendering
from bot.surfaces.chat import scheduled
from bot.surfaces.chat.ids import is_id
from bot.surfaces.chat.reply import Reply
from bot.surfaces.chat.words import parse_assignments, split_words
from kit.errors import Refused

HELP = """\
runbook commands:
  list                          the runbooks
  describe NAME                 parameters, approval policy and steps
  plan NAME key=value...        the exact plan and its hash; changes nothing
  run NAME key=value...         request an execution (approvers are asked);
                                change=REF gives a change or incident reference
  approve ID [PLAN_HASH]        approve the plan you saw (its hash's first 6+ characters)
  deny ID [reason]              deny a request
  cancel ID                     stop at the next step and undo
  status ID | show ID           one execution, or its timeline
  history [node=NAME]           recent executions
  node NAME                     Slurm, Kubernetes and GPU telemetry of a node
  confirm ID [yes|no]           answer the question a running step asks
  proposals                     runbooks proposed by alerts
  proposal run ID | proposal dismiss ID [reason]
  breaker [status] | breaker reset REASON   automation's breaker (reset: approvers)
  schedule add NAME key=value... cron="0 2 * * SAT" [tz=Europe/Istanbul] [approve=ahead]
  schedule add NAME key=value... at="2026-12-05 02:00" [tz=ZONE] [approve=ahead]
  schedule [list [all]] | show ID | approve ID | pause ID | resume ID | remove ID
  window create NODES start=now|"2026-12-05 02:00" duration=4h [reason=TEXT]
                [runbooks="NAME key=value...; NAME key=value..."] [tz=ZONE]
  window [list [all]] | show ID | approve ID | open ID | cancel ID
Quote values with spaces: run drain-node node=gpu07 reason="XID 79 on GPU 3\""""


Command = Callable[[Service, list[str], str], Reply]


def handle(service: Service, line: str, user: str) -> Reply:
    """Answer one line of chat from ``user``::

        help | list | describe NAME | plan NAME k=v... | run NAME k=v... | approve ID
        | deny ID [reason] | cancel ID | status ID | show ID | history [node=N] | node NAME
        | confirm ID [yes|no] [step=STEP] [plan=HASH] | proposals | proposal run ID
        | proposal dismiss ID [reason]
        | schedule ... | window ...   (bot.surfaces.chat.scheduled)

    Any text gets a helpful answer, never a stack trace: unknown commands and runbooks
    come with suggestions, bad parameters with what is wrong.
    """
    try:
        words = split_words(line.strip().removeprefix("/runbook").strip())
    except ParamError as exc:
        return Reply(str(exc), ok=False)
    if not words:
        return Reply(HELP)
    verb, args = words[0].lower(), words[1:]
    command = COMMANDS.get(verb)
    if command is None:
        hint = difflib.get_close_matches(verb, sorted(COMMANDS), n=1)
        suggestion = f' Did you mean "{hint[0]}"?' if hint else ""
        return Reply(f'I do not know "{verb[:40]}".{suggestion} Try "help".', ok=False)
    try:
        return command(service, args, user)
    except (Refused, ParamError, ActionError) as exc:
        return Reply(str(exc), ok=False)
    except _Usage as exc:
        return Reply(f"usage: {exc}", ok=False)


class _Usage(Exception):
    """The command's words are wrong; the message is the command's usage."""


# What a line does, for a surface that lets some people only read (Slack users the
# configuration does not name): "read" changes nothing; "decide" approves, denies or answers
# for a run (approve, deny, confirm, schedule approve, window approve); "act" is the rest.
READ_VERBS = ("help", "list", "describe", "status", "show", "history", "node", "proposals")
DECIDE_VERBS = frozenset({"approve", "deny", "confirm"})
NOUNS_WITH_READS = frozenset({"schedule", "window"})  # their list and show read


def kind_of(line: str) -> str:
    """"read", "decide" or "act": what ``line`` would do if it were answered."""
    try:
        words = split_words(line.strip().removeprefix("/runbook").strip())
    except ParamError:
        return "read"  # answered with what is wrong in it, nothing else
    verb = words[0].lower() if words else "help"
    sub = words[1].lower() if len(words) > 1 else "list"
    if verb in READ_VERBS or verb not in COMMANDS:  # an unknown verb gets a suggestion
        return "read"
    if verb in DECIDE_VERBS or (verb in NOUNS_WITH_READS and sub == "approve"):
        return "decide"
    if verb in NOUNS_WITH_READS and sub in ("list", "show"):
        return "read"
    if verb == "breaker" and sub in ("list", "status"):
        return "read"
    return "act"


def _one_id(args: list[str], usage: str) -> int:
    if not args or not is_id(args[0]):
        raise _Usage(usage)
    return int(args[0])


def _help(service: Service, args: list[str], user: str) -> Reply:
    return Reply(HELP)


def _list(service: Service, args: list[str], user: str) -> Reply:
    lines = [f"{name} {rb.runbook.version} ({rb.runbook.risk}): {rb.runbook.summary}"
             for name, rb in sorted(service.runbooks().items())]
    return Reply("\n".join(lines))


def _describe(service: Service, args: list[str], user: str) -> Reply:
    if len(args) != 1:
        raise _Usage("describe NAME")
    loaded = service.runbook(args[0])
    policy = approval_policy(loaded.runbook, service.config).describe()
    return Reply(rendering.describe_text(loaded, policy))


def _plan(service: Service, args: list[str], user: str) -> Reply:
    if not args:
        raise _Usage("plan NAME key=value...")
    plan = service.plan(args[0], parse_assignments(args[1:]))
    return Reply(rendering.plan_text(plan))


def _run(service: Service, args: list[str], user: str) -> Reply:
    if not args:
        raise _Usage("run NAME key=value...")
    execution_id = service.request(args[0], parse_assignments(args[1:]), user, source="chat")
    ex = service.get(execution_id)
    waiting = (f"waiting for approval: {ex.plan.approval.describe()} (approve {ex.id} "
               f"{ex.plan_hash[:12]})" if ex.state == State.AWAITING_APPROVAL
               else "queued: it runs now")
    return Reply(f"execution {ex.id}: {ex.runbook} {ex.version} requested by {user}; {waiting}",
                 execution_id=ex.id)


def _approve(service: Service, args: list[str], user: str) -> Reply:
    if len(args) > 2:
        raise _Usage("approve ID [PLAN_HASH]")
    ex = service.approve(_one_id(args, "approve ID [PLAN_HASH]"), user, source="chat",
                     plan_hash=args[1] if len(args) > 1 else None)
    have = len(service.approvals(ex.id))
    return Reply(f"execution {ex.id}: approved by {user} ({have}/{ex.approvals_required}), "
                 f"plan {ex.plan_hash[:12]}; now {ex.state}", execution_id=ex.id)


def _deny(service: Service, args: list[str], user: str) -> Reply:
    execution_id = _one_id(args, "deny ID [reason]")
    ex = service.deny(execution_id, user, " ".join(args[1:]) or None, source="chat")
    return Reply(f"execution {ex.id}: denied by {user}; nothing was run", execution_id=ex.id)


def _cancel(service: Service, args: list[str], user: str) -> Reply:
    ex = service.cancel(_one_id(args, "cancel ID"), user)
    what = "cancelled" if ex.terminal else "cancel requested: it stops at the next step and undoes"
    return Reply(f"execution {ex.id}: {what}", execution_id=ex.id)


def _status(service: Service, args: list[str], user: str) -> Reply:
    ex = service.get(_one_id(args, "status ID"))
    return Reply(rendering.status_text(ex, service.approvals(ex.id), service.step_states(ex.id)),
                 execution_id=ex.id)


def _show(service: Service, args: list[str], user: str) -> Reply:
    ex, events = service.timeline(_one_id(args, "show ID"))
    text = rendering.status_text(ex, service.approvals(ex.id), service.step_states(ex.id))
    return Reply(text + "\n\n"
                 + rendering.timeline_text(events), execution_id=ex.id)


def _history(service: Service, args: list[str], user: str) -> Reply:
    filters = parse_assignments(args)
    unknown = set(filters) - {"node", "runbook", "user"}
    if unknown:
        raise _Usage("history [node=NAME] [runbook=NAME] [user=NAME]")
    found = service.history(runbook=filters.get("runbook"), user=filters.get("user"),
                            node=filters.get("node"), limit=20)
    lines = [f"{ex.id}: {ex.runbook} {ex.state} ({ex.requested_by}, {ex.requested_at[:19]}) "
             f"{params_text(ex.params)}" for ex in found[:20]]
    return Reply("\n".join(lines) or "no executions")


def _node(service: Service, args: list[str], user: str) -> Reply:
    from bot.surfaces import nodeview

    if len(args) != 1:
        raise _Usage("node NAME")
    if args[0] not in service.inventory.nodes:
        hint = difflib.get_close_matches(args[0], sorted(service.inventory.nodes), n=3)
        return Reply(f'"{args[0][:63]}" is not a known node'
                     + (f" (did you mean {', '.join(hint)}?)" if hint else ""), ok=False)
    return Reply(nodeview.text(nodeview.build(service, args)[0]))


ANSWERS = {"yes": True, "y": True, "true": True, "no": False, "n": False, "false": False}
PLAN_HASH = re.compile(r"^[0-9a-f]{64}$")


def _confirm(service: Service, args: list[str], user: str) -> Reply:
    """``confirm ID [yes|no]``; a Yes/No button adds ``step=STEP plan=HASH``, the question
    and the plan it was posted for, so that a stale button answers nothing."""
    usage = "confirm ID [yes|no]"
    execution_id = _one_id(args, usage)
    rest = args[1:]
    yes = True
    if rest and "=" not in rest[0]:
        word = rest.pop(0).lower()
        if word not in ANSWERS:
            raise _Usage(usage)
        yes = ANSWERS[word]
    given = parse_assignments(rest)
    step, plan_hash = given.pop("step", None), given.pop("plan", None)
    if (given or (step is not None and not STEP_ID.fullmatch(step))
            or (plan_hash is not None and not PLAN_HASH.fullmatch(plan_hash))):
        raise _Usage(usage + " [step=STEP] [plan=HASH]")
    question = service.confirm(execution_id, user, yes, None, step=step, plan_hash=plan_hash)
    return Reply(f"execution {execution_id}: {user} answered {'yes' if yes else 'no'} to "
                 f"{question!r}", execution_id=execution_id)


def _proposals(service: Service, args: list[str], user: str) -> Reply:

    found = commands.list_proposals(service)
    lines = [f"{p.id}: {p.alertname} -> {p.runbook} {params_text(p.params)}"
             + (f" ({p.note})" if p.note else "") for p in found]
    return Reply("\n".join(lines) or "no open proposals")


def _proposal(service: Service, args: list[str], user: str) -> Reply:

    usage = "proposal run ID | proposal dismiss ID [reason]"
    if len(args) < 2 or args[0] not in ("run", "dismiss"):
        raise _Usage(usage)
    proposal_id = _one_id(args[1:], usage)
    if args[0] == "run":
        execution_id = commands.run_proposal(service, proposal_id, user)
        ex = service.get(execution_id)
        return Reply(f"proposal {proposal_id}: execution {ex.id} ({ex.runbook}) requested by "
                     f"{user}; {ex.state.replace('_', ' ')}", execution_id=ex.id)
    proposal = commands.dismiss_proposal(service, proposal_id, user, " ".join(args[2:]) or None)
    return Reply(f"proposal {proposal.id}: dismissed by {user}")


def _breaker(service: Service, args: list[str], user: str) -> Reply:
    usage = "breaker [status] | breaker reset REASON"
    if not args or args[0].lower() == "status":
        return Reply(breaker.status_text(commands.breaker_status(service)))
    if args[0].lower() != "reset" or len(args) < 2:
        raise _Usage(usage)
    now = commands.reset_breaker(service, user, " ".join(args[1:]))
    return Reply(f"breaker reset by {user}\n{breaker.status_text(now)}")


COMMANDS: dict[str, Command] = {
    "help": _help, "list": _list, "describe": _describe, "plan": _plan, "run": _run,
    "approve": _approve, "deny": _deny, "cancel": _cancel, "status": _status, "show": _show,
    "history": _history, "node": _node, "confirm": _confirm, "proposals": _proposals,
    "proposal": _proposal, "breaker": _breaker,
    "schedule": lambda service, args, user: scheduled.schedule(service, args, user),
    "window": lambda service, args, user: scheduled.window(service, args, user),
}

