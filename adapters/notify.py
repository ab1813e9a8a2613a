"""``chat.notify``: tell the people following an execution something.

The engine routes the message to wherever the execution reports (the terminal
that asked, the chat thread); the audit log keeps it with the step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar, Protocol

from pydantic import Field

from adapters.actions import ActionContext, ActionError, ActionResult, Seconds, StrictArguments


class NotifyArguments(StrictArguments):
    message: str = Field(min_length=1, max_length=3000)
    # earlier steps whose result names nodes a check kept out (details "kept_out": node ->
    # verdict, as the GPU gates of close-window give): said after the message, and then the
    # step fails, so the run ends failed naming them
    kept_out_from: list[str] = Field(default_factory=list, max_length=10)


class NotifyAction:
    name: ClassVar[str] = "chat.notify"
    Arguments: ClassVar[type[StrictArguments]] = NotifyArguments

    def plan(self, args: NotifyArguments) -> list[str]:
        lines = [f"notify: {args.message}"]
        if args.kept_out_from:
            lines.append(f"then name the nodes {', '.join(args.kept_out_from)} kept out, if "
                         "any, and fail the run")
        return lines

    def run(self, args: NotifyArguments, ctx: ActionContext) -> ActionResult:
        kept = kept_out(args.kept_out_from, ctx)
        message = args.message + (
            " KEPT OUT (a check failed; drained / cordoned with the verdict): "
            + "; ".join(f"{node}: {why}" for node, why in kept.items()) if kept else "")
        ctx.progress(message)
        if kept:
            raise ActionError(message)
        return ActionResult(summary=f"notified: {message}", changed=False)


def kept_out(steps: list[str], ctx: ActionContext) -> dict[str, str]:
    """The nodes the named earlier steps kept out, with each verdict."""
    found: dict[str, str] = {}
    for step in steps:
        details = ctx.earlier(step) or {}
        found.update({str(n): str(v) for n, v in (details.get("kept_out") or {}).items()})
    return found


class Confirmations(Protocol):
    """Where questions to people are stored and their answers read (the bot's database)."""

    def ask(self, execution_id: int, step_id: str, question: str) -> None: ...

    def answer(self, execution_id: int, step_id: str) -> tuple[str, str, str] | None:
        """(``yes`` or ``no``, who, note) once someone answered; None before."""
        ...


class ConfirmArguments(StrictArguments):
    question: str = Field(min_length=1, max_length=500)
    poll: Seconds = Field(default=2.0, le=60)


class ConfirmAction:
    """``chat.confirm``: wait until a person confirms a physical step ("GPU replaced?").

    The question is recorded once; the step waits (up to its timeout) for
    ``runbook confirm ID`` or a chat button. "no" fails the step.
    """

    name: ClassVar[str] = "chat.confirm"
    # not safe to run twice blindly: after a crash in this step a person decides
    idempotent: ClassVar[bool] = False
    Arguments: ClassVar[type[StrictArguments]] = ConfirmArguments

    def __init__(self, confirmations: Confirmations, sleep: Callable[[float], None] = time.sleep):
        self._confirmations = confirmations
        self._sleep = sleep

    def plan(self, args: ConfirmArguments) -> list[str]:
        return [f"ask a person: {args.question} (wait for `runbook confirm`)"]

    def run(self, args: ConfirmArguments, ctx: ActionContext) -> ActionResult:
        self._confirmations.ask(ctx.execution_id, ctx.step_id, args.question)
        ctx.progress(f"waiting for a person: {args.question} "
                     f"(runbook confirm {ctx.execution_id} [--no])")
        while True:
            answer = self._confirmations.answer(ctx.execution_id, ctx.step_id)
            if answer is not None:
                verdict, who, note = answer
                if verdict != "yes":
                    raise ActionError(f"{who} answered no to {args.question!r}"
                                      + (f": {note}" if note else ""))
                return ActionResult(summary=f"confirmed by {who}", details={"by": who,
                                                                            "note": note})
            ctx.checkpoint(f"waiting for an answer to {args.question!r}")
            self._sleep(max(0.05, ctx.pause(args.poll)))
