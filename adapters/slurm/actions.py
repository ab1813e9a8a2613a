"""The ``slurm.*`` actions: drain, resume, wait_idle, reservations, reboot, run_on_node,
node_info; ``plan()`` shows the scontrol/srun lines an on-call engineer would type.

Each reads the cluster first and changes only what still needs changing, one scontrol call
per batch (``scontrol update NodeName=gpu[01-64] State=DRAIN ...``), never one per node.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from adapters.actions import (
    ActionBase,
    ActionContext,
    ActionError,
    ActionResult,
    ActionSet,
    ActionTimeout,
    Seconds,
    StrictArguments,
)
from adapters.fleetstatus import NodeStates
from adapters.host import OUTPUT_LIMIT, HostCommand, allowed_argv
from adapters.slurm import commands, reasons
from adapters.slurm.backend import (
    REBOOT_FLAGS,
    NeedsOperations,
    NodeInfo,
    SlurmBackend,
    SlurmError,
)
from adapters.slurm.config import SlurmConfig
from kit.durations import format_duration
from kit.hostlist import compress, expand

NAME_PATTERN = r"^[A-Za-z0-9._-]{1,128}$"
# scontrol's answer to RESUME of a node it thinks needs none (22.05/24.11; 26.05)
INVALID_STATE = ("Invalid node state specified", "Invalid node state transition")


def _check_text(value: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError("must be one line without control characters")
    return value


class _NodesArguments(StrictArguments):
    nodes: str = Field(description="hostlist expression: gpu07, gpu[01-04,07]")

    @field_validator("nodes")
    @classmethod
    def _hostlist(cls, value: str) -> str:
        expand(value)
        return value

    @property
    def names(self) -> list[str]:
        return expand(self.nodes)

    @property
    def hostlist(self) -> str:
        return compress(self.names)


class DrainArguments(_NodesArguments):
    reason: str = Field(min_length=1, max_length=256)
    # the node is taken out for a fault found (a check, an alert): marked so, a routine
    # return to service does not lift it (adapters.slurm.reasons)
    failed_check: bool = False

    @field_validator("reason")
    @classmethod
    def _one_line(cls, value: str) -> str:
        return _check_text(value)


class ResumeArguments(_NodesArguments):
    wait: bool = True  # wait until the nodes respond again (NOT_RESPONDING clears)
    wait_timeout: Seconds = 60.0
    # only the nodes whose drain is this execution's alone (an undo, a runbook's own
    # resume): another owner's reason stays, with the node drained
    only_this_run: bool = False


class WaitIdleArguments(_NodesArguments):
    timeout: Seconds
    requeue: bool = False
    poll: Seconds = 2.0


class ReservationCreateArguments(_NodesArguments):
    name: str = Field(pattern=NAME_PATTERN)
    start: str = Field(default="now", pattern=r"^(now(\+\d+(seconds|minutes|hours|days)?)?|"
                                                r"\d{4}-\d\d-\d\d(T\d\d:\d\d(:\d\d)?)?)$")
    duration: Seconds
    flags: list[str] = Field(default_factory=lambda: ["MAINT", "IGNORE_JOBS"])
    users: list[str] = Field(default_factory=lambda: ["root"])

    @field_validator("flags")
    @classmethod
    def _flags(cls, value: list[str]) -> list[str]:
        for flag in value:
            if not re.fullmatch(r"[A-Za-z_]{1,32}", flag):
                raise ValueError(f"{flag!r} is not a reservation flag like MAINT or IGNORE_JOBS")
        return [flag.upper() for flag in value]

    @field_validator("users")
    @classmethod
    def _users(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("a reservation needs at least one user (e.g. root)")
        for user in value:
            if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", user):
                raise ValueError(f"{user!r} is not a user name")
        return value


class ReservationDeleteArguments(StrictArguments):
    name: str = Field(pattern=NAME_PATTERN)
    # refuse a reservation the bot made for a window or a run (close-maintenance): it
    # belongs to its owner, whose own close or undo deletes it
    not_the_bots: bool = False


# The reservations the bot makes: a maintenance window's, and a run's around a node.
BOT_RESERVATION = re.compile(r"^(?:window-(?P<window>\d+)|(?P<runbook>swap|reset|resume|mig|"
                             r"driver|handoff|nccl)-(?P<node>.+))$")
_OWNERS = {"swap": "swap-gpu", "reset": "reset-gpu", "resume": "resume-node",
           "mig": "mig-reconfigure", "driver": "rollback-driver or upgrade-driver",
           "handoff": "handoff-node", "nccl": "nccl-test"}


def reservation_owner(name: str) -> str | None:
    """Who owns a reservation the bot made, in people's words; None for anyone else's."""
    match = BOT_RESERVATION.match(name)
    if match is None:
        return None
    if match.group("window"):
        return (f"maintenance window {match.group('window')} (close it with `runbook window "
                f"close {match.group('window')}`)")
    return (f"a {_OWNERS[match.group('runbook')]} run on {match.group('node')} (cancel that "
            "execution, or let it finish: its own steps delete it)")


class RebootArguments(_NodesArguments):
    nextstate: Literal["RESUME", "DOWN"] = "RESUME"
    reason: str = Field(min_length=1, max_length=256)
    wait: bool = False  # wait until the nodes rebooted and answer again
    wait_timeout: Seconds = 900.0
    poll: Seconds = 2.0

    @field_validator("reason")
    @classmethod
    def _one_line(cls, value: str) -> str:
        return _check_text(value)


class RunOnNodeArguments(StrictArguments):
    node: str = Field(pattern=r"^[A-Za-z0-9._-]{1,128}$")
    reservation: str | None = Field(default=None, pattern=NAME_PATTERN)
    command: str
    args: list[str] = Field(default_factory=list)
    expect_exit: int = 0


class NodeInfoArguments(_NodesArguments):
    pass


def _owner(part: reasons.Part, health_drains: tuple[str, ...]) -> str:
    """Whose part of a drain reason it is, for a plan."""
    who = ("a node health check, which this health check answers"
           if reasons.answered(part, health_drains) else part.owner())
    return f'{who}: "{part.text}"'


class _SlurmAction(NeedsOperations, ActionBase[SlurmBackend, SlurmConfig]):
    def _read(self, names: list[str], with_jobs: bool = True) -> list[NodeInfo]:
        found = self.backend.nodes(names, with_jobs=with_jobs)
        missing = sorted(set(names) - {node.name for node in found})
        if missing:
            raise ActionError(
                f"Slurm does not know {compress(missing)}: check the node names "
                "(sinfo -N lists the cluster's nodes)"
            )
        return found

    def _drain_notes(self, names: list[str], override: bool,
                     health_drains: tuple[str, ...] = ()) -> list[str]:
        """For a plan: each drained node's reason and owner, and whether a return to service
        lifts it (a health check passes ``health_drains``: the node health check's drains
        it answers). Read now (the run reads again before it resumes anything)."""
        try:
            nodes = self._read(names, with_jobs=False)
        except ActionError as exc:
            return [f"drain reasons of {compress(names)} could not be read now ({exc}); they "
                    "are read again before anything is resumed"]
        notes = []
        for node in nodes:
            if "DRAIN" not in node.flags:
                continue
            owners = "; ".join(_owner(p, health_drains) for p in reasons.parts(node.reason))
            stop = reasons.blocking(node.reason, health_drains)
            verdict = ("lifted: override_drains=true" if stop and override else
                       "STAYS DRAINED: not lifted without override_drains=true (break-glass)"
                       if stop else "lifted once the node passes")
            notes.append(f"{node.name} is drained by {owners or 'someone (no reason)'}: "
                         f"{verdict}")
        return notes

    def _not_liftable(self, nodes: list[NodeInfo], override: bool,
                      health_drains: tuple[str, ...] = ()) -> dict[str, str]:
        return {} if override else reasons.not_liftable(nodes, health_drains)

    def _refuse_others_drain(self, node: NodeInfo, what: str,
                             health_drains: tuple[str, ...] = ()) -> None:
        """Before resuming ``node`` inside a reservation to work on it: another owner's
        drain (or the bot's for a failed check) is not ours to lift; ``health_drains``: a
        node health check's drains the work's own health check answers (reasons.py)."""
        stays = reasons.not_liftable([node], health_drains)
        if stays:
            raise ActionError(f"{node.name} is {stays[node.name]}: {what} would lift that "
                              "drain, so nothing was changed")

    def _resume(self, names: list[str]) -> str | None:
        """``scontrol update State=RESUME`` of ``names``; Slurm's warning when it answered
        one it need not have, else None."""
        try:
            self.backend.update_nodes(names, "RESUME", None)
        except SlurmError as exc:
            # Slurm 22.05 clears DRAIN on never-registered (UNKNOWN) nodes but still
            # answers "Invalid node state specified" (26.05: "... transition"): judge by
            # what the nodes show now.
            if not any(words in str(exc) for words in INVALID_STATE):
                raise
            if any("DRAIN" in n.flags for n in self._read(names, with_jobs=False)):
                raise
            return exc.stderr
        return None

    def _resume_inside(self, name: str, reservation: str, ctx: ActionContext,
                       limit: float) -> None:
        """Resume a drained or down node inside its maintenance reservation (srun cannot
        start on a drained node; the reservation keeps every job out) and wait until it
        responds, undrained. The callers check the reservation and whose drain it is."""
        self.backend.update_nodes([name], "RESUME", None)
        ctx.progress(f"resumed {name} inside reservation {reservation}")
        self._wait_nodes([name], ctx, limit, 0.5,
                         lambda n: n.responding and "DRAIN" not in n.flags, "responding")

    def _wait_nodes(self, names: list[str], ctx: ActionContext, limit: float, poll: float,
                    done: Callable[[NodeInfo], bool], what: str) -> list[NodeInfo]:
        """Poll until ``done`` holds for every node; ActionTimeout naming the rest."""
        deadline = time.monotonic() + min(limit, ctx.remaining())
        while True:
            nodes = self._read(names, with_jobs=False)
            pending = [node for node in nodes if not done(node)]
            if not pending:
                return nodes
            if time.monotonic() >= deadline:
                raise ActionTimeout(
                    f"{compress([n.name for n in pending])} still not {what} after "
                    f"{format_duration(limit)}: " + "; ".join(n.describe() for n in pending[:10])
                )
            ctx.checkpoint(f"waiting for {compress([n.name for n in pending])} to be {what}")
            self._sleep(max(0.05, ctx.pause(min(poll, deadline - time.monotonic()))))


class DrainAction(_SlurmAction):
    name: ClassVar[str] = "slurm.drain"
    takes_out: ClassVar[tuple[str, ...]] = ("nodes",)
    Arguments: ClassVar[type[StrictArguments]] = DrainArguments
    needs: ClassVar[tuple[str, ...]] = ("update_nodes",)

    def plan(self, args: DrainArguments) -> list[str]:
        reason = f"{args.reason} {reasons.PLACEHOLDER}"
        return [commands.show(commands.update_nodes(args.names, "DRAIN", reason)),
                "a node drained already keeps its reason; this one is added after it "
                f"(\"THEIRS{reasons.JOIN}{reason}\")"]

    def run(self, args: DrainArguments, ctx: ActionContext) -> ActionResult:
        """Drain with the reason marked as this execution's. A node someone else drained
        keeps their reason (recorded in the details), ours joined after it."""
        ours = reasons.marked(args.reason, ctx.execution_id, args.failed_check)
        nodes = self._read(args.names, with_jobs=False)
        todo = [n.name for n in nodes if "DRAIN" not in n.flags]
        kept = {n.name: n.reason for n in nodes if "DRAIN" in n.flags
                and not any(p.execution == ctx.execution_id for p in reasons.parts(n.reason))}
        if todo:
            self.backend.update_nodes(todo, "DRAIN", ours)
        for name, theirs in kept.items():
            self.backend.update_nodes([name], "DRAIN", reasons.joined(theirs, ours))
        details: dict[str, Any] = {"drained": todo, "kept_reasons": kept, "reason": ours,
                                   "already_drained": list(kept)}
        if not todo and not kept:
            return ActionResult(f"{args.hostlist} already drained by this execution", details,
                                changed=False)
        said = [f'drained {compress(todo)} (reason "{ours}")'] if todo else []
        said += [f'{name} was drained already ("{theirs}"): that reason is kept, ours added '
                 "after it" for name, theirs in kept.items()]
        return ActionResult("; ".join(said), details)


class ResumeAction(_SlurmAction):
    name: ClassVar[str] = "slurm.resume"
    Arguments: ClassVar[type[StrictArguments]] = ResumeArguments
    needs: ClassVar[tuple[str, ...]] = ("update_nodes",)

    def plan(self, args: ResumeArguments) -> list[str]:
        lines = [commands.show(commands.update_nodes(args.names, "RESUME", None))
                 + ("  # only what this execution drained: another owner's reason is put "
                    "back, the node left drained" if args.only_this_run else "")]
        if args.wait:
            lines.append(f"wait until {args.hostlist} respond (at most "
                         f"{format_duration(args.wait_timeout)})")
        return lines

    def run(self, args: ResumeArguments, ctx: ActionContext) -> ActionResult:
        nodes = self._read(args.names, with_jobs=False)
        if args.only_this_run:
            nodes = self._give_back(nodes, ctx)
        todo = [n.name for n in nodes if "DRAIN" in n.flags or n.state == "down"]
        skipped = [n.name for n in nodes if n.name not in todo]
        details: dict[str, Any] = {"resumed": todo, "already_in_service": skipped}
        if todo:
            warning = self._resume(todo)
            if warning is not None:
                details["scontrol_warning"] = warning
            ctx.progress(f"resumed {compress(todo)}")
        if args.wait:
            after = self._wait_nodes(args.names, ctx, args.wait_timeout, 0.5,
                                     lambda n: n.responding and "DRAIN" not in n.flags,
                                     "responding and undrained")
            details["nodes"] = [n.as_dict() for n in after]
        if not todo:
            return ActionResult(f"{args.hostlist} already in service", details, changed=False)
        return ActionResult(f"resumed {compress(todo)}", details)


    def _give_back(self, nodes: list[NodeInfo], ctx: ActionContext) -> list[NodeInfo]:
        """Of ``nodes``, those only this execution drains (to resume); where another owner's
        reason was there first, ours comes off it and the node stays drained for them. A
        node this execution kept out for a failed check stays out: an undo never returns
        hardware a check found faulty (as Kubernetes' ``made_by`` leaves its cordon)."""
        mine = []
        for node in nodes:
            if "DRAIN" not in node.flags:
                continue
            own = [p for p in reasons.parts(node.reason) if p.execution == ctx.execution_id]
            if any(p.failed_check for p in own):
                ctx.progress(f"{node.name} stays drained: this execution's check failed")
                continue
            left = reasons.without(node.reason, ctx.execution_id)
            if own and not left:
                mine.append(node)
            elif own:
                self.backend.update_nodes([node.name], "DRAIN", left)
                ctx.progress(f"{node.name} stays drained for its other owner: \"{left}\"")
        return mine


class WaitIdleAction(_SlurmAction):
    name: ClassVar[str] = "slurm.wait_idle"
    Arguments: ClassVar[type[StrictArguments]] = WaitIdleArguments

    def operations(self, args: object) -> tuple[str, ...]:
        return ("requeue",) if getattr(args, "requeue", False) else ()

    def plan(self, args: WaitIdleArguments) -> list[str]:
        lines = []
        if args.requeue:
            lines.append(f"scontrol requeue <jobs running on {args.hostlist}>")
        lines.append(f"wait until no job runs on {args.hostlist} (squeue; at most "
                     f"{format_duration(args.timeout)})")
        return lines

    def run(self, args: WaitIdleArguments, ctx: ActionContext) -> ActionResult:
        started = time.monotonic()
        deadline = started + min(args.timeout, ctx.remaining())
        requeued: list[int] = []
        last_line = ""
        states = NodeStates(args.names, ctx, ("idle", "running jobs"), "running jobs")
        while True:
            running = [job for job in self.backend.jobs(args.names) if job.active]
            busy = {name for job in running for name in job.nodes}
            for name in args.names:  # per node, for the execution's one chat message
                states.set(name, "running jobs" if name in busy else "idle")
            states.publish(force=not running)
            if not running:
                waited = time.monotonic() - started
                summary = f"no job runs on {args.hostlist}"
                if requeued:
                    summary += f" (requeued {', '.join(map(str, requeued))})"
                return ActionResult(summary, {"waited_seconds": round(waited, 1),
                                              "requeued": requeued}, changed=bool(requeued))
            if args.requeue:
                fresh = [job.id for job in running if job.id not in requeued]
                if fresh:
                    if ctx.stopping():  # never requeue after a stop
                        ctx.checkpoint(f"waiting for jobs on {args.hostlist}")
                    self.backend.requeue(fresh)
                    requeued += fresh
                    ctx.progress(f"requeued {', '.join(map(str, fresh))} on {args.hostlist}")
            if time.monotonic() >= deadline:
                raise ActionTimeout(
                    f"jobs still running on {args.hostlist} after {format_duration(args.timeout)}: "
                    + "; ".join(job.describe() for job in running[:20])
                    + (f" and {len(running) - 20} more" if len(running) > 20 else "")
                    + " (retry with a longer timeout, requeue: true, or scancel them)"
                )
            line = (f"waiting for {len(running)} job(s) on {args.hostlist}: "
                    + ", ".join(str(job.id) for job in running[:10]))
            if line != last_line:
                ctx.progress(line)
                last_line = line
            ctx.checkpoint(f"waiting for jobs on {args.hostlist}")
            self._sleep(max(0.05, ctx.pause(min(args.poll, deadline - time.monotonic()))))


class ReservationCreateAction(_SlurmAction):
    name: ClassVar[str] = "slurm.reservation_create"
    takes_out: ClassVar[tuple[str, ...]] = ("nodes",)
    Arguments: ClassVar[type[StrictArguments]] = ReservationCreateArguments
    needs: ClassVar[tuple[str, ...]] = ("create_reservation",)

    def _argv(self, args: ReservationCreateArguments) -> list[str]:
        return commands.create_reservation(args.name, args.names, args.start, args.duration,
                                           args.flags, args.users)

    def plan(self, args: ReservationCreateArguments) -> list[str]:
        return [commands.show(self._argv(args))]

    def run(self, args: ReservationCreateArguments, ctx: ActionContext) -> ActionResult:
        existing = {r.name: r for r in self.backend.reservations()}
        found = existing.get(args.name)
        if found is not None:
            if set(found.nodes) == set(args.names):
                return ActionResult(
                    f"reservation {args.name} already exists on {args.hostlist}",
                    {"name": args.name, "nodes": found.nodes, "start": found.start,
                     "end": found.end, "flags": sorted(found.flags)}, changed=False)
            on = compress(found.nodes) if found.nodes else "no nodes"
            raise ActionError(
                f"reservation {args.name} already exists on {on}, not on {args.hostlist}: "
                f"delete it first (scontrol delete ReservationName={args.name}) or pick "
                "another name"
            )
        self._read(args.names, with_jobs=False)
        self.backend.create_reservation(args.name, args.names, args.start, args.duration,
                                        args.flags, args.users)
        created = next((r for r in self.backend.reservations() if r.name == args.name), None)
        details: dict[str, Any] = {"name": args.name, "nodes": args.names}
        if created is not None:
            details.update(start=created.start, end=created.end, flags=sorted(created.flags))
        return ActionResult(
            f"reservation {args.name} on {args.hostlist} for {format_duration(args.duration)} "
            f"({','.join(args.flags)})", details)


class ReservationDeleteAction(_SlurmAction):
    name: ClassVar[str] = "slurm.reservation_delete"
    Arguments: ClassVar[type[StrictArguments]] = ReservationDeleteArguments
    needs: ClassVar[tuple[str, ...]] = ("delete_reservation",)

    def plan(self, args: ReservationDeleteArguments) -> list[str]:
        return [commands.show(commands.delete_reservation(args.name))]

    def refusal(self, args: object) -> str | None:
        """Also refused, before any plan: another owner's reservation (``not_the_bots``)."""
        if isinstance(args, ReservationDeleteArguments) and args.not_the_bots:
            owner = reservation_owner(args.name)
            if owner is not None:
                return f"reservation {args.name} belongs to {owner}; nothing was changed"
        return super().refusal(args)

    def run(self, args: ReservationDeleteArguments, ctx: ActionContext) -> ActionResult:
        if not any(r.name == args.name for r in self.backend.reservations()):
            return ActionResult(f"reservation {args.name} does not exist (nothing to delete)",
                                {"name": args.name}, changed=False)
        self.backend.delete_reservation(args.name)
        return ActionResult(f"deleted reservation {args.name}", {"name": args.name})


class RebootAction(_SlurmAction):
    name: ClassVar[str] = "slurm.reboot"
    takes_out: ClassVar[tuple[str, ...]] = ("nodes",)
    Arguments: ClassVar[type[StrictArguments]] = RebootArguments
    needs: ClassVar[tuple[str, ...]] = ("reboot",)

    def plan(self, args: RebootArguments) -> list[str]:
        lines = [commands.show(commands.reboot(args.names, args.nextstate, args.reason))]
        if args.wait:
            lines.append(f"wait until {args.hostlist} rebooted and respond (at most "
                         f"{format_duration(args.wait_timeout)})")
        return lines

    def run(self, args: RebootArguments, ctx: ActionContext) -> ActionResult:
        before = {n.name: n for n in self._read(args.names, with_jobs=False)}
        pending = [name for name, n in before.items() if n.flags & REBOOT_FLAGS]
        todo = [name for name in args.names if name not in pending]
        details: dict[str, Any] = {"rebooted": todo, "reboot_already_pending": pending}
        if todo:
            self.backend.reboot(todo, args.nextstate, args.reason)
            ctx.progress(f"reboot ASAP requested for {compress(todo)}")
        if args.wait:
            def back(node: NodeInfo) -> bool:
                old = before[node.name].boot_time
                rebooted = node.boot_time is None or old is None or node.boot_time > old
                if node.flags & REBOOT_FLAGS or not node.responding or not rebooted:
                    return False
                return args.nextstate == "DOWN" or node.state != "down"

            after = self._wait_nodes(args.names, ctx, args.wait_timeout, args.poll, back,
                                     "back from the reboot")
            details["nodes"] = [n.as_dict() for n in after]
        if not todo:
            return ActionResult(f"reboot of {args.hostlist} already pending", details,
                                changed=False)
        return ActionResult(f"reboot ASAP of {compress(todo)} (then {args.nextstate})", details)


class RunOnNodeAction(_SlurmAction):
    name: ClassVar[str] = "slurm.run_on_node"
    Arguments: ClassVar[type[StrictArguments]] = RunOnNodeArguments
    needs: ClassVar[tuple[str, ...]] = ("run_on_node",)

    def _command(self, args: RunOnNodeArguments) -> tuple[HostCommand, list[str]]:
        return allowed_argv(self.config.commands, args.command, args.args, "node command",
                            "slurm.commands")

    def plan(self, args: RunOnNodeArguments) -> list[str]:
        command, argv = self._command(args)
        return [self.backend.node_run_line(args.node, args.reservation, argv,
                                  command.env)]

    def run(self, args: RunOnNodeArguments, ctx: ActionContext) -> ActionResult:
        command, argv = self._command(args)
        line = self.backend.node_run_line(args.node, args.reservation, argv,
                                 command.env)
        (node,) = self._read([args.node], with_jobs=False)
        if "DRAIN" in node.flags or node.state == "down":
            raise ActionError(
                f"{args.node} is {node.state}+{'+'.join(sorted(node.flags))}: srun cannot start "
                "a job there and would wait forever; resume the node first (inside a MAINT "
                "reservation no other job lands on it)"
            )
        if args.reservation is not None:
            reservation = next((r for r in self.backend.reservations()
                                if r.name == args.reservation), None)
            if reservation is None:
                raise ActionError(f"reservation {args.reservation} does not exist: create it "
                                  "first (slurm.reservation_create)")
            if args.node not in reservation.nodes:
                raise ActionError(f"reservation {args.reservation} does not include {args.node}")
        timeout = min(command.timeout, ctx.remaining())
        if timeout <= 0:
            raise ActionTimeout(f"no time left to run {line}")
        ctx.checkpoint(f"about to run {line}")  # srun itself is not interrupted by a stop
        code, out, err = self.backend.run_on_node(args.node, args.reservation, argv, timeout,
                                                  command.env)
        details = {"argv": argv, "line": line,
                   "exit_code": code,
                   "stdout": out[-OUTPUT_LIMIT:], "stderr": err[-OUTPUT_LIMIT:]}
        if code != args.expect_exit:
            tail = [x for x in (out.strip().splitlines() + err.strip().splitlines()) if x][-8:]
            raise ActionError(f"{line} exited {code} (expected {args.expect_exit}) on "
                              f"{args.node}: " + " | ".join(t.strip() for t in tail))
        first = out.strip().splitlines()[:1]
        summary = f"{args.command} on {args.node}: exit {code}"
        if first:
            summary += f" ({first[0].strip()[:120]})"
        return ActionResult(summary, details)


class NodeInfoAction(_SlurmAction):
    name: ClassVar[str] = "slurm.node_info"
    Arguments: ClassVar[type[StrictArguments]] = NodeInfoArguments

    def plan(self, args: NodeInfoArguments) -> list[str]:
        return [f"read the state of {args.hostlist} (sinfo, squeue)"]

    def run(self, args: NodeInfoArguments, ctx: ActionContext) -> ActionResult:
        nodes = self._read(args.names)
        summary = "; ".join(n.describe() for n in nodes[:8])
        if len(nodes) > 8:
            summary += f"; and {len(nodes) - 8} more"
        return ActionResult(summary, {"nodes": [n.as_dict() for n in nodes]}, changed=False)


# the node actions, as the topic modules have theirs (POOL_ACTIONS, MIG_ACTIONS...); the
# adapter's ACTION_CLASSES, every slurm.* action, is in adapter.py
NODE_ACTIONS: tuple[type[_SlurmAction], ...] = (
    DrainAction, ResumeAction, WaitIdleAction, ReservationCreateAction,
    ReservationDeleteAction, RebootAction, RunOnNodeAction, NodeInfoAction,
)


class SlurmActions(ActionSet[SlurmBackend, SlurmConfig]):
    """The node actions over one backend: ``SlurmActions(backend, config).all()``."""

    action_classes = NODE_ACTIONS
    default_config = SlurmConfig


__all__ = [
    "NODE_ACTIONS", "DrainAction", "NodeInfoAction", "RebootAction",
    "ReservationCreateAction", "ReservationDeleteAction", "ResumeAction", "RunOnNodeAction",
    "SlurmActions", "WaitIdleAction",
]
