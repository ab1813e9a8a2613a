"""``slurm.mig_apply`` and ``slurm.check_gres``: apply a MIG layout on a node inside its
maintenance reservation (an allow-listed node command, like ``nvidia-mig-parted apply``),
and check that Slurm publishes the node's GPUs as the layout says (``scontrol show node``),
then (``gpu_telemetry``) that every physical GPU still reports in DCGM through Prometheus
while it settles; a node that fails is drained again with the verdict, as a failed check.
"""

from __future__ import annotations

import re
import shlex
import time
from typing import Any, ClassVar

from pydantic import Field, field_validator

from adapters.actions import (
    ActionContext,
    ActionError,
    ActionResult,
    ActionStopped,
    ActionTimeout,
    Seconds,
    StrictArguments,
)
from adapters.host import OUTPUT_LIMIT, allowed_argv, verdict
from adapters.prometheus.gate import GateFailed, GpuGate, GpuGated, gate_for
from adapters.slurm import commands, reasons
from adapters.slurm.actions import NAME_PATTERN, _SlurmAction
from kit.durations import format_duration

LAYOUT = r"^[a-z0-9][a-z0-9._-]{0,62}$"
PROFILE = re.compile(r"^[1-7]g\.[0-9]{1,3}gb$")
_GRES = re.compile(r"^gpu:([^:(,]+):(\d+)")


class MigApplyArguments(StrictArguments):
    node: str = Field(pattern=NAME_PATTERN)
    reservation: str = Field(pattern=NAME_PATTERN)
    layout: str = Field(pattern=LAYOUT)
    command: str = "mig-apply"  # slurm.commands: takes the layout as its last argument
    resume_timeout: Seconds = 60.0


class CheckGresArguments(StrictArguments):
    node: str = Field(pattern=NAME_PATTERN)
    per_gpu: dict[str, int] = Field(description="MIG devices per GPU ({}: MIG off)")
    gpus: int | None = Field(default=None, ge=1, le=64)  # default: count them on the node
    reservation: str | None = Field(default=None, pattern=NAME_PATTERN)
    count_command: str = "gpu-count"  # slurm.commands: one line per physical GPU
    timeout: Seconds = 120.0
    poll: Seconds = 1.0
    # then the node's physical GPUs in DCGM (prometheus/gate.py) for `settle` seconds
    gpu_telemetry: bool = False
    settle: Seconds | None = Field(default=None, le=3600)  # null: prometheus.gpu_settle
    dcgm_name: str = Field(default="", pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9._-]*$")

    @field_validator("per_gpu")
    @classmethod
    def _profiles(cls, value: dict[str, int]) -> dict[str, int]:
        for profile, count in value.items():
            if not PROFILE.match(profile) or not 1 <= count <= 7:
                raise ValueError(f"{profile}: {count} is not a MIG profile like 3g.40gb with "
                                 "1 to 7 devices per GPU")
        return value


def gres_types(gres: str) -> dict[str, int]:
    """``gpu:3g.40gb:16(S:0),gpu:1g.10gb:7`` -> {3g.40gb: 16, 1g.10gb: 7}; untyped: ``gpu``."""
    found: dict[str, int] = {}
    for part in re.split(r",(?=gpu:)", gres or ""):
        typed = _GRES.match(part)
        if typed:
            found[typed.group(1)] = found.get(typed.group(1), 0) + int(typed.group(2))
        elif re.match(r"^gpu:(\d+)", part):
            found["gpu"] = found.get("gpu", 0) + int(part.split(":")[1].split("(")[0])
    return found


