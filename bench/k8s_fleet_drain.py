"""Drain of 100 Kubernetes nodes with 20 pods each, PodDisruptionBudgets in place: real
`kubectl drain` node after node (what an admin runs) against the bot's drain-nodes.

Starts its own throw-away lab Kubernetes API (``python3 -m kubeapi`` from deploy/lab, a free
loopback port, state and request log in a temporary folder) with ``--nodes`` GPU nodes to
drain and ``--spare`` (1) more that stay (drain-nodes' capacity guard keeps 8 GPUs free). The
seed's serving Deployment is scaled to 0 and its pods deleted (its replicas would come back
on the nodes not drained yet, and at the end have nowhere to go). The workload: ``--pods``
applications, each with one pod on every node (spread, as anti-affinity does), each pod its
own StatefulSet's (not replaced once evicted) with an emptyDir volume, and per application a
PodDisruptionBudget with ``maxUnavailable: --max-unavailable`` (default 10%): at most that
many of an application's pods may be going at once, so the budgets limit how many nodes can
be emptied at the same time, but always allow progress. The 3 DaemonSet pods per node stay.

Then, in the same run, each round on the same workload (the nodes uncordoned and the pods put
back between rounds):

* kubectl, node after node (the baseline of the goal: what an admin types):
  ``kubectl drain NODE --ignore-daemonsets --delete-emptydir-data`` for each node in turn (real
  kubectl from PATH, a kubeconfig for the lab API, its discovery cache warm after the first).
  kubectl's requests other than discovery go through client-go's default limiter, 5 QPS with a
  burst of 10 per process (its -v=6 log says "Waited ... due to client-side throttling"), which
  no flag changes: that limiter, not the API server, sets kubectl's time per node;
* kubectl, ``--kubectl-parallel`` drains at once (default: the bot's eviction budget / 5), as a
  skilled admin would with ``xargs -P``: the kubectls' summed client budget is then the bot's
  eviction budget, the same budget on both sides;
* bot: ``runbook run drain-nodes nodes=gpu[001-100] reason=... --wait``, approved from
  another process, with a configuration whose only pool is this Kubernetes API (no Slurm),
  the product's defaults for Kubernetes (eviction retry 5 s, as kubectl) and the runbook's
  own parallelism and eviction budget (50 a second: why in adapters/kubernetes/fleet_drain.py).

Every request is counted from the server's request log, by user agent. Prints wall times,
the ratios (goal: the bot at least 8x faster than kubectl node after node) and the bot's API
requests per evicted pod (goal: at most 3), evictions a budget refused (429), pods left and
nodes left schedulable. It never asserts a time; the server and the folder are removed at
the end, also on failure.

Run: .venv/bin/python bench/k8s_fleet_drain.py [--nodes 100] [--pods 20]
     [--max-unavailable 10%] [--pod-grace 0.5] [--spare 1] [--kubectl-parallel N]
     [--param key=value ...] [--break-glass] [--keep]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402
from benchkit import cleanup_on_signals, failed, finish  # noqa: E402  (bench/, next to this file)
from botcli import phases, run_approved  # noqa: E402
from kubelab import NAMESPACE, SEED_RS, SETUP_AGENT, Api, KubeLab, workload_pods  # noqa: E402

from adapters.kubernetes.fleet_drain import EVICTIONS_PER_SECOND  # noqa: E402
from kit.hostlist import compress  # noqa: E402

KUBECTL = shutil.which("kubectl") or "kubectl"  # real kubectl (Debian 12 images ship it)
GOAL_RATIO, GOAL_CALLS = 8.0, 3.0
REASON = "bench fleet drain"
KUBECTL_QPS = 5  # client-go's default, which kubectl's non-discovery requests keep


def neutralise_seed(api: Api) -> None:
    """The seed's serving pods would be replaced on the nodes left, then have nowhere to go."""
    api("PATCH", SEED_RS, {"spec": {"replicas": 0}}, "application/merge-patch+json")
    for pod in api("GET", "/api/v1/namespaces/serving/pods")["items"]:
        api("DELETE", f"/api/v1/namespaces/serving/pods/{pod['metadata']['name']}",
            ok=(404,))
    deadline = time.monotonic() + 60
    while api("GET", "/api/v1/namespaces/serving/pods")["items"]:  # their grace period
        if time.monotonic() > deadline:
            raise RuntimeError("the seed's serving pods did not go within 60 s")
        time.sleep(0.2)


