"""The ``alertmanager.silence`` and ``alertmanager.expire_silence`` actions.

A step never silences everything (one matcher at least has a value) nor for longer than
``MAX_SILENCE``; ``plan()`` shows the amtool line that does the same.
"""

from __future__ import annotations

import shlex
from datetime import UTC, datetime, timedelta
from typing import ClassVar

from pydantic import Field, field_validator, model_validator

from adapters.actions import (
    ActionBase,
    ActionContext,
    ActionError,
    ActionResult,
    ConnectingActionSet,
    Seconds,
    StrictArguments,
)
from adapters.alertmanager.backend import (
    AlertmanagerBackend,
    AlertmanagerError,
    HttpAlertmanagerBackend,
    format_time,
    matchers_from,
)
from adapters.alertmanager.config import AlertmanagerConfig
from adapters.prometheus.promql import check_label_name
from kit.durations import format_duration

BOT_AUTHOR = "gpu-runbook-bot"
MAX_SILENCE = 30 * 86400.0  # seconds; longer silences are a policy question, not a step


def _check_matchers(value: dict[str, str]) -> dict[str, str]:
    for name in value:
        check_label_name(name)
    if not any(value.values()):
        raise ValueError("at least one matcher needs a non-empty value (a silence of "
                         "everything is not what a runbook step should create)")
    return value


class SilenceArguments(StrictArguments):
    matchers: dict[str, str] = Field(min_length=1, description="label name -> value")
    regex: list[str] = Field(default_factory=list,
                             description="names of matchers whose value is a regex")
    negative: list[str] = Field(default_factory=list,
                                description="names of matchers that must not match (!=, !~)")
    duration: Seconds = Field(le=MAX_SILENCE, description='seconds, or like "2h"')
    comment: str = Field(min_length=1, max_length=2000)
    created_by: str = Field(default=BOT_AUTHOR, min_length=1, max_length=200)

    _matchers = field_validator("matchers")(_check_matchers)

    @model_validator(mode="after")
    def _regex_names(self) -> SilenceArguments:
        matchers_from(self.matchers, self.regex, self.negative)
        return self


class ExpireSilenceArguments(StrictArguments):
    silence_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9-]{1,64}$")
    matchers: dict[str, str] | None = None
    regex: list[str] = Field(default_factory=list)
    negative: list[str] = Field(default_factory=list)
    created_by: str | None = Field(
        default=None, description="only silences by this creator (matchers form)")

    @model_validator(mode="after")
    def _one_way(self) -> ExpireSilenceArguments:
        if (self.silence_id is None) == (self.matchers is None):
            raise ValueError("give either silence_id or matchers")
        if self.matchers is not None:
            if not self.matchers:
                raise ValueError("matchers must not be empty")
            matchers_from(self.matchers, self.regex, self.negative)
        return self


def _amtool(config: AlertmanagerConfig, *words: str) -> str:
    return shlex.join(["amtool", f"--alertmanager.url={config.url}", *words])


_AlertmanagerAction = ActionBase[AlertmanagerBackend, AlertmanagerConfig]


