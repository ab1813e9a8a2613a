"""Drain and resume of 256 Slurm nodes: the bot's drain-nodes/resume-nodes against what an
admin types (one scontrol for all nodes), with a per-node loop for context.

Starts its own lab (``RUNBOOK_LAB_DIR=<temp> deploy/lab/lab up --nodes 257 --slurmd 257``:
a slurmd for every node, about 8 MB each, so every node responds as a real one would; gpu001
stays out of the set, since drain-nodes' capacity guard keeps 8 GPUs free), then, in the same
run, over the set gpu[002-257]:

* floor (median of ``--rounds``): ``scontrol update NodeName=gpu[002-257] State=DRAIN
  Reason=...`` then ``... State=RESUME``: two processes, what an admin types; then, not in the
  floor, how long Slurm takes to show them all in service again (about a second not
  responding after a resume), which the bot's post-check waits for;
* bot: ``runbook run drain-nodes nodes=gpu[002-257] reason=... --wait --as alice``, approved
  by ``runbook approve ID --as carol`` from another process, then ``runbook run resume-nodes
  nodes=gpu[002-257] --wait`` (approved too if it asks): the product's CLI end to end, each
  timed from its start to its exit, with where the time went (from the audit log: the CLI
  starting to the request recorded, the approval, the engine's run, each step). On top of
  the floor's scontrol the bot validates the request, lists the pools, plans it (and prints
  the plan), checks capacity, records every decision in the hash-chained audit log, waits
  for an approval, drains in batches of max_parallel, waits for no job to run, checks the
  nodes drained (and, resuming, in service again) and can undo;
* loop: one ``scontrol update`` per node, drain then resume (512 processes).

The goal is bot <= 1.5x the floor. Apart, the engine's own time in the drain (its run from
started to finished in the audit log, less the time inside the steps' actions: replanning at
start, the capacity pre-check, the stage and step records, the post-check) against the
floor's one drain ``scontrol``: goal <= 10x (ENGINE_GOAL). Nodes are counted drained after
each drain and not drained after each resume (one ``sinfo`` each). The lab is stopped and
its folder removed at the end, also on failure or SIGTERM.

Run: .venv/bin/python bench/slurm_drain.py [--nodes 256] [--rounds 3] [--keep]
     [--param key=value ...] [--slurm 22.05|24.11|26.05]

Prints readable lines and, last, one JSON line (also in bench/results/slurm_drain.json, or
slurm_drain_24_11.json and so on for a newer Slurm).
It never asserts a time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchkit import cleanup_on_signals, failed, finish, own_lab  # noqa: E402  (bench/)
from botcli import phases, run_approved  # noqa: E402

from kit.hostlist import compress  # noqa: E402

GOAL = 1.5  # bot / floor
ENGINE_GOAL = 10.0  # drain-nodes' engine time outside its steps / the floor's drain scontrol
REASON = "bench fleet drain"


def timed(env: dict[str, str], *argv: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    began = time.perf_counter()
    done = subprocess.run(list(argv), env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=300, check=False)
    return time.perf_counter() - began, done


def states(env: dict[str, str], hostlist: str) -> dict[str, str]:
    """Each node's long state (one sinfo): idle, drained, draining, "idle*" (not responding)..."""
    out = subprocess.run(["sinfo", "-h", "-N", "-n", hostlist, "-o", "%N|%T"], env=env,
                         capture_output=True, text=True, timeout=60, check=False).stdout
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def drained_count(env: dict[str, str], hostlist: str) -> int:
    """Nodes of ``hostlist`` with DRAIN among their flags."""
    return sum(1 for state in states(env, hostlist).values() if "drain" in state.lower())


def in_service(env: dict[str, str], hostlist: str) -> int:
    """Nodes of ``hostlist`` that take jobs: not drained, responding, not down."""
    return sum(1 for state in states(env, hostlist).values()
               if state.rstrip("*") == state and state in ("idle", "mixed", "allocated"))


def until_in_service(env: dict[str, str], hostlist: str, count: int) -> float:
    """Seconds until all ``count`` nodes take jobs again (after a resume), polled each 0.1 s."""
    began = time.perf_counter()
    while in_service(env, hostlist) < count:
        if time.perf_counter() - began > 120:
            return float("nan")
        time.sleep(0.1)
    return time.perf_counter() - began


