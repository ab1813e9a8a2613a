"""Drain and resume of 256 Slurm nodes: one scontrol call per batch vs one per node.

Starts its own lab (``RUNBOOK_LAB_DIR=<temp> deploy/lab/lab up --nodes 256``: 256 nodes
in slurm.conf, slurmd for the first 4 only; the others are not responding, which
scontrol still accepts for DRAIN/RESUME), then, in the same run:

* batched: ``slurm.drain`` then ``slurm.resume`` (``wait: false``) over ``gpu[001-256]``
  through the actions and the CLI backend: each is one ``scontrol update`` for all nodes
  (plus the reads the actions make first);
* loop: ``scontrol update NodeName=gpuNNN State=DRAIN ...`` for each node, then the same
  with ``State=RESUME``: 512 scontrol processes.

Counts scontrol invocations (through a recording runner) and wall time, prints the
ratio (goal: the batch at least 20 times faster) and stops the lab.

Run: .venv/bin/python bench/slurm_batch.py [--nodes 256] [--rounds 3] [--keep]

Prints human-readable lines and, last, one JSON line. It never asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters.actions import ActionContext  # noqa: E402
from adapters.slurm import CliBackend, SlurmActions, SlurmConfig, SlurmError  # noqa: E402
from adapters.slurm.cli import run_process  # noqa: E402
from adapters.slurm.hostlist import compress  # noqa: E402

LAB = ROOT / "deploy" / "lab" / "lab"
GOAL = 20.0


class CountingRunner:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], *, env: Mapping[str, str],
                 timeout: float) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        return run_process(argv, env=env, timeout=timeout)

    def scontrol(self) -> int:
        """scontrol invocations that change something (``scontrol update``)."""
        return sum(1 for argv in self.calls
                   if Path(argv[0]).name == "scontrol" and argv[1:2] == ["update"])


def lab(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LAB), *args], env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=900, check=False)


def ctx() -> ActionContext:
    return ActionContext(execution_id=0, step_id="bench", deadline=time.monotonic() + 600)


def states(backend: CliBackend, names: list[str]) -> dict[str, int]:
    counts = {"drained": 0, "draining": 0, "undrained": 0}
    for node in backend.nodes(names):
        key = "drained" if node.drained else "draining" if node.draining else "undrained"
        counts[key] += 1
    return counts


def batched(config: SlurmConfig, names: list[str]) -> dict[str, Any]:
    runner = CountingRunner()
    backend = CliBackend(config, runner=runner)
    backend.version()  # a one-off probe, not part of the measurement
    runner.calls.clear()
    actions = SlurmActions(backend, config).by_name()
    drain, resume = actions["slurm.drain"], actions["slurm.resume"]
    hostlist = compress(names)
    began = time.perf_counter()
    drained = drain.run(
        drain.Arguments.model_validate({"nodes": hostlist, "reason": "bench batch"}), ctx())
    middle = time.perf_counter()
    resumed = resume.run(resume.Arguments.model_validate({"nodes": hostlist, "wait": False}),
                         ctx())
    ended = time.perf_counter()
    return {"seconds": ended - began, "drain_seconds": middle - began,
            "resume_seconds": ended - middle, "scontrol_calls": runner.scontrol(),
            "all_calls": len(runner.calls), "drained": len(drained.details["drained"]),
            "resumed": len(resumed.details["resumed"]),
            "warning": resumed.details.get("scontrol_warning")}


def loop(config: SlurmConfig, names: list[str]) -> dict[str, Any]:
    runner = CountingRunner()
    backend = CliBackend(config, runner=runner)
    began = time.perf_counter()
    for name in names:
        backend.update_nodes([name], "DRAIN", "bench loop")
    middle = time.perf_counter()
    refused = 0
    for name in names:
        try:
            backend.update_nodes([name], "RESUME", None)
        except SlurmError as exc:
            # 22.05 clears DRAIN on never-registered nodes but answers "Invalid node state".
            if "Invalid node state specified" not in str(exc):
                raise
            refused += 1
    ended = time.perf_counter()
    return {"seconds": ended - began, "drain_seconds": middle - began,
            "resume_seconds": ended - middle, "scontrol_calls": runner.scontrol(),
            "all_calls": len(runner.calls), "resume_invalid_state_answers": refused}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="batched runs (median taken)")
    parser.add_argument("--keep", action="store_true", help="leave the lab running")
    options = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="grb-bench-"))
    env = dict(os.environ, RUNBOOK_LAB_DIR=str(folder / "lab"))
    env.pop("SLURM_JWT", None)
    print(f"starting a lab with {options.nodes} nodes in {folder / 'lab'} ...", flush=True)
    up = lab(env, "up", "--nodes", str(options.nodes))
    result: dict[str, Any] = {"bench": "slurm_batch", "nodes": options.nodes}
    try:
        if up.returncode != 0:
            print(up.stdout + up.stderr)
            result["error"] = f"lab up failed ({up.returncode})"
            print(json.dumps(result))
            return 1
        info = json.loads((folder / "lab" / "lab.json").read_text())
        names: list[str] = info["nodes"]
        config = SlurmConfig(slurm_conf=info["slurm_conf"])
        probe = CliBackend(config)
        print(f"lab up: {len(names)} nodes ({compress(names)}), slurmd on "
              f"{len(info['slurmd_nodes'])}; before: {states(probe, names)}")

        rounds = [batched(config, names) for _ in range(max(1, options.rounds))]
        after_batch = states(probe, names)
        per_node = loop(config, names)
        after_loop = states(probe, names)
        batch = sorted(rounds, key=lambda r: r["seconds"])[len(rounds) // 2]
        ratio = per_node["seconds"] / batch["seconds"] if batch["seconds"] else float("inf")
        print(f"batched (actions, median of {len(rounds)}): {batch['seconds'] * 1000:.0f} ms "
              f"(drain {batch['drain_seconds'] * 1000:.0f} ms, resume "
              f"{batch['resume_seconds'] * 1000:.0f} ms); scontrol calls {batch['scontrol_calls']}"
              f" (update), all Slurm calls {batch['all_calls']} (with the reads); "
              f"drained {batch['drained']}, resumed {batch['resumed']}")
        print(f"per-node loop: {per_node['seconds'] * 1000:.0f} ms (drain "
              f"{per_node['drain_seconds'] * 1000:.0f} ms, resume "
              f"{per_node['resume_seconds'] * 1000:.0f} ms); scontrol update calls "
              f"{per_node['scontrol_calls']} ({per_node['resume_invalid_state_answers']} resumes "
              "answered 'Invalid node state specified' for never-registered nodes)")
        print(f"after the batches: {after_batch}; after the loop: {after_loop}")
        met = ratio >= GOAL
        print(f"ratio loop/batch: {ratio:.1f}x (goal >= {GOAL:.0f}x: "
              f"{'met' if met else 'NOT met'})")
        result.update(
            batched_seconds=round(batch["seconds"], 4),
            batched_seconds_all=[round(r["seconds"], 4) for r in rounds],
            batched_scontrol_calls=batch["scontrol_calls"],
            batched_all_calls=batch["all_calls"],
            loop_seconds=round(per_node["seconds"], 4),
            loop_scontrol_calls=per_node["scontrol_calls"],
            ratio=round(ratio, 1), goal=GOAL, goal_met=met,
            median_batch_ms=round(statistics.median(r["seconds"] for r in rounds) * 1000, 1),
        )
    finally:
        if not options.keep:
            down = lab(env, "down")
            print(f"lab down: exit {down.returncode}")
            shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
