"""``slurm.health_check``: check a node inside its maintenance reservation.

A node whose check fails (or cannot run) is drained again with the verdict as the reason:
it never goes back into service unchecked.
"""

from __future__ import annotations

import shlex
import time
from typing import Any, ClassVar

from pydantic import Field

from adapters.actions import ActionContext, ActionError, ActionResult, Seconds, StrictArguments
from adapters.host import OUTPUT_LIMIT, allowed_argv
from adapters.slurm import commands
from adapters.slurm.actions import NAME_PATTERN, _SlurmAction


class HealthCheckArguments(StrictArguments):
    node: str = Field(pattern=NAME_PATTERN)
    reservation: str = Field(pattern=NAME_PATTERN)
    command: str = "health-check"
    args: list[str] = Field(default_factory=list)
    resume_timeout: Seconds = 60.0


class HealthCheckAction(_SlurmAction):
    """srun cannot start anything on a drained node, even inside a MAINT reservation, so the
    node is resumed first: the reservation (which must exist and hold the node) keeps every
    other job off it. A failed check fails the step with the output's tail."""

    name: ClassVar[str] = "slurm.health_check"
    Arguments: ClassVar[type[StrictArguments]] = HealthCheckArguments
    needs: ClassVar[tuple[str, ...]] = ("run_on_node", "update_nodes")

    def _argv(self, args: HealthCheckArguments) -> list[str]:
        return allowed_argv(self.config.commands, args.command, args.args, "node command",
                            "slurm.commands")[1]

    def _env(self, args: HealthCheckArguments) -> dict[str, str]:
        return self.config.commands[args.command].env

    def plan(self, args: HealthCheckArguments) -> list[str]:
        argv = self._argv(args)
        return [
            commands.show(commands.update_nodes([args.node], "RESUME", None))
            + f" (inside reservation {args.reservation}: no other job lands there)",
            commands.show(commands.srun(args.node, args.reservation, argv, self._env(args))),
            f"if it fails: scontrol update NodeName={args.node} State=DRAIN "
            'Reason="health check failed: ..."',
        ]

    def run(self, args: HealthCheckArguments, ctx: ActionContext) -> ActionResult:
        argv = self._argv(args)
        self._require_reservation(args)
        (node,) = self._read([args.node], with_jobs=False)
        if "DRAIN" in node.flags or node.state == "down":
            self.backend.update_nodes([args.node], "RESUME", None)
            ctx.progress(f"resumed {args.node} inside reservation {args.reservation}")
            self._wait_nodes([args.node], ctx, args.resume_timeout, 0.5,
                             lambda n: n.responding and "DRAIN" not in n.flags, "responding")
        ctx.checkpoint(f"about to check {args.node}")  # srun itself is not interrupted by a stop
        try:
            return self._check(args, argv, ctx)
        except ActionError:
            raise
        except Exception as exc:  # never leave a resumed node in service unchecked
            self._drain(args.node, f"health check could not run: {type(exc).__name__}", ctx)
            raise ActionError(f"health check on {args.node} could not run ({exc}); "
                              f"{args.node} is left drained") from exc

    def _check(self, args: HealthCheckArguments, argv: list[str],
               ctx: ActionContext) -> ActionResult:
        timeout = max(1.0, min(self.config.commands[args.command].timeout, ctx.remaining()))
        started = time.monotonic()
        code, out, err = self.backend.run_on_node(args.node, args.reservation, argv, timeout,
                                                  self._env(args))
        details: dict[str, Any] = {"argv": argv, "exit_code": code,
                                   "stdout": out[-OUTPUT_LIMIT:], "stderr": err[-OUTPUT_LIMIT:],
                                   "seconds": round(time.monotonic() - started, 2)}
        if code != 0:
            why = verdict(out, err, code)
            self._drain(args.node, f"health check failed: {why}", ctx)
            raise ActionError(f"{shlex.join(argv)} on {args.node} failed ({why}); "
                              f"{args.node} is left drained with that reason")
        return ActionResult(f"{args.node} passed {shlex.join(argv)}", details)

    def _drain(self, node: str, reason: str, ctx: ActionContext) -> None:
        self.backend.update_nodes([node], "DRAIN", reason[:200])
        ctx.progress(f"{node} drained again: {reason}")

    def _require_reservation(self, args: HealthCheckArguments) -> None:
        found = next((r for r in self.backend.reservations() if r.name == args.reservation), None)
        if found is None or args.node not in found.nodes:
            raise ActionError(
                f"reservation {args.reservation} with {args.node} does not exist: without it, "
                f"resuming {args.node} would return it to service unchecked"
            )


def verdict(out: str, err: str, code: int) -> str:
    """The most telling line of a failed check: the check's own failing line before srun's."""

    def lines(text: str) -> list[str]:
        return [line.strip(" |") for line in text.splitlines() if line.strip(" |-+=")]

    def failing(text: str) -> list[str]:
        return [line for line in lines(text) if "fail" in line.lower() or "error" in line.lower()]

    found = failing(out) or failing(err) or lines(out) or lines(err) or [f"exit code {code}"]
    return " ".join(found[0].split())[:150]
