"""``slurm.nccl_test``: the node command ``nccl-test`` (all_reduce_perf) through srun across
nodes inside their reservation, with NCCL's INFO lines, judged by adapters.slurm.nccl against
the bus bandwidth recorded for that shape of node set (``NcclBaselines``, kept by the bot):
the first run of a shape records it, later ones fail naming the nodes below ``min_share`` of
it, falling back to sockets, or short of GPUs. It changes nothing on the cluster.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Protocol

from pydantic import Field

from adapters.actions import (
    ActionContext,
    ActionError,
    ActionResult,
    ActionTimeout,
    Seconds,
    StrictArguments,
)
from adapters.host import OUTPUT_LIMIT, HostCommand, allowed_argv, verdict
from adapters.slurm import commands, nccl
from adapters.slurm.actions import NAME_PATTERN, _NodesArguments, _SlurmAction
from adapters.slurm.backend import NodeInfo
from kit.hostlist import compress, expand

# NCCL's INFO lines, with the NET subsystem's (IB ports and their speeds) beside the defaults
NCCL_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,NET"}
SIZE = r"[1-9][0-9]{0,12}[KMG]?"


@dataclass(frozen=True)
class Baseline:
    """The bus bandwidth a shape of node set is expected to reach (GB/s, at the largest size),
    and the run that measured it."""

    key: str
    busbw: float
    avg_busbw: float
    nodes: str  # the hostlist of that run
    execution_id: int
    recorded_at: str = ""  # UTC ISO-8601, set by the store


class NcclBaselines(Protocol):
    """Where baselines are kept (the bot's database); the bot hands it to the action."""

    def get(self, key: str) -> Baseline | None: ...

    def record(self, baseline: Baseline, replace: bool = False) -> Baseline:
        """Keep ``baseline`` unless its key has one already (``replace``: in any case);
        returns the one kept (a concurrent first run's, when it won)."""
        ...


def baseline_key(run: nccl.NcclRun, nodes: int, gpus: int) -> str:
    """The shape a baseline is for: node count, GPUs per node, GPU model, largest size.
    Not the exact node set: a node repaired or new is compared with what healthy nodes of
    that shape reached, instead of setting its own baseline on its first (maybe slow) run."""
    model = "/".join(sorted(run.models)) or "unknown GPU"
    return f"all_reduce_perf {nodes}x{gpus} {model} up to {nccl.size_text(run.max_bytes)}"


class NcclTestArguments(_NodesArguments):
    reservation: str = Field(pattern=NAME_PATTERN)  # must exist and hold every node
    # the bot's hostlist the runbook was asked for: refused unless each is a Slurm node
    asked: str = ""
    gpus: int | None = Field(default=None, ge=1, le=64)  # per node; default: Slurm's Gres
    min_share: float = Field(default=0.8, gt=0, le=1)  # of the baseline's bus bandwidth
    sizes: str | None = Field(default=None, pattern=rf"^{SIZE}-{SIZE}$")  # "8-1G": -b -e
    timeout: Seconds = 600.0
    command: str = "nccl-test"  # slurm.commands
    rebaseline: bool = False  # this run becomes the baseline (a fabric changed)


class NcclTestAction(_SlurmAction):
    """Idempotent: running it again runs the test again (a baseline is recorded once)."""

    name: ClassVar[str] = "slurm.nccl_test"
    Arguments: ClassVar[type[StrictArguments]] = NcclTestArguments
    needs: ClassVar[tuple[str, ...]] = ("run_on_nodes",)
    baselines: NcclBaselines | None = None

    def use_baselines(self, baselines: NcclBaselines) -> None:
        """The bot's store of baselines (bot.runbooks.catalogue hands it over)."""
        self.baselines = baselines

    def refusal(self, args: object) -> str | None:
        if self.baselines is None:
            return ("slurm.nccl_test keeps its baselines in the bot's database, which this "
                    "action was not given")
        return super().refusal(args)

    def _command(self, args: NcclTestArguments) -> tuple[HostCommand, list[str]]:
        extra = []
        if args.sizes:
            low, high = args.sizes.split("-")
            extra = ["-b", low, "-e", high]
        return allowed_argv(self.config.commands, args.command, extra, "node command",
                            "slurm.commands")

    def _line(self, args: NcclTestArguments, command: HostCommand, argv: list[str]) -> list[str]:
        return commands.srun_nodes(args.names, args.reservation, argv,
                                   {**command.env, **NCCL_ENV}, self.config.nccl.tasks_per_node,
                                   self.config.nccl.mpi)

    def plan(self, args: NcclTestArguments) -> list[str]:
        self._refuse_other_nodes(args)
        command, argv = self._command(args)
        gpus = f"{args.gpus} GPUs" if args.gpus else "the GPUs Slurm's Gres gives it"
        return [
            " ".join(f"{k}={v}" for k, v in NCCL_ENV.items()) + " "
            + commands.show(self._line(args, command, argv)),
            f"then: every node runs the test on {gpus} and NCCL uses IB, not sockets, on each; "
            f"the bus bandwidth at the largest size is at least {args.min_share:.0%} of the "
            "baseline of this shape (nodes x GPUs per node, GPU model, largest size) in the "
            "bot's database; " + ("this run becomes the baseline" if args.rebaseline else
                                  "without one yet, this run's becomes it"),
        ]

    def _refuse_other_nodes(self, args: NcclTestArguments) -> None:
        asked = expand(args.asked) if args.asked else args.names
        if len(asked) != len(args.names):
            raise ActionError(f"nccl-test runs through srun on Slurm nodes only: of "
                              f"{compress(asked)}, Slurm has {args.hostlist}")

    def run(self, args: NcclTestArguments, ctx: ActionContext) -> ActionResult:
        command, argv = self._command(args)
        line = self._line(args, command, argv)
        nodes = self._ready(args)
        timeout = min(command.timeout, args.timeout, ctx.remaining())
        if timeout <= 0:
            raise ActionTimeout(f"no time left to run {commands.show(line)}")
        ctx.checkpoint(f"about to run {argv[0]} on {args.hostlist}")  # srun is not stopped
        ctx.progress(f"running {shlex.join(argv)} on {args.hostlist} inside {args.reservation}")
        started = time.monotonic()
        code, out, err = self.backend.run_on_nodes(args.names, args.reservation, argv, timeout,
                                                   {**command.env, **NCCL_ENV},
                                                   self.config.nccl.tasks_per_node)
        ctx.checkpoint(f"{argv[0]} ran on {args.hostlist}")  # a cancel meanwhile: no verdict
        details: dict[str, Any] = {"line": commands.show(line), "exit_code": code,
                                   "seconds": round(time.monotonic() - started, 1),
                                   "stdout": out[-OUTPUT_LIMIT:], "stderr": err[-OUTPUT_LIMIT:]}
        expected = {n.name: args.gpus or n.gpus_total for n in nodes}
        run = self._parsed(args, out, err, code, expected)
        details.update(run.summary())
        return self._judged(args, run, expected, details, ctx)

    def _ready(self, args: NcclTestArguments) -> list[NodeInfo]:
        """The nodes, once the reservation holds them all and none is drained, down or
        running a job (srun would wait for it)."""
        found = next((r for r in self.backend.reservations() if r.name == args.reservation),
                     None)
        if found is None or set(args.names) - set(found.nodes):
            raise ActionError(f"reservation {args.reservation} with {args.hostlist} does not "
                              "exist: create it first (slurm.reservation_create)")
        nodes = self._read(args.names)
        out = [n for n in nodes if "DRAIN" in n.flags or n.state == "down" or not n.responding]
        if out:
            raise ActionError(f"{'; '.join(n.describe() for n in out)}: srun cannot start a "
                              "job there; return the nodes to service first (resume-node)")
        busy = [n for n in nodes if n.jobs]
        if busy:
            raise ActionError(f"{'; '.join(n.describe() for n in busy)}: srun would wait for "
                              "those jobs; test idle nodes (drain-nodes first)")
        return nodes

    def _parsed(self, args: NcclTestArguments, out: str, err: str, code: int,
                expected: dict[str, int]) -> nccl.NcclRun:
        """The run, or ActionError with the test's own verdict and the nodes NCCL's INFO
        lines show falling back to sockets (a run that died may still say so)."""
        try:
            run, problem = nccl.parse(out), ""
        except nccl.NcclOutputError as exc:
            run, problem = None, str(exc)
        if run is not None and code == 0:
            return run
        hosts = nccl.judge_hosts(nccl.parse_info(out.splitlines()), {},
                                 dict.fromkeys(expected, 0), len(args.names) > 1)
        fell = [said for said in hosts.problems if "fell back" in said]
        raise ActionError(f"nccl-test on {args.hostlist} did not finish (exit {code}: "
                          f"{verdict(out, err, code) if code else problem})"
                          + "".join(f"; {said}" for said in fell))

    def _judged(self, args: NcclTestArguments, run: nccl.NcclRun, expected: dict[str, int],
                details: dict[str, Any], ctx: ActionContext) -> ActionResult:
        assert self.baselines is not None  # refusal() refuses the plan without them
        hosts = nccl.judge_hosts(run.hosts, run.devices, expected, len(args.names) > 1)
        gpus = args.gpus or max(expected.values(), default=0) or run.gpus_per_process
        key = baseline_key(run, len(args.names), gpus)
        baseline = None if args.rebaseline else self.baselines.get(key)
        problems = list(hosts.problems)
        if run.wrong:
            problems.append(f"{run.wrong} wrong value(s) in the results across "
                            f"{args.hostlist}: the all-reduce returned corrupt data")
        if baseline is not None:  # all problems at once: the bandwidth with the others
            problems += nccl.judge_bandwidth(run, args.names, baseline.busbw,
                                             args.min_share).problems
        details.update(baseline_key=key, notes=list(hosts.notes))
        if problems:
            raise ActionError(f"nccl-test failed on {args.hostlist}: " + "; ".join(problems))
        said = (f"{run.busbw:.1f} GB/s bus bandwidth at {nccl.size_text(run.max_bytes)} across "
                f"{args.hostlist} ({', '.join(sorted(set(nccl.networks(run.hosts).values())))})")
        if baseline is None:
            kept = self.baselines.record(Baseline(key, run.busbw, run.avg_busbw, args.hostlist,
                                                  ctx.execution_id), replace=args.rebaseline)
            details["baseline"] = asdict(kept)
            if kept.execution_id == ctx.execution_id:
                return ActionResult(f"{said}; no baseline for {key} yet: this run's is "
                                    "recorded as it" if not args.rebaseline else
                                    f"{said}; recorded as the baseline for {key}", details)
            baseline = kept  # another run recorded one first: judged against it
        details["baseline"] = asdict(baseline)
        judged = nccl.judge_bandwidth(run, args.names, baseline.busbw, args.min_share)
        if judged.problems:
            raise ActionError(f"nccl-test failed on {args.hostlist}: {judged.problems[0]}")
        share = run.busbw / baseline.busbw if baseline.busbw else 1.0
        return ActionResult(f"{said}: {share:.0%} of the baseline {baseline.busbw:.1f} GB/s "
                            f"({key})", details, changed=False)