class MigApplyAction(_SlurmAction):
    """srun cannot start anything on a drained node, so the node is resumed inside its
    MAINT reservation (which must hold it) first; the reservation keeps jobs off it. A
    failed command fails the step with the tool's verdict; what happens to the node is the
    runbook's undo (mig-reconfigure resumes it)."""

    name: ClassVar[str] = "slurm.mig_apply"
    takes_out: ClassVar[tuple[str, ...]] = ("node",)
    Arguments: ClassVar[type[StrictArguments]] = MigApplyArguments
    needs: ClassVar[tuple[str, ...]] = ("run_on_node", "update_nodes")

    def _argv(self, args: MigApplyArguments) -> list[str]:
        return allowed_argv(self.config.commands, args.command, [args.layout], "node command",
                            "slurm.commands")[1]

    def plan(self, args: MigApplyArguments) -> list[str]:
        env = self.config.commands[args.command].env if args.command in self.config.commands \
            else {}
        return [
            commands.show(commands.update_nodes([args.node], "RESUME", None))
            + f" (inside reservation {args.reservation}: no other job lands there)",
            self.backend.node_run_line(args.node, args.reservation, self._argv(args),
                              env),
        ]

    def run(self, args: MigApplyArguments, ctx: ActionContext) -> ActionResult:
        argv = self._argv(args)
        found = next((r for r in self.backend.reservations() if r.name == args.reservation),
                     None)
        if found is None or args.node not in found.nodes:
            raise ActionError(f"reservation {args.reservation} with {args.node} does not "
                              f"exist: without it, resuming {args.node} would let jobs in")
        (node,) = self._read([args.node], with_jobs=False)
        self._refuse_others_drain(node, "applying the layout")
        if "DRAIN" in node.flags or node.state == "down":
            self._resume_inside(args.node, args.reservation, ctx, args.resume_timeout)
        ctx.checkpoint(f"about to apply {args.layout} on {args.node}")
        command = self.config.commands[args.command]
        timeout = max(1.0, min(command.timeout, ctx.remaining()))
        code, out, err = self.backend.run_on_node(args.node, args.reservation, argv, timeout,
                                                  command.env)
        details: dict[str, Any] = {"argv": argv, "exit_code": code, "layout": args.layout,
                                   "stdout": out[-OUTPUT_LIMIT:], "stderr": err[-OUTPUT_LIMIT:]}
        if code != 0:
            why = verdict(out, err, code)
            raise ActionError(f"{shlex.join(argv)} on {args.node} failed ({why}): the GPUs "
                              f"keep whatever layout the tool left (nvidia-smi mig -lgi on "
                              f"{args.node} shows it)")
        return ActionResult(f"MIG layout {args.layout} applied on {args.node}", details)


