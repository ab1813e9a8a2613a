"""``slurm.health_check``: check a node inside its maintenance reservation.

It lifts only a drain the bot made to work on the node, or a node health check's GPU drain
it answers (adapters.slurm.reasons): another owner's drain, or the bot's for a failed check,
stays unless the step says ``override_drains``. Once it resumed the node, every way out but
a passed check (a failed check, a stop, a lost controller, an error) drains it again, marked
as a failed check: it never goes back into service unchecked.
"""

from __future__ import annotations

import shlex
import time
from typing import Any, ClassVar

from pydantic import Field

from adapters.actions import (
    ActionContext,
    ActionError,
    ActionResult,
    ActionStopped,
    Seconds,
    StrictArguments,
)
from adapters.host import OUTPUT_LIMIT, allowed_argv, verdict
from adapters.prometheus.gate import GateFailed, GpuGate, GpuGated, gate_for
from adapters.slurm import commands, reasons
from adapters.slurm.actions import NAME_PATTERN, _SlurmAction
from adapters.slurm.identity import EvidenceFailed, identity_argv, swap_evidence
from kit.durations import format_duration

REDRAIN_SECONDS = 300.0  # how long a node the check resumed is drained again, at most
REDRAIN_POLL = 2.0


class HealthCheckArguments(StrictArguments):
    node: str = Field(pattern=NAME_PATTERN)
    reservation: str = Field(pattern=NAME_PATTERN)
    command: str = "health-check"
    args: list[str] = Field(default_factory=list)
    resume_timeout: Seconds = 60.0
    # lift a drain someone else made, or the bot made for a failed check (break-glass)
    override_drains: bool = False
    # a drain whose reason starts with this is the bot's too (the pool hand-off's reason)
    also_lift: str = ""
    # after the command passed: the node's GPUs in DCGM through Prometheus (adapters/
    # prometheus/gate.py) for `settle` seconds (null: prometheus.gpu_settle)
    gpu_telemetry: bool = False
    settle: Seconds | None = Field(default=None, le=3600)
    dcgm_name: str = Field(default="", pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9._-]*$")
    # swap-gpu: then GPU identity_gpu's UUID and serial (node command identity_command) must
    # be DCGM's and none of those step identity_before read (adapters/slurm/identity.py)
    identity_gpu: int | None = Field(default=None, ge=0, le=15)
    identity_command: str = "gpu-identity"
    identity_before: str = ""


