"""`runbook node`: the node view's time for one lab node, and for all lab nodes in one call
against one call per node, measured in the same run (warm: as a running bot answers chat),
plus the cold command-line time for one node.

Needs a running lab: `deploy/lab/lab up && eval "$(deploy/lab/lab env)"`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

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


def main() -> None:
    if not os.environ.get("RUNBOOK_CONFIG"):
        sys.exit("needs the lab: deploy/lab/lab up && eval \"$(deploy/lab/lab env)\"")
    bot = Service.from_config(load_config())
    nodes = sorted(bot.inventory.nodes)
    one = timed(lambda: nodeview.build(bot, [nodes[0]]), 20)
    together = timed(lambda: nodeview.build(bot, nodes), 10)
    separately = timed(lambda: [nodeview.build(bot, [n]) for n in nodes], 10)
    cold = []
    for _ in range(5):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "bot", "node", nodes[0]], check=True,
                       capture_output=True)
        cold.append((time.perf_counter() - started) * 1000)
    result = {
        "one_node_ms_median": round(statistics.median(one), 1),
        "all_nodes_one_call_ms_median": round(statistics.median(together), 1),
        "all_nodes_one_call_per_node_ms_median": round(statistics.median(separately), 1),
        "ratio": round(statistics.median(separately) / statistics.median(together), 2),
        "cli_cold_one_node_ms_median": round(statistics.median(cold), 1),
        "nodes": len(nodes),
    }
    print(f"node view, one node (warm bot): {result['one_node_ms_median']} ms median "
          "(goal < 300 ms)")
    print(f"all {len(nodes)} nodes in one call: {result['all_nodes_one_call_ms_median']} ms; "
          f"one call per node: {result['all_nodes_one_call_per_node_ms_median']} ms "
          f"({result['ratio']}x)")
    print(f"`runbook node {nodes[0]}` from a cold start: {result['cli_cold_one_node_ms_median']}"
          " ms median (imports and client set-up included)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
