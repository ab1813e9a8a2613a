"""``slurm.drain_batches`` and ``slurm.resume_batches``: a set of nodes in batches, one
``scontrol update`` per batch (the plan lists them). A drain marks its reason with the
execution (``(execution 42)``), so its undo (``only_this_run``) resumes exactly the nodes
this execution drained, a half-done batch's too, never nodes someone else drained.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, field_validator

from adapters.actions import ActionContext, ActionError, ActionResult, Seconds, StrictArguments
from adapters.fleetstatus import NodeStates
from adapters.prometheus.gate import GpuGated, gate_for, gate_nodes
from adapters.slurm import commands, reasons
from adapters.slurm.actions import _check_text, _NodesArguments, _SlurmAction
from adapters.slurm.backend import NodeInfo
from kit.durations import format_duration
from kit.hostlist import compress

PLACEHOLDER = reasons.PLACEHOLDER


def mark(ctx: ActionContext) -> str:
    return reasons.mark(ctx.execution_id)


def batches(names: list[str], size: int) -> list[list[str]]:
    return [names[start:start + size] for start in range(0, len(names), size)]


class DrainBatchesArguments(_NodesArguments):
    reason: str = Field(min_length=1, max_length=200)
    batch_size: int = Field(default=16, ge=1, le=1024)

    @field_validator("reason")
    @classmethod
    def _one_line(cls, value: str) -> str:
        return _check_text(value)


class ResumeBatchesArguments(_NodesArguments):
    batch_size: int = Field(default=16, ge=1, le=1024)
    only_this_run: bool = False  # only nodes whose reason carries this execution's mark
    # lift drains someone else made, or the bot made for a failed check (break-glass)
    override_drains: bool = False
    # False: nodes left drained are said in the summary, not raised, so the steps after this
    # one (resume-nodes' Kubernetes side) still run and a post-check fails the run
    fail_on_left: bool = True
    # before the resume: each node's GPUs in DCGM through Prometheus (prometheus/gate.py,
    # all nodes watched at once for `settle` seconds; null: prometheus.gpu_settle); a node
    # that fails stays drained, marked as a failed check with the verdict
    gpu_telemetry: bool = False
    settle: Seconds | None = Field(default=None, le=3600)


ALREADY = "drained already (not by this run)"


class DrainBatchesAction(_SlurmAction):
    name: ClassVar[str] = "slurm.drain_batches"
    takes_out: ClassVar[tuple[str, ...]] = ("nodes",)
    Arguments: ClassVar[type[StrictArguments]] = DrainBatchesArguments
    needs: ClassVar[tuple[str, ...]] = ("update_nodes",)

    def plan(self, args: DrainBatchesArguments) -> list[str]:
        reason = f"{args.reason} {PLACEHOLDER}"
        lines = [commands.show(commands.update_nodes(batch, "DRAIN", reason))
                 for batch in batches(args.names, args.batch_size)]
        return [*lines, f"({len(lines)} batch(es); nodes drained already are left out and "
                        "left drained by the undo)"]

    def run(self, args: DrainBatchesArguments, ctx: ActionContext) -> ActionResult:
        nodes = {n.name: n for n in self._read(args.names, with_jobs=False)}
        states = NodeStates(args.names, ctx, ("drained", ALREADY, "not started"), "not started")
        reason = f"{args.reason} {mark(ctx)}"
        done: list[str] = []
        drained = [name for name in args.names if "DRAIN" in nodes[name].flags]
        ours = {name for name in drained if nodes[name].reason.endswith(mark(ctx))}
        already = [name for name in drained if name not in ours]  # before a crash: ours
        for batch in batches(args.names, args.batch_size):
            todo = [name for name in batch if name not in drained]
            if todo:
                ctx.checkpoint(f"about to drain {compress(todo)}")  # stop between batches
                ctx.guard_capacity(todo)  # the numbers of this moment, before each batch
                self.backend.update_nodes(todo, "DRAIN", reason)
            done += [name for name in batch if name in ours or name in todo]
            for name in batch:  # a drain someone else made is not counted as this run's
                states.set(name, ALREADY if name in already else "drained")
            states.publish(force=True)
        details: dict[str, Any] = {"drained": done, "already_drained": already,
                                   "batches": len(batches(args.names, args.batch_size)),
                                   "status": states.snapshot()}
        if not done:
            return ActionResult(f"{args.hostlist} already drained", details, changed=False)
        summary = f'drained {compress(done)} (reason "{reason}")'
        if already:
            summary += f"; {compress(already)} drained already (left so by the undo)"
        return ActionResult(summary, details)


class ResumeBatchesAction(GpuGated, _SlurmAction):
    name: ClassVar[str] = "slurm.resume_batches"
    Arguments: ClassVar[type[StrictArguments]] = ResumeBatchesArguments
    needs: ClassVar[tuple[str, ...]] = ("update_nodes",)

    def plan(self, args: ResumeBatchesArguments) -> list[str]:
        which = (f"  # only the nodes whose reason ends {PLACEHOLDER}" if args.only_this_run
                 else "  # drained or down nodes")
        notes = [] if args.only_this_run else self._drain_notes(args.names, args.override_drains)
        return notes + self._gate_plan(args) + [
            commands.show(commands.update_nodes(batch, "RESUME", None)) + which
            for batch in batches(args.names, args.batch_size)]

    def _gate_plan(self, args: ResumeBatchesArguments) -> list[str]:
        if not args.gpu_telemetry:
            return []
        gate_for(self.prometheus, args.hostlist, 0, "resume-nodes")  # refused without one
        return [f"first, DCGM in Prometheus: every GPU of each node (its gres) reports, no GPU "
                f"alert fires for it, and for {format_duration(self.settle_for(args.settle))} "
                "no XID or ECC counter rises; a node that fails stays drained with the "
                "verdict, marked as a failed check"]

    def _gate(self, nodes: dict[str, NodeInfo], todo: set[str], args: ResumeBatchesArguments,
              ctx: ActionContext) -> dict[str, str]:
        """The nodes about to return that fail the GPU gate, drained again with the verdict
        (kept after another owner's reason); the others pass."""
        if not args.gpu_telemetry or not todo:
            return {}
        prometheus = gate_for(self.prometheus, args.hostlist, 0, "resume-nodes").backend
        settle = self.settle_for(args.settle)
        ctx.progress(f"watching the GPUs of {len(todo)} node(s) in DCGM for "
                     f"{format_duration(settle)} before they return")
        expect = {n: nodes[n].gpus_total for n in sorted(todo) if nodes[n].gpus_total}
        failed = gate_nodes(prometheus, expect, settle, ctx, self._sleep) if expect else {}
        for node, verdict in failed.items():
            ours = reasons.marked(f"GPU telemetry: {verdict}", ctx.execution_id,
                                  failed_check=True)
            kept = reasons.without(nodes[node].reason, ctx.execution_id)
            self.backend.update_nodes([node], "DRAIN", reasons.joined(kept, ours))
        return {node: f"failed the GPU gate: {verdict}" for node, verdict in failed.items()}

    def _ours(self, node: NodeInfo, args: ResumeBatchesArguments, ctx: ActionContext) -> bool:
        if args.only_this_run:
            return "DRAIN" in node.flags and node.reason.endswith(mark(ctx))
        return "DRAIN" in node.flags or node.state == "down"

    def run(self, args: ResumeBatchesArguments, ctx: ActionContext) -> ActionResult:
        nodes = {n.name: n for n in self._read(args.names, with_jobs=False)}
        stays = ({} if args.only_this_run else
                 self._not_liftable(list(nodes.values()), args.override_drains))
        todo = {name for name in args.names
                if name not in stays and self._ours(nodes[name], args, ctx)}
        gated = self._gate(nodes, todo, args, ctx)
        stays, todo = {**stays, **gated}, todo - set(gated)
        done: list[str] = []
        for batch in batches(args.names, args.batch_size):
            chosen = [name for name in batch if name in todo]
            if chosen:
                self._resume(chosen)
                done += chosen
        left = [name for name in args.names if name not in todo]
        details = {"resumed": done, "left_alone": left, "left_drained": stays}
        if stays:
            text = ((f"resumed {compress(done)}; " if done else "resumed nothing; ")
                    + "LEFT DRAINED: " + "; ".join(f"{n} ({why})" for n, why in stays.items())
                    + ". To return them anyway, ask again naming them with "
                    "override_drains=true (break-glass: one more approval)")
            if args.fail_on_left:
                raise ActionError(text)
            return ActionResult(text, details, changed=bool(done))
        if not done:
            return ActionResult(f"nothing to resume in {args.hostlist}", details, changed=False)
        summary = f"resumed {compress(done)}"
        if left and args.only_this_run:
            summary += f"; {compress(left)} not drained by this execution (left as they are)"
        return ActionResult(summary, details)


FLEET_ACTIONS: tuple[type[_SlurmAction], ...] = (DrainBatchesAction, ResumeBatchesAction)
