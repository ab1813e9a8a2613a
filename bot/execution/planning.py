"""Planning: render a runbook with validated parameters into concrete operations, the
``Plan`` people approve, and the approval policy it carries.

No database and no side effects here: actions are asked for their ``plan`` (the operations
they would perform), never run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import ValidationError

from adapters.actions import ActionError
from adapters.prometheus.template import query_arguments
from bot.config import Config
from bot.execution import capacity_guard
from bot.runbooks import templating
from bot.runbooks.catalogue import Catalogue, NotConfigured
from bot.runbooks.loading import LoadedRunbook
from bot.runbooks.model import DEFAULT_REQUIRED, CheckSpec, Runbook
from bot.runbooks.params import Inventory, WeakenedGuard, jsonable
from kit import hostlist
from kit.canonical import canonical
from kit.durations import format_duration, parse_duration


class PlanError(Exception):
    """The runbook cannot be planned with these values; nothing was done."""


# One node:NAME lock per node: a plan over more nodes than this is refused (split it).
MAX_PLAN_NODES = 4096


@dataclass(frozen=True)
class ApprovalPolicy:
    required: int
    approvers: list[str]
    self_approval: bool
    expires_seconds: float

    def describe(self) -> str:
        if self.required == 0:
            return "no approval needed"
        who = ", ".join(self.approvers) or "nobody (no approvers configured)"
        selfish = "" if self.self_approval else ", not the requester"
        return (f"{self.required} approval(s) from {who}{selfish}, within "
                f"{format_duration(self.expires_seconds)}")


@dataclass(frozen=True)
class PlannedCall:
    action: str
    args: dict[str, Any]
    operations: list[str]


@dataclass(frozen=True)
class PlannedStep:
    id: str
    action: str
    args: dict[str, Any]
    operations: list[str]
    skipped: bool
    undo: PlannedCall | None
    undo_if_failed: bool
    timeout_seconds: float
    retries: int
    retry_delay_seconds: float
    idempotent: bool = True  # False: after a crash in it, held for a person, never re-run


@dataclass(frozen=True)
class PlannedCheck:
    name: str
    kind: str
    spec: dict[str, Any]  # the rendered query / command / guard
    expect: str | None
    for_seconds: float
    within_seconds: float
    timeout_seconds: float
    skipped: bool = False


@dataclass(frozen=True)
class Plan:
    """What people approve: every step with its rendered arguments and the operations its
    action says it will perform, the undo of each step, the locks, the checks and the
    approval policy. Its hash is the sha256 of its canonical JSON; an approval binds to that
    hash: if planning again at run time gives another hash, the approval no longer applies.
    """

    runbook: str
    version: str
    content_hash: str
    risk: str
    params: dict[str, Any]
    locks: list[str]
    approval: ApprovalPolicy
    pre_checks: list[PlannedCheck]
    steps: list[PlannedStep]
    post_checks: list[PlannedCheck]
    on_failure: str
    # break-glass, for one extra approval: the runbook's capacity floor may be overridden
    # (never the site floor), and the parameters in weakened_guards weaken a guard
    break_glass: bool = False
    # windows: required, and no open maintenance window covers the nodes: one extra approval
    outside_window: bool = False
    hash: str = field(default="", compare=False)
    weakened_guards: list[WeakenedGuard] = field(default_factory=list)
    # if the execution fails: the runbook (and its parameters) proposed to people
    propose_on_failure: dict[str, Any] | None = None
    # advice for the approvers (a repeat offender): shown, kept, not part of the hash
    warnings: list[str] = field(default_factory=list)
    # the capacity guard's numbers when the plan was made (which nodes are counted, which
    # are already out): shown, kept, not part of the hash (they change by the minute)
    capacity: list[str] = field(default_factory=list)
    # the change or incident reference the request gave (change=REF, policy.require_change):
    # shown, and part of the hash, so an approval covers that very reference
    change: str | None = None
    # secret parameters (name -> their value encrypted with the site key), stored beside the
    # execution, never in the plan: the plan binds each by the fingerprint in its placeholder
    sealed: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def body(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("hash")
        data.pop("sealed")
        data.pop("warnings")
        data.pop("capacity")
        if data["propose_on_failure"] is None:  # absent unless set: other plans keep hashes
            data.pop("propose_on_failure")
        if not data["outside_window"]:  # absent unless set: other plans keep their hashes
            data.pop("outside_window")
        if not data["weakened_guards"]:  # likewise
            data.pop("weakened_guards")
        if data["change"] is None:  # likewise
            data.pop("change")
        return data

    def to_json(self) -> str:
        advice = {**({"warnings": self.warnings} if self.warnings else {}),
                  **({"capacity": self.capacity} if self.capacity else {})}
        return canonical({**self.body(), **advice, "hash": self.hash})


def approval_policy(runbook: Runbook, config: Config) -> ApprovalPolicy:
    spec = runbook.approval
    if spec is None:
        return ApprovalPolicy(
            required=DEFAULT_REQUIRED[runbook.risk],
            approvers=list(config.approvers),
            self_approval=False,
            expires_seconds=parse_duration(config.approval_expires),
        )
    return ApprovalPolicy(
        required=spec.required,
        approvers=list(spec.approvers) or list(config.approvers),
        self_approval=spec.self_approval,
        expires_seconds=parse_duration(spec.expires),
    )


def make_plan(
    loaded: LoadedRunbook,
    values: Mapping[str, Any],
    inventory: Inventory,
    catalogue: Catalogue,
    config: Config,
    facts: Mapping[str, Any] | None = None,
    change: str | None = None,
) -> Plan:
    """Render every step; raises PlanError with the step and the reason. ``change``: the
    request's change reference, checked by the caller (Service.plan)."""
    runbook = loaded.runbook
    context = {**inventory.facts(), "drivers": config.drivers.template_facts(), **(facts or {}),
               **values}
    default_timeout = parse_duration(config.engine.default_step_timeout)
    try:
        locks = [str(templating.render(lock, context)) for lock in runbook.locks]
        locks += node_locks(runbook_nodes(loaded, values))
        steps = [_plan_step(step, context, catalogue, default_timeout) for step in runbook.steps]
        pre = [_plan_check(c, context) for c in runbook.pre_checks]
        post = [_plan_check(c, context) for c in runbook.post_checks]
        follow_up = _plan_follow_up(runbook, context)
    except templating.TemplateProblem as exc:
        raise PlanError(str(exc)) from exc
    unguarded = capacity_guard.uncovered(steps, pre, inventory, catalogue.takes_out)
    if unguarded:
        raise PlanError("; ".join(unguarded))
    plan = Plan(
        runbook=runbook.name,
        version=runbook.version,
        content_hash=loaded.content_hash,
        risk=runbook.risk,
        params=jsonable(values),
        locks=sorted(set(locks)),
        approval=approval_policy(runbook, config),
        pre_checks=pre,
        steps=steps,
        post_checks=post,
        on_failure=runbook.on_failure,
        propose_on_failure=follow_up,
        change=change,
    )
    return _with_hash(plan)


