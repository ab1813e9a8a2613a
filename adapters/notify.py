"""``chat.notify``: tell the people following an execution something.

The engine routes the message to wherever the execution reports (the terminal
that asked, the chat thread); the audit log keeps it with the step.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from adapters.actions import ActionContext, ActionResult, StrictArguments


class NotifyArguments(StrictArguments):
    message: str = Field(min_length=1, max_length=3000)


class NotifyAction:
    name: ClassVar[str] = "chat.notify"
    Arguments: ClassVar[type[StrictArguments]] = NotifyArguments

    def plan(self, args: NotifyArguments) -> list[str]:
        return [f"notify: {args.message}"]

    def run(self, args: NotifyArguments, ctx: ActionContext) -> ActionResult:
        ctx.progress(args.message)
        return ActionResult(summary=f"notified: {args.message}", changed=False)
