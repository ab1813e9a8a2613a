"""`runbook node`: the node view's time for one lab node, and for all lab nodes in one call
against one call per node, measured in the same run (warm: as a running bot answers chat),
plus the cold command-line time for one node. With a lab of at least 1,024 nodes
(`deploy/lab/lab up --nodes 1024`), also `runbook node` (every node) from a cold start:
goal <= 2 s. Prints the figures and whether each goal is met; it never asserts a time.

Needs a running lab: `deploy/lab/lab up && eval "$(deploy/lab/lab env)"`.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

from benchkit import finish

from bot.config import load_config
from bot.service import Service
from bot.surfaces import nodeview


def timed(call: object, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        call()  # type: ignore[operator]
        out.append((time.perf_counter() - started) * 1000)
    return out


LARGE, LARGE_GOAL_MS = 1024, 2000.0
PER_NODE_MAX = 64  # one call per node beyond this takes minutes: not measured


def cold(argv: list[str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        out.append((time.perf_counter() - started) * 1000)
    return out


def large_view(nodes: list[str]) -> dict[str, object]:
    """`runbook node` of every node of a large lab, cold, as a person types it."""
    if len(nodes) < LARGE:
        print(f"`runbook node` of {LARGE} nodes: skipped: the lab has {len(nodes)} nodes "
              f"(deploy/lab/lab up --nodes {LARGE} in a folder of its own)")
        return {}
    argv = [sys.executable, "-m", "bot", "node"]
    cold(argv, 1)  # warm-up
    median = round(statistics.median(cold(argv, 3)), 1)
    met = median <= LARGE_GOAL_MS
    print(f"`runbook node` of all {len(nodes)} nodes from a cold start: {median} ms median "
          f"(goal <= {LARGE_GOAL_MS:g} ms: {'met' if met else 'MISSED'})")
    return {"large_view_cold_ms_median": median, "large_view_goal_met": met}


def main() -> None:
    if not os.environ.get("RUNBOOK_CONFIG"):
        sys.exit("needs the lab: deploy/lab/lab up && eval \"$(deploy/lab/lab env)\"")
    bot = Service.from_config(load_config())
    nodes = sorted(bot.inventory.nodes)
    one = timed(lambda: nodeview.build(bot, [nodes[0]]), 20)
    together = timed(lambda: nodeview.build(bot, nodes), 10 if len(nodes) <= PER_NODE_MAX else 3)
    one_node_cold = cold([sys.executable, "-m", "bot", "node", nodes[0]], 5)
    result: dict[str, object] = {
        "one_node_ms_median": round(statistics.median(one), 1),
        "all_nodes_one_call_ms_median": round(statistics.median(together), 1),
        "cli_cold_one_node_ms_median": round(statistics.median(one_node_cold), 1),
        "nodes": len(nodes),
    }
    print(f"node view, one node (warm bot): {result['one_node_ms_median']} ms median "
          "(goal < 300 ms)")
    print(f"all {len(nodes)} nodes in one call: {result['all_nodes_one_call_ms_median']} ms")
    if len(nodes) <= PER_NODE_MAX:
        separately = timed(lambda: [nodeview.build(bot, [n]) for n in nodes], 10)
        result["all_nodes_one_call_per_node_ms_median"] = round(statistics.median(separately), 1)
        result["ratio"] = round(statistics.median(separately) / statistics.median(together), 2)
        print(f"one call per node: {result['all_nodes_one_call_per_node_ms_median']} ms "
              f"({result['ratio']}x)")
    print(f"`runbook node {nodes[0]}` from a cold start: {result['cli_cold_one_node_ms_median']}"
          " ms median (imports and client set-up included)")
    result.update(large_view(nodes))
    finish("node_view", result)


if __name__ == "__main__":
    main()