def _plan_follow_up(runbook: Runbook, context: Mapping[str, Any]) -> dict[str, Any] | None:
    spec = runbook.propose_on_failure
    if spec is None:
        return None
    rendered = {name: str(templating.render(text, context)) for name, text in spec.params.items()}
    after = {"after_step": spec.after_step} if spec.after_step else {}  # as written
    return {"runbook": spec.runbook, "params": rendered, **after}


def runbook_nodes(loaded: LoadedRunbook, values: Mapping[str, Any]) -> set[str]:
    """The nodes a request names: the values of its ``node`` and ``nodes`` parameters
    (hostlists expanded), as the bot names them (``params.validate`` checked them against
    the inventory); PlanError for a hostlist of more than ``MAX_PLAN_NODES``, decided from
    its ranges before a name is made."""
    found: set[str] = set()
    for name, spec in loaded.runbook.params.items():
        value = values.get(name)
        if value and spec.type == "node":
            found.add(str(value))
        elif value and spec.type == "nodes":
            try:
                found.update(hostlist.expand(str(value), limit=MAX_PLAN_NODES))
            except hostlist.TooMany as exc:
                raise PlanError(_too_many(exc.count)) from None
    return found


def node_locks(nodes: set[str]) -> list[str]:
    """``node:NAME`` for each node, sorted; PlanError beyond ``MAX_PLAN_NODES``.

    A plan's locks are the runbook's own ``locks:`` plus these, for every node the request
    names in a parameter of type ``node`` or ``nodes`` (hostlists expanded, by the bot's own
    node names: the inventory's), whatever the runbook says: every node a plan touches is
    locked, one lock per node, so two requests that share a node (``gpu[01-02]`` and
    ``gpu02``) conflict whatever their runbooks' own ``locks:``.
    """
    if len(nodes) > MAX_PLAN_NODES:
        raise PlanError(_too_many(len(nodes)))
    return [f"node:{node}" for node in sorted(nodes)]


def _too_many(count: int) -> str:
    return (f"the request names {count} nodes; a plan may touch at most {MAX_PLAN_NODES} "
            "(it locks each node it touches): split it into smaller hostlists")


def with_break_glass(plan: Plan, weakened: Sequence[WeakenedGuard] = ()) -> Plan:
    """The same plan as break-glass: the runbook's capacity floor may be overridden and the
    ``weakened`` parameters weaken a guard; one more approval is needed (once, whatever the
    reasons)."""
    policy = plan.approval
    required = policy.required if plan.break_glass else policy.required + 1
    data = {**plan.__dict__, "break_glass": True,
            "weakened_guards": [*plan.weakened_guards, *weakened],
            "approval": ApprovalPolicy(required, policy.approvers, policy.self_approval,
                                       policy.expires_seconds)}
    return _with_hash(Plan(**data))


def with_outside_window(plan: Plan) -> Plan:
    """The same plan made outside a maintenance window its runbook requires: one more
    approval (the break-glass rule of ``windows: required``; the capacity guard stays)."""
    policy = plan.approval
    data = {**plan.__dict__, "outside_window": True,
            "approval": ApprovalPolicy(policy.required + 1, policy.approvers,
                                       policy.self_approval, policy.expires_seconds)}
    return _with_hash(Plan(**data))


