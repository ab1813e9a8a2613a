"""Engine overhead per step on SQLite, excluding the action's own time.

A temporary runbook of N steps (default 200) each calls ``bench.noop``, an action
registered in a custom Catalogue whose ``run()`` records its own start and end
with ``time.perf_counter``. For every step after the first, the overhead is the
gap between the end of the previous action's ``run()`` and the start of this
one's: everything the engine does per step (record the previous step finished
with its audit event, check the lease, the locks and the cancel flag, record
this step running with its audit event, validate the arguments, start the
worker thread). The action's own time is not in the gap.

Run: .venv/bin/python bench/engine_overhead.py [--steps 200] [--executions 5]

The floor, measured in the same run on the same database: two SQLAlchemy Core
transactions (statements built once), each a compare-and-set update of the execution row
and one chained audit insert (the last event's hash read, the new event written): what
any engine must at least do per step (a step started, a step finished). Goal: median
overhead <= 1 ms, that is within 2.7 times that floor.

Prints human-readable lines and, last, one JSON line. It never asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from typing import Any, ClassVar

from benchkit import cleanup_on_signals, finish  # bench/, next to this file
from sqlalchemy import select, text

from adapters.actions import ActionContext, ActionResult, StrictArguments
from bot.config import Config
from bot.execution.checks.core import Checks
from bot.execution.engine import Engine
from bot.runbooks import params
from bot.runbooks.catalogue import Catalogue
from bot.service import Service
from bot.store import db
from bot.store.schema import audit_events, executions

GOAL_MS = 1.0
GOAL_RATIO = 2.7
FLOOR_ROUNDS = 500
RUNBOOK = "bench-steps"


class NoopArguments(StrictArguments):
    n: int = 0


class NoopAction:
    """Does nothing; remembers when each run() started and ended."""

    name: ClassVar[str] = "bench.noop"
    Arguments: ClassVar[type[StrictArguments]] = NoopArguments

    def __init__(self) -> None:
        self.spans: list[tuple[int, str, float, float]] = []  # (execution, step, start, end)

    def plan(self, args: NoopArguments) -> list[str]:
        return [f"noop {args.n}"]

    def run(self, args: NoopArguments, ctx: ActionContext) -> ActionResult:
        start = time.perf_counter()
        result = ActionResult(summary="nothing done", changed=False)
        end = time.perf_counter()
        self.spans.append((ctx.execution_id, ctx.step_id, start, end))
        return result


def write_runbook(folder: Path, steps: int) -> None:
    lines = [
        f"name: {RUNBOOK}",
        "version: 1.0.0",
        "summary: engine overhead benchmark (no-op steps)",
        "risk: low",
        "steps:",
    ]
    for i in range(steps):
        lines += [f"  - id: s{i:04d}", "    action: bench.noop", f"    with: {{n: {i}}}"]
    (folder / f"{RUNBOOK}.yaml").write_text("\n".join(lines) + "\n")


def floor_ms(bot: Service, execution_id: int, rounds: int = FLOOR_ROUNDS) -> list[float]:
    """Two transactions per round, each a compare-and-set and a chained audit insert."""
    fence = text("UPDATE executions SET row_version = row_version + 1 "
                 "WHERE id = :id AND epoch = :epoch")
    last = select(audit_events.c.seq, audit_events.c.hash).order_by(
        audit_events.c.seq.desc()).limit(1)
    insert = audit_events.insert()
    with bot.db.connect() as conn:
        epoch = conn.execute(select(executions.c.epoch).where(
            executions.c.id == execution_id)).scalar_one()
    times: list[float] = []
    for _ in range(rounds):
        began = time.perf_counter()
        for _ in range(2):
            with bot.db.begin() as conn:
                conn.execute(fence, {"id": execution_id, "epoch": epoch})
                seq, prev = conn.execute(last).one()
                conn.execute(insert, {"seq": seq + 1, "ts": "2026-01-01T00:00:00Z",
                                      "execution_id": execution_id, "kind": "floor",
                                      "actor": "bench", "data": "{}", "prev_hash": prev,
                                      "hash": f"{seq + 1:064x}"})
        times.append((time.perf_counter() - began) * 1000)
    return times


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(values_ms: list[float]) -> dict[str, float]:
    return {
        "n": len(values_ms),
        "median_ms": statistics.median(values_ms),
        "p90_ms": pct(values_ms, 90),
        "p99_ms": pct(values_ms, 99),
        "mean_ms": statistics.fmean(values_ms),
        "max_ms": max(values_ms),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--executions", type=int, default=5)
    parser.add_argument("--profile", metavar="FILE",
                        help="write a cProfile of the driving to FILE (pstats format)")
    args = parser.parse_args(argv)
    cleanup_on_signals()

    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        folder = Path(tmp)
        runbooks = folder / "runbooks"
        runbooks.mkdir()
        write_runbook(runbooks, args.steps)
        config = Config(database_url=f"sqlite:///{folder / 'bench.db'}",
                        runbook_paths=[runbooks], host_commands={})
        action = NoopAction()
        bot = Service(
            config=config,
            db=db.connect(config.resolved_database_url()),
            catalogue=Catalogue([action]),
            checks=Checks({}),
            inventory=params.Inventory(),
        )
        bot.runbooks()
        engine = Engine(bot)

        profiler = None
        if args.profile:
            import cProfile

            profiler = cProfile.Profile()

        gaps: list[float] = []        # engine overhead between two actions (ms)
        per_step: list[float] = []    # start-to-start interval, action included (ms)
        action_ms: list[float] = []   # the action's own run() time (ms)
        walls: list[float] = []       # wall time per execution (s)
        states: list[str] = []
        try:
            for _ in range(args.executions):
                execution_id = bot.request(RUNBOOK, {}, "bench")
                action.spans.clear()
                began = time.perf_counter()
                if profiler:
                    profiler.enable()
                ex = engine.drive(execution_id)
                if profiler:
                    profiler.disable()
                walls.append(time.perf_counter() - began)
                states.append(ex.state)
                spans = [s for s in action.spans if s[0] == execution_id]
                for (_, _, start0, end0), (_, _, start1, _) in pairwise(spans):
                    gaps.append((start1 - end0) * 1000)
                    per_step.append((start1 - start0) * 1000)
                action_ms.extend((end - start) * 1000 for _, _, start, end in spans)
            floor = summary(floor_ms(bot, execution_id))
        finally:
            engine.close()
            bot.db.dispose()
        if profiler:
            profiler.dump_stats(args.profile)

    overhead = summary(gaps)
    with_action = summary(per_step)
    own = summary(action_ms)
    wall_per_step = [w * 1000 / args.steps for w in walls]
    print(f"engine overhead per step, SQLite file DB, {args.executions} executions x "
          f"{args.steps} no-op steps (states: {', '.join(sorted(set(states)))})")
    print(f"  overhead (previous action end -> next action start, action excluded): "
          f"median {overhead['median_ms']:.3f} ms, p90 {overhead['p90_ms']:.3f} ms, "
          f"p99 {overhead['p99_ms']:.3f} ms, max {overhead['max_ms']:.3f} ms "
          f"(n={overhead['n']})")
    print(f"  context: per step incl. the action (start -> next start): "
          f"median {with_action['median_ms']:.3f} ms, p99 {with_action['p99_ms']:.3f} ms")
    print(f"  context: the action's own run() time: median {own['median_ms'] * 1000:.1f} us, "
          f"p99 {own['p99_ms'] * 1000:.1f} us")
    print(f"  context: whole drive() wall time / steps (incl. claim, start, end): "
          f"median {statistics.median(wall_per_step):.3f} ms over {len(walls)} executions")
    ratio = overhead["median_ms"] / floor["median_ms"]
    met = overhead["median_ms"] <= GOAL_MS or ratio <= GOAL_RATIO
    print(f"  floor (same run, same database): two Core transactions, each a compare-and-set "
          f"and a chained audit insert: median {floor['median_ms']:.3f} ms")
    print(f"  goal: median overhead <= {GOAL_MS:g} ms or <= {GOAL_RATIO:g} x the floor: "
          f"{overhead['median_ms']:.3f} ms, {ratio:.2f} x: {'met' if met else 'MISSED'}")
    result: dict[str, Any] = {
        "benchmark": "engine_overhead",
        "steps": args.steps,
        "executions": args.executions,
        "states": sorted(set(states)),
        "overhead_ms": overhead,
        "per_step_with_action_ms": with_action,
        "action_own_ms": own,
        "drive_wall_per_step_ms_median": statistics.median(wall_per_step),
        "floor_ms": floor,
        "ratio_to_floor": ratio,
        "goal_median_ms": GOAL_MS,
        "goal_ratio": GOAL_RATIO,
        "goal_met": met,
        "python": sys.version.split()[0],
    }
    finish("engine_overhead", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