class SilenceAction(_AlertmanagerAction):
    """Reuse, extend or create the silence of exactly these matchers by ``created_by``.

    An *active* silence with exactly the requested matchers and creator that lasts until
    now + duration, less a slack of 10% of the duration (at most 5 minutes), is reused and
    nothing changes, so a step repeated after a crash reuses it; one that ends too early is
    extended (Alertmanager keeps the ID where it can). Only otherwise is a silence created.
    """

    name: ClassVar[str] = "alertmanager.silence"
    Arguments: ClassVar[type[StrictArguments]] = SilenceArguments

    def plan(self, args: SilenceArguments) -> list[str]:
        wanted = matchers_from(args.matchers, args.regex, args.negative)
        line = _amtool(self.config, "silence", "add", f"--author={args.created_by}",
                       f"--duration={format_duration(args.duration)}",
                       f"--comment={args.comment}", *(str(m) for m in wanted))
        return [line + f"  # unless an active silence by {args.created_by} with exactly these "
                "matchers already lasts that long"]

    def run(self, args: SilenceArguments, ctx: ActionContext) -> ActionResult:
        wanted = matchers_from(args.matchers, args.regex, args.negative)
        shown = " ".join(str(m) for m in wanted)
        now = datetime.now(UTC)
        ends = now + timedelta(seconds=args.duration)
        slack = timedelta(seconds=min(300.0, args.duration * 0.1))
        try:
            existing = [s for s in self.backend.find_silences(wanted, exact=True,
                                                              created_by=args.created_by)
                        if s.state == "active"]
            if existing and existing[0].ends_at >= ends - slack:
                silence = existing[0]
                return ActionResult(
                    summary=(f"silence {silence.id} ({shown}) already lasts until "
                             f"{format_time(silence.ends_at)}: reused"),
                    details={**silence.as_dict(), "reused": True}, changed=False)
            if existing:
                old = existing[0]
                silence_id = self.backend.create_silence(
                    wanted, old.starts_at, ends, args.created_by, args.comment,
                    silence_id=old.id)
                verb = ("extended silence" if silence_id == old.id
                        else f"replaced silence {old.id} with")
            else:
                silence_id = self.backend.create_silence(wanted, now, ends, args.created_by,
                                                         args.comment)
                verb = "created silence"
        except AlertmanagerError as exc:
            raise ActionError(f"silencing {shown} failed: {exc}") from exc
        return ActionResult(
            summary=f"{verb} {silence_id} for {shown} until {format_time(ends)}",
            details={"silence_id": silence_id, "matchers": [str(m) for m in wanted],
                     "starts_at": format_time(now), "ends_at": format_time(ends),
                     "created_by": args.created_by, "comment": args.comment,
                     "reused": False, "url": f"{self.config.url}/#/silences/{silence_id}"})


class ExpireSilenceAction(_AlertmanagerAction):
    """Expire one silence by ID, or those with exactly the given matchers; none is a no-op."""

    name: ClassVar[str] = "alertmanager.expire_silence"
    Arguments: ClassVar[type[StrictArguments]] = ExpireSilenceArguments

    def plan(self, args: ExpireSilenceArguments) -> list[str]:
        if args.silence_id is not None:
            return [_amtool(self.config, "silence", "expire", args.silence_id)]
        assert args.matchers is not None
        wanted = matchers_from(args.matchers, args.regex, args.negative)
        by = f" by {args.created_by}" if args.created_by else ""
        return [_amtool(self.config, "silence", "query", "--quiet", *(str(m) for m in wanted))
                + f"  # then expire each active or pending silence{by} with exactly these "
                "matchers (amtool silence expire ID)"]

    def run(self, args: ExpireSilenceArguments, ctx: ActionContext) -> ActionResult:
        try:
            if args.silence_id is not None:
                if self.backend.expire_silence(args.silence_id):
                    return ActionResult(summary=f"expired silence {args.silence_id}",
                                        details={"expired": [args.silence_id]})
                return ActionResult(
                    summary=f"silence {args.silence_id} is already expired or unknown: "
                            "nothing to expire",
                    details={"expired": []}, changed=False)
            assert args.matchers is not None
            wanted = matchers_from(args.matchers, args.regex, args.negative)
            shown = " ".join(str(m) for m in wanted)
            found = self.backend.find_silences(wanted, exact=True, created_by=args.created_by)
            expired = [s.id for s in found if self.backend.expire_silence(s.id)]
        except AlertmanagerError as exc:
            raise ActionError(f"expiring silences failed: {exc}") from exc
        if not expired:
            return ActionResult(summary=f"no active or pending silence with exactly {shown}: "
                                        "nothing to expire",
                                details={"expired": []}, changed=False)
        return ActionResult(summary=f"expired {len(expired)} silence(s) for {shown}: "
                                    + ", ".join(expired),
                            details={"expired": expired, "matchers": [str(m) for m in wanted]})


ACTION_CLASSES: tuple[type[_AlertmanagerAction], ...] = (SilenceAction, ExpireSilenceAction)


class AlertmanagerActions(ConnectingActionSet[AlertmanagerBackend, AlertmanagerConfig]):
    """Every ``alertmanager.*`` action over one backend: ``AlertmanagerActions(c).all()``."""

    action_classes = ACTION_CLASSES
    backend_class = HttpAlertmanagerBackend