def _with_hash(plan: Plan) -> Plan:
    digest = hashlib.sha256(canonical(plan.body()).encode()).hexdigest()
    return Plan(**{**plan.__dict__, "hash": digest})


def plan_from_json(data: Mapping[str, Any]) -> Plan:
    """The stored plan of an execution, as objects again."""

    def check(item: Mapping[str, Any]) -> PlannedCheck:
        return PlannedCheck(**item)

    def step(item: Mapping[str, Any]) -> PlannedStep:
        undo = item.get("undo")
        return PlannedStep(**{**item, "undo": PlannedCall(**undo) if undo else None})

    return Plan(
        **{
            **data,
            "approval": ApprovalPolicy(**data["approval"]),
            "pre_checks": [check(c) for c in data["pre_checks"]],
            "steps": [step(s) for s in data["steps"]],
            "post_checks": [check(c) for c in data["post_checks"]],
            "weakened_guards": [WeakenedGuard(**g) for g in data.get("weakened_guards", [])],
        }
    )


def _plan_call(
    step_id: str, action_name: str, raw: Mapping[str, Any], context: Mapping[str, Any],
    catalogue: Catalogue,
) -> PlannedCall:
    try:
        action = catalogue.get(action_name)
    except NotConfigured as exc:
        raise PlanError(f"step {step_id}: {exc}") from exc
    queries = query_arguments(action.Arguments)  # PromQL templates: one rule, as for checks
    rendered = {key: templating.render_query(value, context)
                if key in queries and isinstance(value, str) else templating.render(value, context)
                for key, value in raw.items()}
    try:
        args = action.Arguments.model_validate(rendered)
    except ValidationError as exc:
        problems = "; ".join(_problem(e) for e in exc.errors())
        raise PlanError(f"step {step_id} ({action_name}): {problems}") from exc
    try:
        _refuse_what_the_backend_cannot_do(action, args)
        operations = action.plan(args)
    except ActionError as exc:
        raise PlanError(f"step {step_id} ({action_name}): {exc}") from exc
    return PlannedCall(action_name, args.model_dump(mode="json"), operations)


def _problem(error: Any) -> str:
    """``field: what is wrong``; a check of the whole step says only what is wrong."""
    where = ".".join(str(p) for p in error["loc"])
    said = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {said}" if where else said


def _refuse_what_the_backend_cannot_do(action: Any, args: Any) -> None:
    """An action whose backend lacks an operation it needs (``refusal``: slurmrestd 22.05
    cannot drain, pyslurm cannot reboot) is refused now, before approval, not at its first
    change."""
    refusal = getattr(action, "refusal", None)
    reason = refusal(args) if callable(refusal) else None
    if reason:
        raise ActionError(reason)


def _plan_step(
    step: Any, context: Mapping[str, Any], catalogue: Catalogue, default_timeout: float
) -> PlannedStep:
    skipped = step.when is not None and not templating.condition(step.when, context)
    if skipped:
        call = PlannedCall(step.action, {}, [])
        undo = None
    else:
        call = _plan_call(step.id, step.action, step.with_, context, catalogue)
        undo = (
            _plan_call(f"{step.id} (undo)", step.undo.action, step.undo.with_, context, catalogue)
            if step.undo
            else None
        )
    return PlannedStep(
        id=step.id,
        action=step.action,
        args=call.args,
        operations=call.operations,
        skipped=skipped,
        undo=undo,
        undo_if_failed=step.undo_if_failed,
        timeout_seconds=parse_duration(step.timeout) if step.timeout else default_timeout,
        retries=step.retries,
        retry_delay_seconds=parse_duration(step.retry_delay),
        idempotent=_idempotent(step, catalogue),
    )


def _idempotent(step: Any, catalogue: Catalogue) -> bool:
    if step.idempotent is not None:
        return bool(step.idempotent)
    try:
        action = catalogue.get(step.action)
    except NotConfigured:
        return True  # a skipped step of an action not configured here: never runs
    return bool(getattr(action, "idempotent", True))


def _plan_check(check: CheckSpec, context: Mapping[str, Any]) -> PlannedCheck:
    kind = check.kind
    skipped = check.when is not None and not templating.condition(check.when, context)
    source = getattr(check, kind)
    if skipped:
        spec: dict[str, Any] = {kind: None}
    elif kind == "promql":  # values only as label values or numbers (adapters/prometheus/template)
        spec = {kind: templating.render_query(source, context)}
    else:
        spec = {kind: templating.render(source, context)}
    if check.include_silenced is False:  # only when said: other plans keep their hash
        spec["include_silenced"] = False
    return PlannedCheck(
        name=check.name,
        kind=kind,
        spec=spec,
        expect=check.expect,
        for_seconds=parse_duration(check.for_) if check.for_ else 0.0,
        within_seconds=parse_duration(check.within) if check.within else 0.0,
        timeout_seconds=parse_duration(check.timeout),
        skipped=skipped,
    )
