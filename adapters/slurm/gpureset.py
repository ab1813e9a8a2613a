"""``slurm.gpu_reset``: reset one GPU of a node, falling back to a reboot of the node.

Persistence mode off and ``nvidia-smi -r`` run on the node through srun (allow-listed node
commands), then the health check; a reset or check that fails reboots the node (``scontrol
reboot ASAP nextstate=RESUME``) and checks again. When that fails too the node is left
drained with a reason that says so, and the step fails.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from adapters.actions import (
    ActionContext,
    ActionError,
    ActionResult,
    ActionStopped,
    Seconds,
    StrictArguments,
)
from adapters.host import HostCommand, allowed_argv, verdict
from adapters.prometheus.gate import GateFailed, GpuGate, GpuGated, gate_for
from adapters.slurm import commands, reasons
from adapters.slurm.actions import NAME_PATTERN, _check_text, _SlurmAction
from adapters.slurm.backend import REBOOT_FLAGS, NodeInfo
from kit.durations import format_duration


class GpuResetArguments(StrictArguments):
    node: str = Field(pattern=NAME_PATTERN)
    gpu: int = Field(ge=0, le=15)
    reservation: str = Field(pattern=NAME_PATTERN)
    reason: str = Field(min_length=1, max_length=150)
    method: Literal["reset", "reboot"] = "reset"  # reboot: no GPU reset, reboot the node
    in_slurm: bool = True  # false (a Kubernetes-only node): refused, srun cannot reach it
    persistence_command: str = "gpu-persistence-off"
    reset_command: str = "gpu-reset"
    health_command: str = "health-check"
    reboot_timeout: Seconds = 900.0
    resume_timeout: Seconds = 60.0
    poll: Seconds = Field(default=2.0, le=60)
    # after each health check: the node's GPUs in DCGM (adapters/prometheus/gate.py); a
    # failure counts as a failed check (the reset falls back to the reboot, then gives up)
    gpu_telemetry: bool = False
    settle: Seconds | None = Field(default=None, le=3600)  # null: prometheus.gpu_settle
    dcgm_name: str = Field(default="", pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9._-]*$")

    @field_validator("reason")
    @classmethod
    def _one_line(cls, value: str) -> str:
        return _check_text(value)


class GpuResetAction(GpuGated, _SlurmAction):
    """The node must be in a MAINT reservation that holds it (``reservation``): it is resumed
    inside it so srun can start there while no other job lands on it. ``method: reset``:
    persistence mode off, GPU reset, health check; if any fails, the reboot. ``method:
    reboot``: the reboot only. The reboot: ``scontrol reboot ASAP nextstate=RESUME``, wait
    until the node booted again and answers, health check. A stop (cancel, timeout) is
    never a reason to fall back: it ends the step where it is."""

    name: ClassVar[str] = "slurm.gpu_reset"
    takes_out: ClassVar[tuple[str, ...]] = ("node",)
    Arguments: ClassVar[type[StrictArguments]] = GpuResetArguments
    needs: ClassVar[tuple[str, ...]] = (
        "run_on_node", "update_nodes", "reboot",
        "create_reservation", "delete_reservation")


    def _command(self, name: str, extra: list[str]) -> tuple[HostCommand, list[str]]:
        return allowed_argv(self.config.commands, name, extra, "node command", "slurm.commands")

    def _gate(self, args: GpuResetArguments, expect: int) -> GpuGate:
        return gate_for(self.prometheus, args.dcgm_name or args.node, expect,
                        "the reset's health check")

    def _lines(self, args: GpuResetArguments) -> dict[str, str]:
        def srun(name: str, extra: list[str]) -> str:
            command, argv = self._command(name, extra)
            return self.backend.node_run_line(args.node, args.reservation, argv,
                                     command.env)

        lines = {"health": srun(args.health_command, [])}
        if args.method == "reset":
            lines["persistence"] = srun(args.persistence_command, [str(args.gpu)])
            lines["reset"] = srun(args.reset_command, [str(args.gpu)])
        return lines

    def plan(self, args: GpuResetArguments) -> list[str]:
        _refuse_outside_slurm(args)
        lines = self._lines(args)
        node, res = args.node, args.reservation
        reboot = commands.show(commands.reboot([node], "RESUME", _reboot_reason(args)))
        wait = (f"wait until {node} rebooted and responds (at most "
                f"{format_duration(args.reboot_timeout)})")
        plan = [commands.show(commands.update_nodes([node], "RESUME", None))
                + f" (inside reservation {res}: no other job lands there)"]
        if args.method == "reset":
            plan += [lines["persistence"], lines["reset"], lines["health"]]
            plan += [f"if the reset fails: {line}" for line in (reboot, wait, lines["health"])]
            last = "if the reboot fails too"
        else:
            plan += [reboot, wait, lines["health"]]
            last = "if it fails"
        drain = commands.show(commands.update_nodes([node], "DRAIN", _failed_reason(args, "...")))
        plan.append(f"{last}: {drain}; {commands.show(commands.delete_reservation(res))}")
        if args.gpu_telemetry:
            (info,) = self._read([node], with_jobs=False)
            settle = self.settle_for(args.settle)
            plan.insert(1, "each health check counts only with its GPUs in DCGM: "
                        + self._gate(args, info.gpus_total).describe(settle))
        return plan

    def run(self, args: GpuResetArguments, ctx: ActionContext) -> ActionResult:
        _refuse_outside_slurm(args)
        self._lines(args)  # every command allow-listed: fail before touching the node
        self._require_reservation(args)
        (node,) = self._read([args.node], with_jobs=False)  # once: a reboot sets its own
        # the reset ends in the health check and the GPU gate: it answers NHC's GPU drain
        self._refuse_others_drain(node, "the reset", self.config.health_check_drains)
        gpus = node.gpus_total  # what the GPU gate expects after each health check
        attempts: list[dict[str, Any]] = []
        if args.method == "reset":
            if self._attempt(attempts, "reset", lambda: self._reset(args, ctx, gpus), ctx):
                return self._done(args, "reset", attempts)
            ctx.progress(f"GPU {args.gpu} on {args.node}: {attempts[-1]['error']}; "
                         "falling back to a reboot of the node")
        if self._attempt(attempts, "reboot", lambda: self._reboot(args, ctx, gpus), ctx):
            return self._done(args, "reboot", attempts)
        self._give_up(args, attempts, ctx)
        raise AssertionError("unreachable")  # pragma: no cover - _give_up raises

    def _attempt(self, attempts: list[dict[str, Any]], method: str,
                 attempt: Callable[[], str], ctx: ActionContext) -> bool:
        started = time.monotonic()
        try:
            health = attempt()
        except ActionStopped:
            raise
        except ActionError as exc:
            attempts.append({"method": method, "ok": False, "error": str(exc),
                             "seconds": round(time.monotonic() - started, 1)})
            return False
        attempts.append({"method": method, "ok": True, "health": health,
                         "seconds": round(time.monotonic() - started, 1)})
        return True

    def _done(self, args: GpuResetArguments, method: str,
              attempts: list[dict[str, Any]]) -> ActionResult:
        how = "reset" if method == "reset" else "rebooted the node"
        details = {"node": args.node, "gpu": args.gpu, "method": method, "asked": args.method,
                   "attempts": attempts}
        return ActionResult(f"GPU {args.gpu} on {args.node}: {how}, health check passed",
                            details)

    def _reset(self, args: GpuResetArguments, ctx: ActionContext, gpus: int) -> str:
        self._resume_for_reset(args, ctx)
        self._srun(args, ctx, args.persistence_command, [str(args.gpu)])
        out = self._srun(args, ctx, args.reset_command, [str(args.gpu)])
        ctx.progress(f"GPU {args.gpu} on {args.node} reset: {out or 'exit 0'}")
        return self._health(args, ctx, gpus)

    def _reboot(self, args: GpuResetArguments, ctx: ActionContext, gpus: int) -> str:
        self._resume_for_reset(args, ctx)
        (before,) = self._read([args.node], with_jobs=False)
        if not before.flags & REBOOT_FLAGS:
            ctx.checkpoint(f"about to reboot {args.node}")
            self.backend.reboot([args.node], "RESUME", _reboot_reason(args))
            ctx.progress(f"reboot ASAP requested for {args.node} (then RESUME)")
        self._sleep(ctx.pause(args.poll))

        def back(node: NodeInfo) -> bool:
            old = before.boot_time
            rebooted = node.boot_time is None or old is None or node.boot_time > old
            return (rebooted and node.responding and not node.flags & REBOOT_FLAGS
                    and "DRAIN" not in node.flags and node.state != "down")

        self._wait_nodes([args.node], ctx, args.reboot_timeout, args.poll, back,
                         "back from the reboot")
        ctx.progress(f"{args.node} is back from the reboot")
        return self._health(args, ctx, gpus)

    def _health(self, args: GpuResetArguments, ctx: ActionContext, gpus: int) -> str:
        try:
            said = self._srun(args, ctx, args.health_command, [])
        except ActionStopped:
            raise
        except ActionError as exc:
            raise ActionError(f"health check failed: {exc}") from exc
        if not args.gpu_telemetry:
            return said
        settle = self.settle_for(args.settle)
        try:
            self._gate(args, gpus).check(settle, ctx, self._sleep)
        except GateFailed as exc:
            raise ActionError(f"GPU telemetry: {exc}") from exc
        return said

    def _srun(self, args: GpuResetArguments, ctx: ActionContext, name: str,
              extra: list[str]) -> str:
        command, argv = self._command(name, extra)
        ctx.checkpoint(f"about to run {shlex.join(argv)} on {args.node}")
        timeout = max(1.0, min(command.timeout, ctx.remaining()))
        code, out, err = self.backend.run_on_node(args.node, args.reservation, argv, timeout,
                                                  command.env)
        if code != 0:
            own = "\n".join(line for line in err.splitlines() if not line.startswith("srun:"))
            raise ActionError(f"{shlex.join(argv)} exited {code}: "
                              f"{verdict(out, own or err, code)}")
        first = out.strip().splitlines()[:1]
        return first[0].strip()[:150] if first else ""

    def _resume_for_reset(self, args: GpuResetArguments, ctx: ActionContext) -> None:
        (node,) = self._read([args.node], with_jobs=False)
        if "DRAIN" in node.flags or node.state == "down":
            ctx.checkpoint(f"about to resume {args.node} inside {args.reservation}")
            self._resume_inside(args.node, args.reservation, ctx, args.resume_timeout)

    def _require_reservation(self, args: GpuResetArguments) -> None:
        found = next((r for r in self.backend.reservations() if r.name == args.reservation), None)
        if found is None or args.node not in found.nodes:
            raise ActionError(
                f"reservation {args.reservation} with {args.node} does not exist: without it, "
                f"resuming {args.node} for the reset would return it to service unchecked"
            )

    def _give_up(self, args: GpuResetArguments, attempts: list[dict[str, Any]],
                 ctx: ActionContext) -> None:
        errors = "; ".join(f"{a['method']}: {a['error']}" for a in attempts)
        what = "reset and reboot both failed" if args.method == "reset" else "the reboot failed"
        left = f"{args.node} is left drained"
        try:
            self.backend.update_nodes([args.node], "DRAIN", reasons.marked(
                _failed_reason(args, attempts[-1]["error"]), ctx.execution_id,
                failed_check=True))
            if any(r.name == args.reservation for r in self.backend.reservations()):
                self.backend.delete_reservation(args.reservation)
        except ActionError as exc:
            left = f"draining {args.node} failed too ({exc}): drain it by hand"
        ctx.progress(f"GPU {args.gpu} on {args.node}: {what}; {left}")
        raise ActionError(f"GPU {args.gpu} on {args.node}: {what} ({errors}); {left}; the GPU "
                          "needs replacing (swap-gpu)")


def _refuse_outside_slurm(args: GpuResetArguments) -> None:
    if not args.in_slurm:
        raise ActionError(
            f"{args.node} is not in the Slurm pool: a GPU reset runs nvidia-smi on the node "
            "through srun, which cannot reach a Kubernetes-only node; ask for method=reboot "
            "(a reboot request to the cluster's reboot agent), or replace the GPU (swap-gpu)"
        )


def _reboot_reason(args: GpuResetArguments) -> str:
    return f"GPU {args.gpu} reset failed: {args.reason}" if args.method == "reset" \
        else f"reboot for GPU {args.gpu}: {args.reason}"


def _failed_reason(args: GpuResetArguments, why: str) -> str:
    what = "reset and reboot" if args.method == "reset" else "reboot"
    return f"GPU {args.gpu}: {what} did not clear it: {why}"