def floor_round(env: dict[str, str], hostlist: str, count: int) -> dict[str, Any]:
    """What an admin types: one scontrol to drain them all, one to resume them."""
    drain_s, drain = timed(env, "scontrol", "update", f"NodeName={hostlist}", "State=DRAIN",
                           f"Reason={REASON}")
    after_drain = drained_count(env, hostlist)
    resume_s, resume = timed(env, "scontrol", "update", f"NodeName={hostlist}", "State=RESUME")
    return {"seconds": drain_s + resume_s, "drain_seconds": drain_s,
            "resume_seconds": resume_s, "drain_exit": drain.returncode,
            "resume_exit": resume.returncode, "drained_after_drain": after_drain,
            "drained_after_resume": drained_count(env, hostlist),
            # not in the floor: Slurm marks resumed nodes not responding for about a second
            "then_in_service_seconds": until_in_service(env, hostlist, count)}


def loop_round(env: dict[str, str], names: list[str]) -> dict[str, Any]:
    """One scontrol per node: drain each, then resume each."""
    began = time.perf_counter()
    for name in names:
        timed(env, "scontrol", "update", f"NodeName={name}", "State=DRAIN", f"Reason={REASON}")
    middle = time.perf_counter()
    after_drain = drained_count(env, compress(names))
    restarted = time.perf_counter()
    for name in names:
        timed(env, "scontrol", "update", f"NodeName={name}", "State=RESUME")
    ended = time.perf_counter()
    drain_s, resume_s = middle - began, ended - restarted
    return {"seconds": drain_s + resume_s, "drain_seconds": drain_s,
            "resume_seconds": resume_s, "scontrol_calls": 2 * len(names),
            "drained_after_drain": after_drain,
            "drained_after_resume": drained_count(env, compress(names))}


def bot_round(env: dict[str, str], hostlist: str, extra: list[str]) -> dict[str, Any]:
    """drain-nodes then resume-nodes through `runbook run --wait`, approved by carol."""
    drain = run_approved(env, "drain-nodes", [f"nodes={hostlist}", f"reason={REASON}", *extra])
    after_drain = drained_count(env, hostlist)
    resume = run_approved(env, "resume-nodes", [f"nodes={hostlist}"])
    figures: dict[str, Any] = {
               "seconds": drain.seconds + resume.seconds, "drain_seconds": drain.seconds,
               "resume_seconds": resume.seconds,
               "drain_until_approved": drain.until_approved,
               "drain_succeeded": drain.succeeded, "resume_succeeded": resume.succeeded,
               "drain_execution": drain.execution_id, "resume_execution": resume.execution_id,
               "drained_after_drain": after_drain,
               "drained_after_resume": drained_count(env, hostlist)}
    for run in (drain, resume):
        if run.execution_id is not None:
            figures[f"{run.runbook}_phases"] = phases(env, run)
            print(f"  {run.runbook}: {figures[f'{run.runbook}_phases']}")
        found = figures.get(f"{run.runbook}_phases", {})
        if run.runbook == "drain-nodes" and "engine_run" in found:
            steps = sum(v for k, v in found.items() if k.startswith("step_"))
            figures["drain_engine_outside_steps"] = round(found["engine_run"] - steps, 4)
        if not run.succeeded:
            print(f"  {run.runbook} did not succeed (exit {run.exit_code}):\n    "
                  + "\n    ".join(run.output[-15:]))
    return figures


def show(label: str, figures: dict[str, Any]) -> None:
    then = figures.get("then_in_service_seconds")
    print(f"{label:<34} {figures['seconds']:8.2f} s  (drain {figures['drain_seconds']:.2f} s, "
          f"resume {figures['resume_seconds']:.2f} s; drained after the drain "
          f"{figures['drained_after_drain']}, after the resume "
          f"{figures['drained_after_resume']})"
          + (f"; all in service {then:.2f} s after the resume" if then else ""), flush=True)


