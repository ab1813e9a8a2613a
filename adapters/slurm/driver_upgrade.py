"""``slurm.driver_upgrade``: a new GPU driver on canary nodes first, a soak on them, then the
rest at most ``max_parallel`` at a time (both stages with ``slurm.driver_rollout``'s
machinery), stopping at the first failure. The error lists the nodes done, the node that
failed (left drained) and the ``rollback-driver`` request for the nodes done.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import Field

from adapters.actions import (
    ActionContext,
    ActionError,
    ActionResult,
    ActionStopped,
    Seconds,
    StrictArguments,
)
from adapters.prometheus.soak import ErrorWatch
from adapters.slurm.rolling import DriverRolloutAction, RolloutArguments
from kit import hostlist
from kit.durations import format_duration

VERSION = r"^\d+(\.\d+){0,3}$"


class UpgradeArguments(StrictArguments):
    canary: str = Field(min_length=1, description="hostlist: upgraded first, then soaked")
    nodes: str = Field(default="", description="hostlist: the rest, after the soak")
    version: str = Field(pattern=VERSION)
    max_parallel: int = Field(default=1, ge=1, le=64)
    reason: str = Field(default="driver upgrade", max_length=150)
    gpu_telemetry: bool = False  # each node's GPUs in DCGM after its check (GpuGate)
    settle: Seconds | None = Field(default=None, le=3600)
    dcgm_names: dict[str, str] = Field(default_factory=dict)  # node -> its DCGM Hostname
    install_command: str = "driver-install"
    version_command: str = "driver-version"
    health_command: str = "health-check"
    diag_command: str = "health-check"  # the soak's DCGM diagnostic (dcgmi diag)
    test_job_command: str = "gpu-test-job"  # the soak's test job
    node_timeout: Seconds = 3600.0
    poll: Seconds = Field(default=1.0, le=60)
    soak: Seconds = Field(default=1800.0, le=7 * 86400.0)
    soak_poll: Seconds = Field(default=15.0, le=600)

    def stages(self) -> tuple[list[str], list[str]]:
        """(canaries, the rest); ActionError when the rest is missing or overlaps."""
        canary = hostlist.expand(self.canary)
        rest = hostlist.expand(self.nodes) if self.nodes else []
        if not rest:
            raise ActionError("nodes= is required for the Slurm pool: the nodes to upgrade "
                              "after the canaries and the soak (a hostlist, gpu[03-16])")
        both = sorted(set(canary) & set(rest))
        if both:
            raise ActionError(f"{hostlist.compress(both)} named both in canary= and in nodes=: "
                              "name each node once (canaries are upgraded first, nodes= are "
                              "the rest)")
        return canary, rest

    def rollout(self, nodes: list[str]) -> RolloutArguments:
        return RolloutArguments(
            nodes=hostlist.compress(nodes), version=self.version,
            max_parallel=self.max_parallel, reason=self.reason,
            install_command=self.install_command, version_command=self.version_command,
            health_command=self.health_command, node_timeout=self.node_timeout,
            poll=self.poll, read_previous=True, gpu_telemetry=self.gpu_telemetry,
            settle=self.settle, dcgm_names=self.dcgm_names)


@dataclass
class _Progress:
    """What the upgrade did so far, across its stages."""

    args: UpgradeArguments
    done: list[str] = field(default_factory=list)
    previous: dict[str, str] = field(default_factory=dict)
    outcomes: dict[str, str] = field(default_factory=dict)

    def rollback(self) -> str:
        """The ``rollback-driver`` request(s) for the nodes done, by their driver before."""
        groups: dict[str, list[str]] = {}
        for node in self.done:
            groups.setdefault(self.previous.get(node) or "UNKNOWN", []).append(node)
        return "; ".join(f"`runbook run rollback-driver pool=slurm nodes="
                         f"{hostlist.compress(nodes)} version={version}`"
                         for version, nodes in sorted(groups.items()))

    def stopped(self, where: str, problems: list[str], left: list[str]) -> str:
        done = hostlist.compress(self.done) if self.done else "none"
        text = (f"driver upgrade to {self.args.version} stopped in {where}: "
                + "; ".join(problems)
                + f". Done (on driver {self.args.version}): {done}")
        if left:
            text += f"; not started: {hostlist.compress(left)}"
        if self.done:
            text += f". To roll the nodes done back: {self.rollback()}"
        return text

    def details(self) -> dict[str, object]:
        return {"version": self.args.version, "done": self.done, "previous": self.previous,
                "nodes": self.outcomes}


class DriverUpgradeAction(DriverRolloutAction):
    """Canaries (``canary``) through ``slurm.driver_rollout``'s per-node sequence (each
    node's driver read first, for the rollback), then the soak: for ``soak`` no new XID or
    ECC error on the canaries in Prometheus (``ErrorWatch``), then on each canary through
    srun the diagnostic (``diag_command``, dcgmi diag) and the test job
    (``test_job_command``), then the counters once more; then ``nodes`` the same way.

    A failure stops it: a node that failed is left drained (as the rollout leaves it), a
    failed soak drains the canaries; the error lists the nodes done and the rollback-driver
    request for them. A stop (cancel) is seen between nodes, every second of the soak and
    between sruns, and reported the same way.
    """

    name: ClassVar[str] = "slurm.driver_upgrade"
    takes_out: ClassVar[tuple[str, ...]] = ("canary", "nodes")
    Arguments: ClassVar[type[StrictArguments]] = UpgradeArguments


    def _watch(self, nodes: list[str]) -> ErrorWatch:
        if self.prometheus is None:
            raise ActionError("the soak watches the canaries' XID and ECC errors in "
                              "Prometheus: configure prometheus: first")
        return ErrorWatch(self.prometheus, nodes)

    def plan(self, args: UpgradeArguments) -> list[str]:  # type: ignore[override]
        canary, rest = args.stages()
        watch = self._watch(canary)
        soak = [f"soak {format_duration(args.soak)}: {watch.query()} must not rise on "
                f"{hostlist.compress(canary)} (no new XID or ECC error), polled every "
                f"{format_duration(args.soak_poll)}"]
        soak += [f"soak: srun -w {node} {' '.join(self._argv(name, []))}"
                 for node in canary for name in (args.diag_command, args.test_job_command)]
        soak.append("soak: the error counters once more; a failed soak drains the canaries")
        return (["canaries:", *super().plan(args.rollout(canary)), *soak,
                 f"then the rest, at most {args.max_parallel} at a time:",
                 *super().plan(args.rollout(rest))[1:],
                 "on a failure: stop; the error lists the nodes done and the rollback-driver "
                 "request for them"])

    def run(self, args: UpgradeArguments, ctx: ActionContext) -> ActionResult:  # type: ignore[override]
        canary, rest = args.stages()
        for name in (args.install_command, args.health_command, args.version_command,
                     args.diag_command, args.test_job_command):
            self._argv(name, [])  # fail before touching any node
        watch = self._watch(canary)
        self._refuse_others_drains(canary + rest)
        progress = _Progress(args)
        self._stage("the canaries", canary, rest, args, ctx, progress)
        self._soak(canary, rest, watch, args, ctx, progress)
        self._stage("the rest", rest, [], args, ctx, progress)
        return ActionResult(
            f"{len(progress.done)} node(s) on driver {args.version} (canaries "
            f"{hostlist.compress(canary)}, soaked {format_duration(args.soak)})",
            progress.details())

    def _stage(self, where: str, nodes: list[str], later: list[str], args: UpgradeArguments,
               ctx: ActionContext, progress: _Progress) -> None:
        ctx.progress(f"{where}: {hostlist.compress(nodes)} to driver {args.version}")
        state = self._roll(args.rollout(nodes), ctx)
        progress.previous.update(state.previous)
        progress.outcomes.update(state.done)
        progress.done += [n for n in nodes if state.done.get(n, "").startswith("on driver")]
        bad = [f"{n}: {o} (left drained)" for n, o in state.done.items()
               if o.startswith(("FAILED", "STOPPED"))]
        bad += [state.refused] if state.refused else []
        left = [n for n in nodes if n not in state.done] + later
        if ctx.stop.is_set():
            raise ActionStopped(progress.stopped(
                where, [f"{ctx.step_id}: {ctx.stop_reason or 'asked to stop'}", *bad], left))
        if bad:
            raise ActionError(progress.stopped(where, bad, left))

    def _soak(self, canary: list[str], rest: list[str], watch: ErrorWatch,
              args: UpgradeArguments, ctx: ActionContext, progress: _Progress) -> None:
        ctx.progress(f"soak: {format_duration(args.soak)} on {hostlist.compress(canary)}")
        try:
            watch.hold(args.soak, args.soak_poll, ctx, self._sleep)
            for node in canary:
                for command in (args.diag_command, args.test_job_command):
                    ctx.checkpoint(f"soak: {command} on {node}")
                    try:
                        self._srun(node, None, command, [], ctx.deadline)
                    except ActionError as exc:
                        raise ActionError(f"{node}: {exc}") from exc
            found = watch.problems()
            if found:
                raise ActionError("new GPU errors during the soak: " + "; ".join(found[:10]))
        except ActionStopped as exc:
            raise ActionStopped(progress.stopped("the soak", [str(exc)], rest)) from exc
        except ActionError as exc:
            for node in canary:
                self._leave_drained(node, "", f"driver {args.version} soak failed: {exc}", ctx)
            raise ActionError(progress.stopped(
                "the soak", [f"{exc} (canaries {hostlist.compress(canary)} left drained)"],
                rest)) from exc
