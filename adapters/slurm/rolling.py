"""``slurm.driver_rollout``: change the GPU driver node by node, at most N at a time.

A node that fails, or is in flight when the step must stop, is left drained with a reason
that says why; no further node is started after either.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import Field, model_validator

from adapters.actions import (
    ActionBase,
    ActionContext,
    ActionError,
    ActionResult,
    ActionStopped,
    Seconds,
    StrictArguments,
)
from adapters.host import allowed_argv, verdict
from adapters.prometheus.gate import GateFailed, GpuGate, GpuGated, gate_for
from adapters.slurm import reasons
from adapters.slurm.backend import REBOOT_FLAGS, NeedsOperations, SlurmBackend
from adapters.slurm.config import SlurmConfig
from kit import hostlist

MAINT = ["MAINT", "IGNORE_JOBS"]


class RolloutArguments(StrictArguments):
    nodes: str
    version: str = Field(pattern=r"^\d+(\.\d+){0,3}$")

    @model_validator(mode="before")
    @classmethod
    def _named(cls, data: Any) -> Any:
        """A Slurm rollout names its nodes and driver: say so rather than "not a string"."""
        if isinstance(data, dict):
            for key, what in (("nodes", "the nodes (a hostlist, gpu[01-16])"),
                              ("version", "the driver version (535.161.08)")):
                if data.get(key) in (None, ""):
                    raise ValueError(f"{key}= is required for the Slurm pool: {what}")
        return data
    max_parallel: int = Field(default=1, ge=1, le=64)
    reason: str = Field(default="driver change", max_length=150)
    install_command: str = "driver-install"
    version_command: str = "driver-version"
    health_command: str = "health-check"
    node_timeout: Seconds = 3600.0
    poll: Seconds = Field(default=1.0, le=60)
    # read each node's driver (version_command) before installing: details["previous"]
    read_previous: bool = False
    # after each node's health check and driver read: its GPUs in DCGM for `settle` seconds
    # (null: prometheus.gpu_settle); a failure leaves the node drained with the verdict
    gpu_telemetry: bool = False
    settle: Seconds | None = Field(default=None, le=3600)
    dcgm_names: dict[str, str] = Field(default_factory=dict)  # node -> its DCGM Hostname


@dataclass
class _Run:
    args: RolloutArguments
    ctx: ActionContext
    stop: threading.Event = field(default_factory=threading.Event)
    done: dict[str, str] = field(default_factory=dict)  # node -> outcome
    lock: threading.Lock = field(default_factory=threading.Lock)
    taking: threading.Lock = field(default_factory=threading.Lock)  # guard + drain, one node
    refused: str = ""  # the capacity guard's verdict that stopped the rollout
    previous: dict[str, str] = field(default_factory=dict)  # node -> driver before (read_previous)

    def record(self, node: str, outcome: str) -> None:
        with self.lock:
            self.done[node] = outcome
        self.ctx.progress(f"{node}: {outcome} ({len(self.done)} of "
                          f"{len(hostlist.expand(self.args.nodes))})")


class DriverRolloutAction(GpuGated, NeedsOperations, ActionBase[SlurmBackend, SlurmConfig]):
    """Per node, in order: drain (running jobs finish), wait until idle, reserve the node for
    maintenance (MAINT, IGNORE_JOBS), resume it inside the reservation (so jobs can run there
    but nobody else's), run the site's driver command with the target version through srun,
    ``scontrol reboot ASAP nextstate=RESUME``, wait until the node is back, run the health
    check, read the driver version back, and delete the reservation. Before each node's
    drain the capacity guard is asked again with the numbers of that moment
    (``ctx.guard_capacity``): a refusal stops the rollout there, that node untouched.
    Commands are the configured ones (``SlurmConfig.commands``); nodes already in flight when
    one fails finish.

    A stop (cancel, lost claim, the step's timeout) is looked at before every change and at
    least every second while waiting: the nodes in flight are left drained (their driver is
    in an unknown state) and the step ends with ActionStopped. A running srun (the install,
    health or version command) is not interrupted: the stop is seen once it returns.
    """

    name: ClassVar[str] = "slurm.driver_rollout"
    takes_out: ClassVar[tuple[str, ...]] = ("nodes",)
    Arguments: ClassVar[type[StrictArguments]] = RolloutArguments
    needs: ClassVar[tuple[str, ...]] = (
        "update_nodes", "create_reservation", "delete_reservation",
        "run_on_node", "reboot")


    def _argv(self, name: str, extra: list[str]) -> list[str]:
        return allowed_argv(self.config.commands, name, extra, "node command",
                            "slurm.commands")[1]

    def _gate(self, args: RolloutArguments, node: str, expect: int) -> GpuGate:
        return gate_for(self.prometheus, args.dcgm_names.get(node, node), expect,
                        f"the driver change's check of {node}")

    def _gpus_settle(self, state: _Run, node: str) -> None:
        """The node's GPUs in DCGM after its check, before its reservation goes."""
        args = state.args
        if not args.gpu_telemetry:
            return
        (info,) = self.backend.nodes([node], with_jobs=False)
        settle = self.settle_for(args.settle)
        try:
            self._gate(args, node, info.gpus_total).check(settle, state.ctx, self._sleep)
        except GateFailed as exc:
            raise ActionError(f"GPU telemetry: {exc}") from exc

    def plan(self, args: RolloutArguments) -> list[str]:
        nodes = hostlist.expand(args.nodes)
        install = shlex.join(self._argv(args.install_command, [args.version]))
        health = shlex.join(self._argv(args.health_command, []))
        check = shlex.join(self._argv(args.version_command, []))
        lines = [f"{len(nodes)} node(s), at most {args.max_parallel} at a time, "
                 "stop at the first failure"]
        for node in nodes:
            res = _reservation(node)
            before = (f"srun -w {node} --reservation={res} {check} (the driver before); "
                      if args.read_previous else "")
            lines.append(
                f"{node}: scontrol update NodeName={node} State=DRAIN Reason=\"{args.reason}\"; "
                f"wait idle; scontrol create reservation ReservationName={res} Nodes={node} "
                f"Flags=MAINT,IGNORE_JOBS; resume; {before}"
                f"srun -w {node} --reservation={res} {install}; "
                f"scontrol reboot ASAP nextstate=RESUME {node}; srun {health}; "
                f"srun {check} = {args.version}; "
                + ("its GPUs in DCGM (below); " if args.gpu_telemetry else "")
                + f"scontrol delete reservation {res}"
            )
        if args.gpu_telemetry:
            settle = self.settle_for(args.settle)
            gpus = {n.name: n.gpus_total for n in self.backend.nodes(nodes, with_jobs=False)}
            lines += ["then, on each node, " + self._gate(args, node, gpus.get(node, 0))
                      .describe(settle) for node in nodes[:1]]
        return lines

    def run(self, args: RolloutArguments, ctx: ActionContext) -> ActionResult:
        nodes = hostlist.expand(args.nodes)
        for name in (args.install_command, args.health_command, args.version_command):
            self._argv(name, [])  # fail before touching any node
        self._refuse_others_drains(nodes)
        state = self._roll(args, ctx)
        failed = {n: o for n, o in state.done.items() if o.startswith("FAILED")}
        stopped = {n: o for n, o in state.done.items() if o.startswith("STOPPED")}
        untouched = [n for n in nodes if n not in state.done]
        details = {"nodes": state.done, "not_started": untouched, "version": args.version,
                   **({"previous": state.previous} if args.read_previous else {})}
        if stopped or (untouched and ctx.stop.is_set()):
            raise ActionStopped(
                f"{ctx.step_id}: driver rollout stopped: {ctx.stop_reason or 'asked to stop'}"
                + "".join(f"; {n}: {o}" for n, o in {**failed, **stopped}.items())
                + (f"; not started: {hostlist.compress(untouched)}" if untouched else ""))
        if failed or state.refused:
            raise ActionError(
                "; ".join([*(f"{n}: {o}" for n, o in failed.items()),
                           *([state.refused] if state.refused else [])])
                + (f"; not started: {hostlist.compress(untouched)}" if untouched else "")
            )
        return ActionResult(summary=f"{len(nodes)} node(s) now on driver {args.version}",
                            details=details)

    def _roll(self, args: RolloutArguments, ctx: ActionContext) -> _Run:
        """Every node of ``args.nodes``, at most ``max_parallel`` at a time; no node starts
        after one failed or a stop. The outcomes are in the returned ``_Run``."""
        state = _Run(args, ctx)
        with ThreadPoolExecutor(args.max_parallel, thread_name_prefix="rollout") as pool:
            for future in [pool.submit(self._node, state, node)
                           for node in hostlist.expand(args.nodes)]:
                future.result()
        return state

    def _node(self, state: _Run, node: str) -> None:
        if state.stop.is_set() or state.ctx.stopping():
            return
        args = state.args
        ctx = state.ctx
        deadline = min(time.monotonic() + args.node_timeout, ctx.deadline)
        res = _reservation(node)
        try:
            # the guard and the drain as one: two nodes starting at once never both pass
            # on GPUs only one of them may take
            with state.taking:
                if not self._guarded(state, node):
                    return
                self.backend.update_nodes([node], "DRAIN", reasons.marked(
                    f"{args.reason} -> {args.version}", ctx.execution_id))
            self._wait(state, lambda: not [j for j in self.backend.jobs([node]) if j.active],
                       deadline, f"{node}: its jobs to end")
            ctx.checkpoint(f"{node}: reserving it")
            if not any(r.name == res for r in self.backend.reservations()):
                self.backend.create_reservation(res, [node], "now", args.node_timeout, MAINT,
                                                ["root"])
            self.backend.update_nodes([node], "RESUME", None)
            self._wait(state, lambda: self._responding(node), deadline, f"{node}: to answer")
            if args.read_previous:
                before = self._srun(node, res, args.version_command, [], deadline).strip()
                with state.lock:
                    state.previous[node] = before.splitlines()[0].strip() if before else ""
            ctx.checkpoint(f"{node}: installing driver {args.version}")
            self._srun(node, res, args.install_command, [args.version], deadline)
            ctx.checkpoint(f"{node}: rebooting it")
            self.backend.reboot([node], "RESUME", f"{args.reason} -> {args.version}")
            self._sleep(ctx.pause(args.poll))
            self._wait(state, lambda: self._responding(node), deadline, f"{node}: to come back")
            ctx.checkpoint(f"{node}: checking it")
            self._srun(node, res, args.health_command, [], deadline)
            seen = self._srun(node, res, args.version_command, [], deadline).strip()
            first = seen.splitlines()[0].strip() if seen else ""
            if first != args.version:
                raise ActionError(f"reports driver {first or 'nothing'}, not {args.version}")
            self._gpus_settle(state, node)
            self.backend.delete_reservation(res)
            state.record(node, f"on driver {args.version}")
        except ActionStopped as exc:
            state.stop.set()
            self._leave_drained(node, res, f"driver {args.version} rollout stopped: "
                                f"{ctx.stop_reason or exc}", ctx)
            state.record(node, f"STOPPED: {exc}")
        except ActionError as exc:
            state.stop.set()
            self._leave_drained(node, res, f"driver {args.version} failed: {exc}", ctx)
            state.record(node, f"FAILED: {exc}")

    def _refuse_others_drains(self, nodes: list[str]) -> None:
        """Each node is resumed inside its reservation on the way: a node drained by someone
        else, or by the bot for a failed check, is refused before any node is touched."""
        stays = reasons.not_liftable(self.backend.nodes(nodes, with_jobs=False))
        if stays:
            raise ActionError(
                "; ".join(f"{name} is {why}" for name, why in stays.items())
                + ": the rollout would lift that drain, so nothing was started. Resume or "
                "leave out those nodes first")

    def _guarded(self, state: _Run, node: str) -> bool:
        """The capacity guard lets ``node`` go out now; else the rollout stops there, the
        node untouched (not started), and the verdict is the step's error."""
        if state.stop.is_set():
            return False
        try:
            state.ctx.guard_capacity([node])
        except ActionError as exc:
            state.stop.set()
            state.refused = str(exc)
            state.ctx.progress(f"{node}: not started: {exc}")
            return False
        return True

    def _leave_drained(self, node: str, res: str, reason: str, ctx: ActionContext) -> None:
        try:
            self.backend.update_nodes([node], "DRAIN", reasons.marked(
                reason, ctx.execution_id, failed_check=True))
            if any(r.name == res for r in self.backend.reservations()):
                self.backend.delete_reservation(res)
        except ActionError:
            pass  # the node's failure is already reported; this is best effort

    def _srun(self, node: str, res: str | None, command: str, extra: list[str],
              deadline: float) -> str:
        argv = self._argv(command, extra)
        timeout = max(1.0, min(self.config.commands[command].timeout,
                               deadline - time.monotonic()))
        code, out, err = self.backend.run_on_node(node, res, argv, timeout,
                                                  self.config.commands[command].env)
        if code != 0:
            raise ActionError(f"{command} failed: {verdict(out, err, code)}")
        return out

    def _responding(self, node: str) -> bool:
        info = self.backend.nodes([node], with_jobs=False)
        return bool(info) and info[0].responding and not (REBOOT_FLAGS & info[0].flags) and (
            "DRAIN" not in info[0].flags)

    def _wait(self, state: _Run, condition: Callable[[], bool], deadline: float,
              what: str) -> None:
        ctx = state.ctx
        while not condition():
            if time.monotonic() >= deadline:
                raise ActionError(f"timed out waiting for {what}")
            ctx.checkpoint(f"waiting for {what}")
            self._sleep(ctx.pause(min(state.args.poll, deadline - time.monotonic())))


def _reservation(node: str) -> str:
    return f"driver-{node}"
