"""The runbook file format as pydantic models; unknown fields are errors everywhere.

A runbook is data: parameters, locks, an approval policy, checks and steps that
name actions from the adapters' catalogue. See README.md "Writing runbooks".
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kit.durations import parse_duration

SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$"
)
NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
STEP_ID = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
EXPECT = re.compile(r"^\s*(==|!=|<=|>=|<|>)\s*(-?\d+(?:\.\d+)?)\s*$")

CHECK_KINDS = ("promql", "command", "capacity", "alerts", "file", "slurm")
ParamType = Literal["node", "nodes", "text", "int", "bool", "duration", "enum", "version",
                    "mig_layout"]
# How a parameter weakens a guard (a check's floor, a blast-radius limit, a safer way of
# working): "lower" (a value below its default), "higher" (above it), "changed" (any other
# value). Such a value makes the request break-glass: see docs/writing-runbooks.md.
WeakensGuard = Literal["lower", "higher", "changed"]
Risk = Literal["low", "medium", "high"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _duration(value: str | None) -> str | None:
    if value is not None:
        parse_duration(value)
    return value


Duration = Annotated[str, Field(description="90s, 30m, 2h, 1h30m")]


class ParamSpec(Strict):
    type: ParamType
    description: str = ""
    required: bool = False
    default: Any = None
    max_length: int | None = Field(default=None, gt=0, le=10_000)
    min: float | None = None
    max: float | None = None
    choices: list[str] | None = None
    pattern: str | None = None
    weakens_guard: WeakensGuard | None = None
    # a version parameter: the parameter naming the pool whose CUDA versions the driver must
    # serve (drivers.pools.POOL.cuda); a lower driver is refused before any plan is made
    driver_for_pool: str | None = None
    # a token or password: never stored, logged or shown in clear; the plan binds it by a
    # keyed fingerprint (bot/runbooks/secrets.py, docs/writing-runbooks.md)
    secret: bool = False

    @field_validator("min", "max", mode="before")
    @classmethod
    def _limit(cls, value: Any) -> Any:
        """Limits of duration parameters may be written as durations (``max: 48h``)."""
        if isinstance(value, str):
            return parse_duration(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ParamSpec:
        if self.type == "enum" and not self.choices:
            raise ValueError("an enum parameter needs choices")
        if self.choices and self.type != "enum":
            raise ValueError("choices only apply to enum parameters")
        if self.driver_for_pool and self.type != "version":
            raise ValueError("driver_for_pool only applies to version parameters")
        if self.required and self.default is not None:
            raise ValueError("a required parameter cannot have a default")
        if self.secret:
            _secret_problem(self)
        if self.weakens_guard is not None:
            if self.default is None:
                raise ValueError("a parameter that weakens a guard needs a default (the value "
                                 "that keeps the guard as the runbook means it)")
            if self.weakens_guard != "changed" and self.type not in ("int", "duration"):
                raise ValueError(f'weakens_guard: {self.weakens_guard} applies to int and '
                                 f'duration parameters; use "changed" for a {self.type}')
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(
                    f'pattern "{self.pattern}" is not a regular expression: {exc}'
                ) from exc
        return self


def _secret_problem(spec: ParamSpec) -> None:
    if spec.type != "text":
        raise ValueError(f"secret: true applies to text parameters, not {spec.type}")
    if spec.default is not None:
        raise ValueError("a secret parameter cannot have a default (it would sit in clear in "
                         "the runbook file)")
    if spec.weakens_guard is not None:
        raise ValueError("a secret parameter cannot weaken a guard (its value is never shown)")


class ApprovalSpec(Strict):
    required: int = Field(ge=0, le=5)
    approvers: list[str] = Field(default_factory=list)
    self_approval: bool = False
    expires: Duration = "30m"

    _check_expires = field_validator("expires")(_duration)

    @field_validator("approvers")
    @classmethod
    def _principals(cls, value: list[str]) -> list[str]:
        for item in value:
            if item != "*" and not item.startswith(("group:", "user:")):
                raise ValueError(f'approver "{item}" must be "*", "group:NAME" or "user:NAME"')
        return value


class CheckSpec(Strict):
    """One pre- or post-check; exactly one kind (CHECK_KINDS)."""

    name: str = Field(min_length=1, max_length=200)
    promql: str | None = None
    command: str | None = None  # an allow-listed host command; its exit code is the value
    capacity: dict[str, Any] | None = None
    alerts: dict[str, str] | None = None
    # an alerts check: do silenced and inhibited alerts count as firing? (unset: they do)
    include_silenced: bool | None = None
    file: dict[str, Any] | None = None  # {path, max_age}: exists and is recent enough
    slurm: dict[str, Any] | None = None  # node states, accounts, slurmdbd queue
    expect: str | None = None
    for_: Duration | None = Field(default=None, alias="for")
    within: Duration | None = None  # poll until it passes, for at most this long
    when: str | None = None  # skip the check when this is false
    timeout: Duration = "60s"

    _check_durations = field_validator("for_", "within", "timeout")(_duration)

    @field_validator("expect")
    @classmethod
    def _expect(cls, value: str | None) -> str | None:
        if value is not None and not EXPECT.match(value):
            raise ValueError(f'expect "{value}" must be a comparison like "== 0" or "< 5"')
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> CheckSpec:
        kinds = [k for k in CHECK_KINDS if getattr(self, k)]
        if len(kinds) != 1:
            raise ValueError(f"a check needs exactly one of {', '.join(CHECK_KINDS)}")
        if kinds[0] in ("promql", "command") and self.expect is None:
            raise ValueError(f'a {kinds[0]} check needs expect (like "== 0")')
        if self.include_silenced is not None and kinds[0] != "alerts":
            raise ValueError("include_silenced belongs to an alerts check")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in CHECK_KINDS if getattr(self, k))


class UndoSpec(Strict):
    action: str
    with_: dict[str, Any] = Field(default_factory=dict, alias="with")


class StepSpec(Strict):
    id: str
    action: str
    with_: dict[str, Any] = Field(default_factory=dict, alias="with")
    when: str | None = None
    undo: UndoSpec | None = None
    undo_if_failed: bool = False  # also undo this step when it fails (it may have half-run)
    # may the engine run it again after a crash in it? default: what the action says
    # (host.run, chat.confirm and mariadb.restore say no); no: held for a person instead
    idempotent: bool | None = None
    timeout: Duration | None = None
    retries: int = Field(default=0, ge=0, le=10)
    retry_delay: Duration = "5s"
    description: str = ""

    _check_durations = field_validator("timeout", "retry_delay")(_duration)

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not STEP_ID.fullmatch(value):
            raise ValueError("a step id is lower-case letters, digits, - and _")
        return value


class ProposeSpec(Strict):
    """``propose_on_failure``: when the execution fails, propose this runbook to people (a
    proposal, like an alert's: it runs only when someone presses Run). Rendered at plan
    time, so the plan shows it and approvers approve it with the rest."""

    runbook: str = Field(pattern=NAME.pattern)
    params: dict[str, str] = Field(default_factory=dict)
    # only when this step (or one of these) failed: a reset, not jobs that would not
    # finish; default: any failure
    after_step: str | list[str] | None = None

    def after_steps(self) -> list[str]:
        step = self.after_step
        return [] if step is None else [step] if isinstance(step, str) else list(step)


# What a runbook does to the nodes it names, for repeat offenders and the breaker: drain
# takes them out and leaves them out, repair takes them out and returns them, resume
# returns them.
Remediation = Literal["drain", "repair", "resume"]


class Runbook(Strict):
    name: str
    version: str
    summary: str = Field(min_length=1, max_length=200)
    description: str = ""
    risk: Risk
    params: dict[str, ParamSpec] = Field(default_factory=dict)
    locks: list[str] = Field(default_factory=list)
    approval: ApprovalSpec | None = None
    pre_checks: list[CheckSpec] = Field(default_factory=list)
    steps: list[StepSpec] = Field(min_length=1)
    post_checks: list[CheckSpec] = Field(default_factory=list)
    resume: Literal["auto", "manual"] = "auto"
    on_failure: Literal["undo", "leave"] = "undo"
    # required: outside an open maintenance window covering its nodes, one more approval
    windows: Literal["required"] | None = None
    propose_on_failure: ProposeSpec | None = None
    remediation: Remediation | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME.fullmatch(value):
            raise ValueError("a runbook name is lower-case letters, digits and -")
        return value

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        if not SEMVER.fullmatch(value):
            raise ValueError(f'version "{value}" is not semver (MAJOR.MINOR.PATCH)')
        return value

    @field_validator("params")
    @classmethod
    def _param_names(cls, value: dict[str, ParamSpec]) -> dict[str, ParamSpec]:
        for key in value:
            if not re.fullmatch(r"[a-z][a-z0-9_]{0,40}", key):
                raise ValueError(f'parameter name "{key}" must be lower-case letters, digits, _')
            if key == "change":  # change=REF is the request's change reference
                raise ValueError('"change" is reserved (a request\'s change reference, '
                                 'change=REF): name the parameter otherwise')
        for key, spec in value.items():
            if spec.driver_for_pool and spec.driver_for_pool not in value:
                raise ValueError(f"{key}.driver_for_pool: no parameter {spec.driver_for_pool!r}")
        return value

    @field_validator("steps")
    @classmethod
    def _unique_steps(cls, value: list[StepSpec]) -> list[StepSpec]:
        seen: dict[str, int] = {}
        for index, step in enumerate(value):
            if step.id in seen:
                raise ValueError(
                    f'step id "{step.id}" is used twice (steps[{seen[step.id]}] and steps[{index}])'
                )
            seen[step.id] = index
        return value

    @model_validator(mode="after")
    def _follow_up_step(self) -> Runbook:
        follow = self.propose_on_failure
        missing = [step for step in (follow.after_steps() if follow else [])
                   if step not in {s.id for s in self.steps}]
        if missing:
            raise ValueError(f"propose_on_failure.after_step: no step {missing[0]!r}")
        return self


DEFAULT_REQUIRED = {"low": 0, "medium": 1, "high": 2}