class CheckGresAction(GpuGated, _SlurmAction):
    name: ClassVar[str] = "slurm.check_gres"
    Arguments: ClassVar[type[StrictArguments]] = CheckGresArguments

    needs: ClassVar[tuple[str, ...]] = ("update_nodes",)  # a failed check drains the node

    def operations(self, args: object) -> tuple[str, ...]:
        # without gpus= it counts the GPUs on the node (srun)
        counts = ("run_on_node",) if getattr(args, "gpus", None) is None else ()
        return self.needs + counts

    def _gate(self, args: CheckGresArguments, gpus: int) -> GpuGate:
        return gate_for(self.prometheus, args.dcgm_name or args.node, gpus,
                        f"the MIG check of {args.node}")

    def plan(self, args: CheckGresArguments) -> list[str]:
        lines = []
        gpus = str(args.gpus) if args.gpus else "the GPUs counted"
        if args.gpus is None:
            argv = allowed_argv(self.config.commands, args.count_command, [], "node command",
                                "slurm.commands")[1]
            lines.append(self.backend.node_run_line(args.node, args.reservation,
                                                   argv)
                         + "  # one line per GPU")
        wanted = (", ".join(f"gpu:{p}:{n} per GPU" for p, n in sorted(args.per_gpu.items()))
                  if args.per_gpu else "one GPU type, no MIG profile, 1 per GPU")
        lines.append(f"scontrol show node {args.node}: Gres must be {wanted} (times {gpus}) "
                     f"and nothing else (at most {format_duration(args.timeout)})")
        if args.gpu_telemetry:
            gate = self._gate(args, args.gpus or 0).describe(self.settle_for(args.settle))
            counted = f" {args.gpus} GPU(s) " if args.gpus else " the GPUs counted "
            lines.append("then " + gate.replace(f" {args.gpus or 0} GPU(s) ", counted))
        return lines

    def _count(self, args: CheckGresArguments, ctx: ActionContext) -> int:
        if args.gpus is not None:
            return args.gpus
        command, argv = allowed_argv(self.config.commands, args.count_command, [],
                                     "node command", "slurm.commands")
        code, out, err = self.backend.run_on_node(
            args.node, args.reservation, argv, max(1.0, min(command.timeout, ctx.remaining())),
            command.env)
        lines = [line for line in out.splitlines() if line.strip()]
        if code != 0 or not lines:
            raise ActionError(f"{shlex.join(argv)} on {args.node} exited {code} with "
                              f"{len(lines)} GPUs: {verdict(out, err, code)}")
        return len(lines)

    @staticmethod
    def _matches(found: dict[str, int], args: CheckGresArguments, gpus: int) -> bool:
        if args.per_gpu:
            return found == {p: n * gpus for p, n in args.per_gpu.items()}
        return len(found) == 1 and not any(PROFILE.match(t) for t in found) \
            and sum(found.values()) == gpus

    def run(self, args: CheckGresArguments, ctx: ActionContext) -> ActionResult:
        """Every way out but a pass drains the node again, marked as a failed check: the
        node is in service inside its reservation, and an undo must not return a node whose
        GPUs were not proven (a GPU that fell off the bus shows as a wrong count first)."""
        try:
            return self._checked(args, ctx)
        except Exception as exc:
            raise self._kept_out(args.node, exc, ctx) from exc

    def _kept_out(self, node: str, exc: Exception, ctx: ActionContext) -> ActionError:
        said = str(exc) or type(exc).__name__
        why = f"GPU telemetry: {said}" if isinstance(exc, GateFailed) else f"MIG check: {said}"
        try:
            self.backend.update_nodes([node], "DRAIN", reasons.marked(why, ctx.execution_id,
                                                                      failed_check=True))
            left = f"{node} is left drained with that reason"
        except Exception as again:  # Slurm gone: say what the node's state may be
            left = (f"{node} could not be drained again ({again}): it may be in service "
                    f"inside its reservation; drain it by hand (scontrol update NodeName={node} "
                    "State=DRAIN Reason=...) before the reservation ends")
        if isinstance(exc, GateFailed):
            return ActionError(f"{node} has the layout but its GPUs did not pass: {said}; {left}")
        kind = type(exc) if isinstance(exc, ActionStopped | ActionTimeout) else ActionError
        return kind(f"{said}; {left}")

    def _checked(self, args: CheckGresArguments, ctx: ActionContext) -> ActionResult:
        gpus = self._count(args, ctx)
        deadline = time.monotonic() + min(args.timeout, ctx.remaining())
        while True:
            (node,) = self._read([args.node], with_jobs=False)
            found = gres_types(node.gres)
            if self._matches(found, args, gpus):
                self._telemetry(args, gpus, ctx)
                return ActionResult(f"{args.node} publishes Gres={node.gres} ({gpus} GPUs)"
                                    + ("; they report in DCGM with no new XID or ECC error"
                                       if args.gpu_telemetry else ""),
                                    {"node": args.node, "gres": node.gres, "types": found,
                                     "gpus": gpus, "per_gpu": args.per_gpu}, changed=False)
            if time.monotonic() >= deadline:
                wanted = ",".join(f"gpu:{p}:{n * gpus}" for p, n in sorted(args.per_gpu.items()))
                raise ActionTimeout(
                    f"{args.node} publishes Gres={node.gres or '(none)'}, not "
                    f"{wanted or f'{gpus} plain GPUs'} after {format_duration(args.timeout)}: "
                    "check gres.conf and the node's Gres= in slurm.conf, then restart "
                    "slurmctld and the node's slurmd")
            ctx.checkpoint(f"waiting for the Gres of {args.node}")
            self._sleep(max(0.05, ctx.pause(min(args.poll, deadline - time.monotonic()))))

    def _telemetry(self, args: CheckGresArguments, gpus: int, ctx: ActionContext) -> None:
        """The physical GPUs in DCGM while they settle (MIG devices are not counted: DCGM
        reports each GPU's temperature whatever its layout); GateFailed with the verdict."""
        if not args.gpu_telemetry:
            return
        settle = self.settle_for(args.settle)
        ctx.progress(f"watching {args.node}'s {gpus} GPUs in DCGM for "
                     f"{format_duration(settle)}")
        self._gate(args, gpus).check(settle, ctx, self._sleep)


MIG_ACTIONS: tuple[type[_SlurmAction], ...] = (MigApplyAction, CheckGresAction)
