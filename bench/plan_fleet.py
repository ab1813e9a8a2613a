"""Time to plan drain-nodes over 1,024 nodes: from the request to the plan rendered as the
requester sees it, nothing run.

Starts its own lab with ``--nodes`` Slurm nodes (``RUNBOOK_LAB_DIR=<temp> deploy/lab/lab up
--nodes 1024``; 4 slurmd run, the rest exist in slurm.conf): the plan is made against real
Slurm, since planning lists the pools (inventory, refreshed every
``inventory.refresh_seconds``) and evaluates the capacity guard over the whole set (sinfo).
The bot is built in this process with the lab's configuration on a temporary SQLite
database (``Service.from_config``), as `runbook serve` and the chat build it, then:

* cold: the first ``plan`` (runbooks loaded and recorded, inventory listed) and its text;
* plan (median of ``--runs``): ``Service.plan`` + ``plan_text``, what `runbook plan` and
  the chat's preview do, on the warm service;
* request (median of ``--runs``): ``Service.request`` (validated, planned, recorded with its
  audit events, awaiting approval) + the plan's text, each execution then denied;
* for context, `runbook plan ...` as a new process (interpreter start and imports too).

All of the set is drained, so the capacity guard refuses without break-glass: the plan is
asked with break-glass (one more approval in the plan), as a requester would have to.
Goal: the warm plan and the request each <= 1 s (median). It never asserts a time; the lab
is stopped and its folder removed at the end, also on failure.

Run: .venv/bin/python bench/plan_fleet.py [--nodes 1024] [--runs 20] [--keep]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchkit import cleanup_on_signals, failed, finish, own_lab  # noqa: E402  (bench/)
from botcli import cli  # noqa: E402

from kit.hostlist import compress  # noqa: E402

GOAL_SECONDS = 1.0
REASON = "bench plan of the fleet"


def timings(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median_s": round(statistics.median(ordered), 4),
            "p90_s": round(ordered[int(0.9 * (len(ordered) - 1))], 4),
            "min_s": round(ordered[0], 4), "max_s": round(ordered[-1], 4)}


def timed(action: Callable[[], Any]) -> tuple[float, Any]:
    began = time.perf_counter()
    value = action()
    return time.perf_counter() - began, value


def measure(env: dict[str, str], folder: Path, hostlist: str, runs: int,
            result: dict[str, Any]) -> None:
    from bot.config import load_config
    from bot.service import Service
    from bot.surfaces.rendering import plan_text

    config = load_config(env["RUNBOOK_CONFIG"]).model_copy(
        update={"database_url": f"sqlite:///{folder / 'plan.db'}"})
    params = {"nodes": hostlist, "reason": REASON}
    built, bot = timed(lambda: Service.from_config(config))
    cold, text = timed(lambda: plan_text(bot.plan("drain-nodes", params, break_glass=True)))
    print(f"Service.from_config {built:.2f} s; first plan {cold:.2f} s "
          f"({len(text.splitlines())} lines of plan)", flush=True)
    print("  " + "\n  ".join(text.splitlines()[:12]))
    plans = [timed(lambda: plan_text(bot.plan("drain-nodes", params, break_glass=True)))[0]
             for _ in range(runs)]

    def request() -> str:
        execution_id = bot.request("drain-nodes", params, "alice", break_glass=True)
        shown = plan_text(bot.get(execution_id).plan)
        bot.deny(execution_id, "carol", "benchmark")
        return shown

    requests = [timed(request)[0] for _ in range(runs)]
    bot.db.dispose()
    argv = ["plan", "drain-nodes", f"nodes={hostlist}", f"reason={REASON}", "--break-glass"]
    processes = [timed(lambda: cli(dict(env, RUNBOOK_DB_URL=f"sqlite:///{folder / 'cli.db'}"),
                                   *argv))[0] for _ in range(3)]
    result.update(service_build_s=round(built, 3), first_plan_s=round(cold, 3),
                  plan=timings(plans), request=timings(requests),
                  cli_plan=timings(processes), plan_lines=len(text.splitlines()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--keep", action="store_true", help="leave the lab running")
    args = parser.parse_args()
    cleanup_on_signals()
    result: dict[str, Any] = {"bench": "plan_fleet", "nodes": args.nodes, "runs": args.runs,
                              "goal_s": GOAL_SECONDS}
    try:
        print(f"starting a lab with {args.nodes} nodes in a temporary folder ...", flush=True)
        with own_lab("grb-bench-plan-", "--nodes", str(args.nodes),
                     keep=args.keep) as (folder, env, info):
            hostlist = compress(info["nodes"])
            measure(env, folder, hostlist, max(1, args.runs), result)
        met = max(result["plan"]["median_s"], result["request"]["median_s"]) <= GOAL_SECONDS
        result["goal_met"] = met
        print(f"plan + text over {hostlist} ({args.nodes} nodes), median of {args.runs}: "
              f"{result['plan']['median_s']:.3f} s (p90 {result['plan']['p90_s']:.3f}); "
              f"request + text {result['request']['median_s']:.3f} s (p90 "
              f"{result['request']['p90_s']:.3f}); `runbook plan` as a new process "
              f"{result['cli_plan']['median_s']:.2f} s; goal <= {GOAL_SECONDS:g} s: "
              f"{'met' if met else 'NOT met'}")
    except BaseException as exc:
        failed(result, exc)
        raise
    finally:
        finish("plan_fleet", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