def engine_ratio(bot: dict[str, Any], floor: dict[str, Any], result: dict[str, Any]) -> None:
    """The engine's own time in the drain against the floor's one drain scontrol."""
    own = bot.get("drain_engine_outside_steps")
    if own is None or not floor["drain_seconds"]:
        return
    ratio = own / floor["drain_seconds"]
    met = ratio <= ENGINE_GOAL and bool(bot["drain_succeeded"])
    print(f"engine (drain-nodes' run outside its steps) {own:.3f} s: {ratio:.1f}x the drain "
          f"scontrol ({floor['drain_seconds']:.4f} s; goal <= {ENGINE_GOAL:g}x: "
          f"{'met' if met else 'NOT met'})")
    result.update(engine_seconds=round(own, 4), engine_ratio=round(ratio, 1),
                  engine_goal=ENGINE_GOAL, engine_goal_met=met)


def measure(env: dict[str, str], names: list[str], args: argparse.Namespace,
            result: dict[str, Any]) -> None:
    hostlist = compress(names)
    floors = [floor_round(env, hostlist, len(names)) for _ in range(max(1, args.rounds))]
    floor = sorted(floors, key=lambda r: r["seconds"])[len(floors) // 2]
    show(f"floor: 2 scontrol (median of {len(floors)})", floor)
    result["floor"] = {k: round(v, 4) if isinstance(v, float) else v for k, v in floor.items()}
    result["floor_seconds_all"] = [round(r["seconds"], 4) for r in floors]
    if (ROOT / "runbooks" / "drain-nodes.yaml").exists():
        bot = bot_round(env, hostlist, args.param)
        show("bot: drain-nodes + resume-nodes", bot)
        ratio = bot["seconds"] / floor["seconds"]
        met = ratio <= GOAL and bot["drain_succeeded"] and bot["resume_succeeded"]
        print(f"ratio bot/floor {ratio:.2f}x (goal <= {GOAL}x: {'met' if met else 'NOT met'}); "
              f"the drain waited {bot['drain_until_approved']:.2f} s until approved")
        result.update(bot={k: round(v, 4) if isinstance(v, float) else v
                           for k, v in bot.items()},
                      ratio=round(ratio, 2), goal_met=met)
        engine_ratio(bot, floor, result)
    else:
        print("bot: runbooks/drain-nodes.yaml does not exist: not measured")
        result.update(bot=None, ratio=None, goal_met=None)
    until_in_service(env, hostlist, len(names))
    per_node = loop_round(env, names)
    show(f"loop: {per_node['scontrol_calls']} scontrol", per_node)
    result["loop"] = {k: round(v, 4) if isinstance(v, float) else v for k, v in per_node.items()}
    result["loop_over_floor"] = round(per_node["seconds"] / floor["seconds"], 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="floor runs (median taken)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="another drain-nodes parameter (repeatable)")
    parser.add_argument("--keep", action="store_true", help="leave the lab running")
    parser.add_argument("--slurm", choices=["22.05", "24.11", "26.05"], default="22.05",
                        help="the lab's Slurm (lab up --slurm); results per version")
    args = parser.parse_args()
    cleanup_on_signals()
    name = "slurm_drain" if args.slurm == "22.05" else f"slurm_drain_{args.slurm.replace('.', '_')}"
    result: dict[str, Any] = {"bench": "slurm_drain", "nodes": args.nodes, "goal": GOAL,
                              "slurm": args.slurm}
    try:
        print(f"starting a lab with {args.nodes} nodes in a temporary folder ...", flush=True)
        began = time.perf_counter()
        # one node more, outside the set: drain-nodes' capacity guard keeps 8 GPUs free
        total = str(args.nodes + 1)
        with own_lab("grb-bench-drain-", "--nodes", total, "--slurmd", total,
                     "--slurm", args.slurm, keep=args.keep) as (_, env, info):
            spare, names = info["nodes"][0], info["nodes"][1:]
            until_in_service(env, compress(names), len(names))
            print(f"lab up in {time.perf_counter() - began:.0f} s: set {compress(names)} (and "
                  f"{spare}, not in the set), slurmd on {len(info['slurmd_nodes'])}; in "
                  f"service now: {in_service(env, compress(names))}", flush=True)
            measure(env, names, args, result)
    except BaseException as exc:
        failed(result, exc)
        raise
    finally:
        finish(name, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