class HealthCheckAction(GpuGated, _SlurmAction):
    """srun cannot start anything on a drained node, even inside a MAINT reservation, so the
    node is resumed first: the reservation (which must exist and hold the node) keeps every
    other job off it. A failed check fails the step with the output's tail."""

    name: ClassVar[str] = "slurm.health_check"
    Arguments: ClassVar[type[StrictArguments]] = HealthCheckArguments
    needs: ClassVar[tuple[str, ...]] = ("run_on_node", "update_nodes")


    def _gate(self, args: HealthCheckArguments, expect: int) -> GpuGate:
        return gate_for(self.prometheus, args.dcgm_name or args.node, expect,
                        f"the health check of {args.node}")

    def _argv(self, args: HealthCheckArguments) -> list[str]:
        return allowed_argv(self.config.commands, args.command, args.args, "node command",
                            "slurm.commands")[1]

    def _env(self, args: HealthCheckArguments) -> dict[str, str]:
        return self.config.commands[args.command].env

    def plan(self, args: HealthCheckArguments) -> list[str]:
        argv = self._argv(args)
        return [*self._drain_notes([args.node], args.override_drains,
                                   self.config.health_check_drains),
            commands.show(commands.update_nodes([args.node], "RESUME", None))
            + f" (inside reservation {args.reservation}: no other job lands there)",
            self.backend.node_run_line(args.node, args.reservation, argv,
                              self._env(args)),
            *self._gate_plan(args),
            *self._evidence_plan(args),
            f"if it fails or does not finish: scontrol update NodeName={args.node} "
            f'State=DRAIN Reason="health check failed: ... {reasons.PLACEHOLDER[:-1]}: '
            'failed check)"',
        ]

    def _gate_plan(self, args: HealthCheckArguments) -> list[str]:
        if not args.gpu_telemetry:
            return []
        (node,) = self._read([args.node], with_jobs=False)
        settle = self.settle_for(args.settle)
        return ["then " + self._gate(args, node.gpus_total).describe(settle)]

    def _evidence_plan(self, args: HealthCheckArguments) -> list[str]:
        if args.identity_gpu is None:
            return []
        gate_for(self.prometheus, args.dcgm_name or args.node, 0,
                 f"the swap evidence of {args.node}")  # refused without Prometheus
        argv = identity_argv(self, args.identity_command)
        return [f"then GPU {args.identity_gpu}'s UUID and serial, read by "
                + self.backend.node_run_line(args.node, args.reservation, argv)
                + f", must be DCGM's and not those step {args.identity_before} read before "
                "the swap; else drained again with the verdict"]

    def run(self, args: HealthCheckArguments, ctx: ActionContext) -> ActionResult:
        argv = self._argv(args)
        self._require_reservation(args)
        (node,) = self._read([args.node], with_jobs=False)
        stays = self._not_liftable([node], args.override_drains or bool(
            args.also_lift and node.reason.startswith(args.also_lift)),
            self.config.health_check_drains)
        if stays:
            raise ActionError(
                f"{args.node} is {stays[args.node]}: that drain stays (nothing was changed). "
                f"To return {args.node} anyway, ask again with override_drains=true "
                "(break-glass: one more approval)")
        resumed = "DRAIN" in node.flags or node.state == "down"
        try:
            if resumed:
                self._resume_inside(args.node, args.reservation, ctx, args.resume_timeout)
            ctx.checkpoint(f"about to check {args.node}")  # srun is not interrupted by a stop
            passed = self._check(args, argv, ctx)
            passed = self._telemetry(args, node.gpus_total, passed, ctx)
            if args.identity_gpu is None:
                return passed
            return swap_evidence(self, args, passed, ctx)
        except (_CheckFailed, EvidenceFailed) as exc:
            raise ActionError(str(exc)) from exc
        except Exception as exc:  # never leave a node we resumed in service unchecked
            if not resumed:
                raise  # it was in service before: nothing of ours to take back
            raise self._left_drained(args.node, exc, ctx) from exc

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
            raise _CheckFailed(f"{shlex.join(argv)} on {args.node} failed ({why}); "
                               f"{args.node} is left drained with that reason")
        return ActionResult(f"{args.node} passed {shlex.join(argv)}", details)

    def _telemetry(self, args: HealthCheckArguments, expect: int, passed: ActionResult,
                   ctx: ActionContext) -> ActionResult:
        """The GPUs in DCGM after the command passed: a failure drains the node again with
        the gate's verdict, as a failed check."""
        if not args.gpu_telemetry:
            return passed
        settle = self.settle_for(args.settle)
        ctx.progress(f"{args.node} passed; watching its GPUs in DCGM for "
                     f"{format_duration(settle)}")
        try:
            reads = self._gate(args, expect).check(settle, ctx, self._sleep)
        except GateFailed as exc:
            self._drain(args.node, f"GPU telemetry: {exc}", ctx)
            raise _CheckFailed(f"{args.node} passed {passed.summary.split(' passed ', 1)[-1]} "
                               f"but its GPUs did not: {exc}; {args.node} is left drained "
                               "with that reason") from exc
        return ActionResult(f"{passed.summary}; its {expect} GPU(s) report in DCGM with no "
                            f"new XID or ECC error for {format_duration(settle)}",
                            {**passed.details, "telemetry_reads": reads})

    def _left_drained(self, node: str, exc: BaseException, ctx: ActionContext) -> ActionError:
        """The check did not finish (a stop, Slurm down, an error): drain again, marked as a
        failed check, trying until Slurm answers or the step's time is up (a controller
        that restarts must not find the node resumed); the error says the node's state."""
        what = str(exc) or type(exc).__name__
        deadline = time.monotonic() + min(REDRAIN_SECONDS, max(ctx.remaining(), 5.0))
        while True:
            try:
                self._drain(node, f"health check did not finish: {what}", ctx)
                break
            except Exception as again:  # Slurm itself is gone: try again until the deadline
                if time.monotonic() >= deadline:
                    return ActionError(
                        f"health check on {node} did not finish ({what}) and {node} could not "
                        f"be drained again ({again}): it may be in service unchecked inside "
                        "its reservation; drain it by hand (scontrol update "
                        f"NodeName={node} State=DRAIN Reason=...) once Slurm answers, before "
                        "the reservation ends")
                ctx.progress(f"{node} could not be drained again ({again}); trying again")
                self._sleep(REDRAIN_POLL)
        cls = ActionStopped if isinstance(exc, ActionStopped) else ActionError
        return cls(f"health check on {node} did not finish ({what}); {node} is left drained")

    def _drain(self, node: str, reason: str, ctx: ActionContext) -> None:
        marked = reasons.marked(reason, ctx.execution_id, failed_check=True)
        self.backend.update_nodes([node], "DRAIN", marked)
        ctx.progress(f"{node} drained again: {marked}")

    def _require_reservation(self, args: HealthCheckArguments) -> None:
        found = next((r for r in self.backend.reservations() if r.name == args.reservation), None)
        if found is None or args.node not in found.nodes:
            raise ActionError(
                f"reservation {args.reservation} with {args.node} does not exist: without it, "
                f"resuming {args.node} would return it to service unchecked"
            )


class _CheckFailed(Exception):
    """The check ran and failed; the node is already drained with the verdict."""
