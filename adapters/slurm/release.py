"""``slurm.reservation_release``: delete a maintenance reservation, but first gate the GPUs of
every node it returns to service (not drained, not down) in DCGM through Prometheus
(``prometheus/gate.py``, all at once). A node that fails is drained with the verdict, marked
as a failed check, before the reservation goes; the step then fails naming it, the other
nodes being back in service. close-maintenance uses it; undos keep the plain delete.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from adapters.actions import ActionContext, ActionError, ActionResult, Seconds, StrictArguments
from adapters.prometheus.gate import GpuGated, gate_for, gate_nodes
from adapters.slurm import reasons
from adapters.slurm.actions import ReservationDeleteAction, ReservationDeleteArguments
from adapters.slurm.backend import NodeInfo
from kit.durations import format_duration
from kit.hostlist import compress


class ReleaseArguments(ReservationDeleteArguments):
    gpu_telemetry: bool = True
    settle: Seconds | None = Field(default=None, le=3600)  # null: prometheus.gpu_settle
    # False: nodes kept out are named in the result (details kept_out), not raised, so the
    # steps after it still run (close-window: uncordon, unsilence, report)
    fail_on_kept: bool = True


def returning(nodes: list[NodeInfo]) -> list[NodeInfo]:
    """The nodes a deleted reservation puts back in service: not drained, not down."""
    return [n for n in nodes if "DRAIN" not in n.flags and n.state != "down" and n.gpus_total]


class ReservationReleaseAction(GpuGated, ReservationDeleteAction):
    name: ClassVar[str] = "slurm.reservation_release"
    Arguments: ClassVar[type[StrictArguments]] = ReleaseArguments
    needs: ClassVar[tuple[str, ...]] = ("delete_reservation", "update_nodes")

    def plan(self, args: ReservationDeleteArguments) -> list[str]:
        assert isinstance(args, ReleaseArguments)
        if not args.gpu_telemetry:
            return super().plan(args)
        gate_for(self.prometheus, args.name, 0, "close-maintenance")  # refused without it
        return [f"first, DCGM in Prometheus for each node of {args.name} that returns to "
                "service (not drained, not down): every GPU of its gres reports, no GPU alert "
                f"fires, and for {format_duration(self.settle_for(args.settle))} no XID or "
                "ECC counter rises; a node that fails is drained with the verdict (a failed "
                "check) before the reservation goes"
                + (", and the step fails naming it" if args.fail_on_kept else
                   ", named in the step's result"),
                *super().plan(args)]

    def run(self, args: ReservationDeleteArguments, ctx: ActionContext) -> ActionResult:
        assert isinstance(args, ReleaseArguments)
        found = next((r for r in self.backend.reservations() if r.name == args.name), None)
        if found is None or not args.gpu_telemetry:
            return super().run(args, ctx)
        kept = self._gate(args, self._read(found.nodes, with_jobs=False), ctx)
        result = super().run(args, ctx)
        details = {**result.details, "kept_out": kept}
        if kept:
            text = (f"{result.summary}; KEPT OUT: " + "; ".join(f"{n} ({v})" for n, v in
                                                                 kept.items())
                    + f" (drained as a failed check); the other nodes of {args.name} are "
                    "back in service. Repair the kept ones (swap-gpu, reset-gpu), whose "
                    "checks return them")
            if args.fail_on_kept:
                raise ActionError(text)
            return ActionResult(text, details)
        return ActionResult(f"{result.summary}; the GPUs of every node it returned passed",
                            details)

    def _gate(self, args: ReleaseArguments, nodes: list[NodeInfo],
              ctx: ActionContext) -> dict[str, str]:
        back = returning(nodes)
        if not back:
            return {}
        prometheus = gate_for(self.prometheus, args.name, 0, "close-maintenance").backend
        settle = self.settle_for(args.settle)
        ctx.progress(f"watching the GPUs of {compress([n.name for n in back])} in DCGM for "
                     f"{format_duration(settle)} before {args.name} goes")
        failed = gate_nodes(prometheus, {n.name: n.gpus_total for n in back}, settle, ctx,
                            self._sleep)
        for node, verdict in failed.items():
            self.backend.update_nodes([node], "DRAIN", reasons.marked(
                f"GPU telemetry: {verdict}", ctx.execution_id, failed_check=True))
        return failed