def budgets(api: Api, apps: list[str], max_unavailable: str) -> None:
    value: str | int = max_unavailable if max_unavailable.endswith("%") else int(max_unavailable)
    for app in apps:
        api("POST", f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets", {
            "metadata": {"name": app},
            "spec": {"maxUnavailable": value, "selector": {"matchLabels": {"app": app}}}})


def populate(api: Api, nodes: list[str], apps: list[str]) -> int:
    """Uncordon every node and give it one pod of each application; returns pods made."""
    for name in nodes:
        api("PATCH", f"/api/v1/nodes/{name}", {"spec": {"unschedulable": None}},
            "application/strategic-merge-patch+json")
    have = {(p["spec"].get("nodeName"), p["metadata"]["labels"].get("app"))
            for p in api("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
            if not p["metadata"].get("deletionTimestamp")}
    made = 0
    for node in nodes:
        for app in apps:
            if (node, app) not in have:
                api("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod(node, app))
                made += 1
    return made


def pod(node: str, app: str) -> dict[str, Any]:
    owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": f"{app}-{node}",
             "uid": str(uuid.uuid4()), "controller": True}
    return {"metadata": {"name": f"{app}-{node}-{uuid.uuid4().hex[:5]}",
                         "labels": {"app": app}, "ownerReferences": [owner]},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 30,
                     "volumes": [{"name": "scratch", "emptyDir": {}}],
                     "containers": [{"name": "serve", "image": "busybox",
                                     "volumeMounts": [{"name": "scratch",
                                                       "mountPath": "/scratch"}]}]},
            "status": {"phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def left(api: Api, nodes: list[str]) -> dict[str, int]:
    """Pods still to evict, and nodes still schedulable."""
    listing = api("GET", "/api/v1/nodes")["items"]
    schedulable = sum(1 for n in listing if n["metadata"]["name"] in set(nodes)
                      and not n["spec"].get("unschedulable"))
    return {"pods_left": sum(workload_pods(api, set(nodes)).values()),
            "nodes_schedulable": schedulable}


def tally(entries: list[dict[str, Any]]) -> dict[str, int]:
    evictions = [e for e in entries if e.get("subresource") == "eviction"]
    return {"api_requests": len(entries),
            "evicted": sum(1 for e in evictions if e["code"] == 201),
            "evictions_refused_429": sum(1 for e in evictions if e["code"] == 429),
            "writes": sum(1 for e in entries if e["method"] != "GET")}


def kubectl_drain(node: str, env: dict[str, str]) -> tuple[float, str]:
    """One ``kubectl drain``: its seconds, and why it failed ("" when it did not)."""
    start = time.perf_counter()
    done = subprocess.run([KUBECTL, "drain", node, "--ignore-daemonsets",
                           "--delete-emptydir-data", "--timeout=10m"], env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=900, check=False)
    why = f"{node}: {done.stderr.strip()[-300:]}" if done.returncode else ""
    return time.perf_counter() - start, why


def kubectl_round(lab: KubeLab, nodes: list[str], cache: Path,
                  parallel: int = 1) -> dict[str, Any]:
    """``kubectl drain`` of each node, ``parallel`` of them at once (1: node after node)."""
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(cache),
           "KUBECONFIG": str(lab.kubeconfig),
           "KUBECACHEDIR": str(cache / "kube-cache")}
    _, mark = lab.requests()
    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        done = list(pool.map(lambda node: kubectl_drain(node, env), nodes))
    wall = time.perf_counter() - began
    per_node = sorted(seconds for seconds, _ in done)
    failed = [why for _, why in done if why]
    entries, _ = lab.requests(mark, lambda e: e["userAgent"].startswith("kubectl"))
    figures = {"seconds": round(wall, 2), "parallel": parallel, "failed_nodes": len(failed),
               "median_node_seconds": round(per_node[len(per_node) // 2], 3),
               **tally(entries)}
    figures["requests_per_pod"] = round(figures["api_requests"] / max(figures["evicted"], 1), 2)
    for line in failed[:5]:
        print(f"  kubectl drain failed: {line}")
    return figures


def bot_config(folder: Path, lab: KubeLab) -> Path:
    """A bot whose only pool is this Kubernetes API; product defaults otherwise."""
    path = folder / "bot.yaml"
    path.write_text(yaml.safe_dump({
        "lab": True,  # allows --as USER, so one terminal can be requester and approver
        "database_url": f"sqlite:///{folder / 'bot.db'}", "database": {"create": True},
        "users": {"alice": {"groups": ["oncall"]}, "carol": {"groups": ["gpu-leads"]},
                  "dave": {"groups": ["gpu-leads"]}},
        "requesters": ["group:oncall", "group:gpu-leads"],
        "approvers": ["group:gpu-leads"],
        "kubernetes": {"kubeconfig": str(lab.kubeconfig)}}))
    return path


def bot_round(lab: KubeLab, folder: Path, nodes: list[str],
              args: argparse.Namespace) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RUNBOOK_", "SLURM_", "SLACK_", "KUBECONFIG"))}
    env["RUNBOOK_CONFIG"] = str(bot_config(folder, lab))
    _, mark = lab.requests()
    extra = ("--break-glass",) if args.break_glass else ()
    run = run_approved(env, "drain-nodes", [f"nodes={compress(nodes)}", f"reason={REASON}",
                                            *args.param],
                       approvers=("carol", "dave") if args.break_glass else ("carol",),
                       extra=extra)
    entries, _ = lab.requests(mark, lambda e: not e["userAgent"].startswith(
        ("kubectl", SETUP_AGENT)))
    figures: dict[str, Any] = {"seconds": round(run.seconds, 2),
                               "until_approved": round(run.until_approved, 2),
                               "succeeded": run.succeeded, **tally(entries)}
    figures["requests_per_pod"] = round(figures["api_requests"] / max(figures["evicted"], 1), 2)
    if run.execution_id is not None:
        figures["phases"] = phases(env, run)
        figures["engine_seconds"] = figures["phases"].get("engine_run")
    if not run.succeeded:
        print(f"  drain-nodes did not succeed (exit {run.exit_code}):\n    "
              + "\n    ".join(run.output[-15:]))
    return figures


def show(label: str, figures: dict[str, Any], state: dict[str, int]) -> None:
    print(f"{label:<38} {figures['seconds']:8.2f} s  evicted {figures['evicted']}, "
          f"429s {figures['evictions_refused_429']}, {figures['api_requests']} API requests "
          f"({figures['requests_per_pod']} per pod); left: {state['pods_left']} pods, "
          f"{state['nodes_schedulable']} nodes schedulable", flush=True)


def measure(lab: KubeLab, api: Api, folder: Path, args: argparse.Namespace,
            result: dict[str, Any]) -> None:
    nodes = [f"gpu{i:03d}" for i in range(1, args.nodes + 1)]
    apps = [f"bench-{i:02d}" for i in range(args.pods)]
    neutralise_seed(api)
    budgets(api, apps, args.max_unavailable)
    made = populate(api, nodes, apps)
    print(f"lab API: {args.nodes} nodes (+{args.spare} not drained); {made} pods made "
          f"({args.pods} per node, one per application; {args.pods} PDBs, maxUnavailable "
          f"{args.max_unavailable}); pod grace {args.pod_grace} s", flush=True)
    serial = kubectl_round(lab, nodes, folder)
    show("kubectl drain, node after node", serial, after := left(api, nodes))
    result["kubectl"] = {**serial, **after}
    print(f"  put back: {populate(api, nodes, apps)} pods made", flush=True)
    wide = kubectl_round(lab, nodes, folder, args.kubectl_parallel)
    show(f"kubectl drain, {args.kubectl_parallel} at once", wide, after := left(api, nodes))
    result["kubectl_parallel"] = {**wide, **after}
    print(f"  put back: {populate(api, nodes, apps)} pods made", flush=True)
    if not (ROOT / "runbooks" / "drain-nodes.yaml").exists():
        print("bot: runbooks/drain-nodes.yaml does not exist: not measured")
        result.update(bot=None, ratio=None, goal_met=None)
        return
    bot = bot_round(lab, folder, nodes, args)
    show("bot: runbook run drain-nodes", bot, after := left(api, nodes))
    result["bot"] = {**bot, **after}
    verdict(serial, wide, result["bot"], result)


def verdict(serial: dict[str, Any], wide: dict[str, Any], bot: dict[str, Any],
            result: dict[str, Any]) -> None:
    """The ratios to kubectl node after node (the goal's) and to the parallel kubectls."""
    done = bot["succeeded"] and bot["pods_left"] == 0
    ratio = serial["seconds"] / max(bot["seconds"], 1e-9) if done else 0.0
    same = wide["seconds"] / max(bot["seconds"], 1e-9) if done else 0.0
    fast, lean = ratio >= GOAL_RATIO, bot["requests_per_pod"] <= GOAL_CALLS
    print(f"ratio kubectl/bot {ratio:.1f}x (goal >= {GOAL_RATIO:g}x: "
          f"{'met' if fast else 'NOT met'}); against {wide['parallel']} kubectl drains at once "
          f"(the same summed budget) {same:.1f}x; bot API requests per pod "
          f"{bot['requests_per_pod']} (goal <= {GOAL_CALLS:g}: {'met' if lean else 'NOT met'})"
          f"; waited {bot['until_approved']:.2f} s for the approval; engine run "
          f"{bot.get('engine_seconds')} s")
    result.update(ratio=round(ratio, 2), ratio_same_budget=round(same, 2),
                  ratio_goal_met=fast and done, calls_per_pod_goal_met=lean and done)


def eviction_budget(params: list[str]) -> int:
    """The bot's eviction budget: a ``--param evictions_per_second=N``, or the default."""
    given = [p.split("=", 1)[1] for p in params if p.startswith("evictions_per_second=")]
    return int(given[-1]) if given else EVICTIONS_PER_SECOND


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--pods", type=int, default=20, help="pods per node (applications)")
    parser.add_argument("--max-unavailable", default="10%",
                        help="each application's PDB maxUnavailable (a number or N%%)")
    parser.add_argument("--pod-grace", type=float, default=0.5,
                        help="seconds an evicted pod takes to go (the lab's default 0.5)")
    parser.add_argument("--spare", type=int, default=1,
                        help="nodes of the pool not drained (the capacity guard's floor: "
                             "drain-nodes keeps min_free_gpus, 8 by default, free)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="another drain-nodes parameter (repeatable)")
    parser.add_argument("--kubectl-parallel", type=int, default=0, metavar="N",
                        help="kubectl drains at once in the second kubectl round (default: "
                             f"the bot's eviction budget / {KUBECTL_QPS}, kubectl's client QPS)")
    parser.add_argument("--break-glass", action="store_true",
                        help="request with --break-glass (a second approver, dave)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    args.kubectl_parallel = args.kubectl_parallel or max(
        1, eviction_budget(args.param) // KUBECTL_QPS)
    if not shutil.which(KUBECTL):
        sys.exit("needs real kubectl on PATH (Debian 12 images ship it; elsewhere "
                 "kubernetes-client)")
    cleanup_on_signals()
    folder = Path(tempfile.mkdtemp(prefix="grb-bench-k8s-"))
    result: dict[str, Any] = {"bench": "k8s_fleet_drain", "nodes": args.nodes,
                              "pods_per_node": args.pods, "max_unavailable": args.max_unavailable,
                              "pod_grace": args.pod_grace, "goal_ratio": GOAL_RATIO,
                              "eviction_budget": eviction_budget(args.param),
                              "kubectl_client_qps": KUBECTL_QPS,
                              "goal_calls_per_pod": GOAL_CALLS}
    lab: KubeLab | None = None
    try:
        # three digits: the seed adds gpu04 (a Slurm node seen by Kubernetes) to any list
        lab = KubeLab(folder, [f"gpu{i:03d}" for i in range(1, args.nodes + args.spare + 1)],
                      args.pod_grace)
        measure(lab, lab.wait_up(), folder, args, result)
    except BaseException as exc:
        failed(result, exc)
        raise
    finally:
        if lab is not None:
            lab.stop()
        if args.keep:
            print(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
        finish("k8s_fleet_drain", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
