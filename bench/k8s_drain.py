"""Drain of 100 Kubernetes nodes with 20 pods each: 10 nodes at a time vs one at a time.

Starts its own throw-away lab Kubernetes API (``python3 -m kubeapi`` from deploy/lab, on a
free loopback port, state in a temporary folder) seeded with ``--nodes`` GPU nodes. The
seed puts 2-3 serving pods on each node (8 GPUs, 2 per pod) behind a PDB that allows one
disruption, so it cannot make 20 pods per node by itself; the script therefore

* deletes the PDB and sets the serving ReplicaSet to 0 replicas (evictions always allowed,
  evicted pods are not replaced: the figures must not depend on PDB blocking);
* adds pods owned by a ``bench`` ReplicaSet (0 replicas, so the lab's controller neither
  adds nor removes any) until every node has ``--pods`` evictable pods; the 3 DaemonSet
  pods per node stay and are skipped by the drain.

Then, in the same run: ``k8s.drain`` of every node one after the other, uncordon and
re-populate, and ``k8s.drain`` of every node through a ThreadPool of ``--parallel``
workers. Every API request is counted (the ApiClient's ``call_api``). Prints wall times,
the ratio (goal: at least 8 times faster at 10 in parallel) and API calls per pod (goal:
at most 3). It never asserts a time.

The lab server answers each kept-alive request about 40 ms late (headers and body in two
sends with Nagle's algorithm on, see NODELAY): by default the script starts it with
TCP_NODELAY set, from the outside, without changing deploy/lab; ``--no-nodelay`` measures
it as ``lab up`` runs it.

Run: .venv/bin/python bench/k8s_drain.py [--nodes 100] [--pods 20] [--parallel 10]
     [--pod-grace 0.5] [--no-nodelay] [--keep]
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters.actions import ActionContext  # noqa: E402
from adapters.kubernetes import ClientBackend, KubernetesActions, KubernetesConfig  # noqa: E402

LAB = ROOT / "deploy" / "lab"
GOAL_RATIO, GOAL_CALLS = 8.0, 3.0
RS_PATH = "/apis/apps/v1/namespaces/serving/replicasets/inference-7d9f8c6b5d"
PDB_PATH = "/apis/policy/v1/namespaces/serving/poddisruptionbudgets/inference-pdb"
SERIAL = itertools.count()  # pod names (generateName's 5 hex characters collide at 2,000)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Api:
    """Raw JSON requests on one kept-alive connection, for the set-up (not counted)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=30)

    def __call__(self, method: str, path: str, body: Any = None,
                 ctype: str = "application/json") -> Any:
        data = json.dumps(body).encode() if body is not None else None
        self.conn.request(method, path, body=data, headers={"Content-Type": ctype})
        response = self.conn.getresponse()
        payload = response.read()
        if response.status >= 300:
            raise SystemExit(f"{method} {path}: {response.status} {payload[:300]!r}")
        return json.loads(payload or b"null")


# The lab server writes a response's headers and body in two sends with Nagle's algorithm
# on: on a kept-alive connection the body then waits for the client's delayed ACK (about
# 40 ms per request). --nodelay starts the same server with TCP_NODELAY set on its sockets.
NODELAY = ("import sys, kubeapi.server as s, kubeapi.__main__ as m; "
           "s.Handler.disable_nagle_algorithm = True; sys.exit(m.main())")


def start_server(folder: Path, nodes: list[str], grace: float,
                 nodelay: bool) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    log = open(folder / "kubeapi.out", "wb")  # noqa: SIM115 - closed with the process
    launch = ["-c", NODELAY] if nodelay else ["-m", "kubeapi"]
    process = subprocess.Popen(
        [sys.executable, *launch, "--port", str(port), "--state",
         str(folder / "state.json"), "--faults", str(folder / "faults"), "--log",
         str(folder / "kubeapi.log"), "--nodes", ",".join(nodes), "--pod-ready", "0.1",
         "--pod-grace", str(grace)],
        cwd=LAB, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"kubeapi exited {process.returncode}: "
                             + (folder / "kubeapi.out").read_text()[-2000:])
        try:
            urllib.request.urlopen(url + "/version", timeout=1).read()
            return process, url
        except OSError:
            time.sleep(0.1)
    process.terminate()
    raise SystemExit("kubeapi did not answer within 60 s")


def kubeconfig(folder: Path, url: str) -> Path:
    path = folder / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "clusters": [{"name": "bench", "cluster": {"server": url}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
        "users": [{"name": "bench", "user": {"token": "bench"}}]}))
    return path


def prepare(api: Api, rs: dict[str, Any], nodes: list[str], pods: int) -> int:
    """Uncordon every node and fill each up to ``pods`` evictable pods; returns pods added."""
    for name in nodes:
        api("PATCH", f"/api/v1/nodes/{name}", {"spec": {"unschedulable": None}},
            "application/strategic-merge-patch+json")
    listing = api("GET", "/api/v1/pods")["items"]
    have: dict[str, int] = {name: 0 for name in nodes}
    for pod in listing:
        owners = pod["metadata"].get("ownerReferences") or []
        if pod["spec"].get("nodeName") in have and not pod["metadata"].get(
                "deletionTimestamp") and not any(o["kind"] == "DaemonSet" for o in owners):
            have[pod["spec"]["nodeName"]] += 1
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "bench",
             "uid": rs["metadata"]["uid"], "controller": True}
    jobs = [name for name in nodes for _ in range(max(0, pods - have[name]))]

    def create(node: str) -> None:
        api("POST", "/api/v1/namespaces/default/pods", {
            "metadata": {"name": f"bench-{node}-{next(SERIAL)}", "labels": {"app": "bench"},
                         "ownerReferences": [owner]},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 30,
                     "containers": [{"name": "sleep", "image": "busybox"}]},
            "status": {"phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True"}]}})

    for node in jobs:
        create(node)
    return len(jobs)


def drain_all(actions: dict[str, Any], nodes: list[str], parallel: int,
              calls: list[str]) -> dict[str, Any]:
    drain = actions["k8s.drain"]
    calls.clear()
    began = time.perf_counter()

    def one(node: str) -> int:
        ctx = ActionContext(execution_id=1, step_id=f"drain-{node}",
                            deadline=time.monotonic() + 600)
        result = drain.run(drain.Arguments(node=node, timeout="10m"), ctx)
        return len(result.details["evicted"])

    if parallel <= 1:
        evicted = [one(node) for node in nodes]
    else:
        with ThreadPoolExecutor(parallel) as pool:
            evicted = list(pool.map(one, nodes))
    wall = time.perf_counter() - began
    pods = sum(evicted)
    return {"wall_seconds": round(wall, 2), "pods": pods, "api_calls": len(calls),
            "calls_per_pod": round(len(calls) / max(pods, 1), 2),
            "calls_per_node": round(len(calls) / len(nodes), 1),
            "evictions": sum(1 for c in calls if c.endswith("/eviction"))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--pods", type=int, default=20, help="evictable pods per node")
    parser.add_argument("--parallel", type=int, default=10, help="nodes drained at once")
    parser.add_argument("--pod-grace", type=float, default=0.5,
                        help="seconds an evicted pod takes to go (the lab's default 0.5)")
    parser.add_argument("--nodelay", action=argparse.BooleanOptionalAction, default=True,
                        help="start the lab server with TCP_NODELAY (default; see NODELAY)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="grb-k8s-bench-"))
    width = 3 if args.nodes >= 100 else 2
    nodes = [f"gpu{i:0{width}d}" for i in range(1, args.nodes + 1)]
    process, url = start_server(folder, nodes, args.pod_grace, args.nodelay)
    backend: ClientBackend | None = None
    try:
        api = Api(url)
        api("DELETE", PDB_PATH)
        api("PATCH", RS_PATH, {"spec": {"replicas": 0}}, "application/merge-patch+json")
        rs = api("POST", "/apis/apps/v1/namespaces/default/replicasets", {
            "metadata": {"name": "bench", "labels": {"app": "bench"}},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "bench"}},
                     "template": {"metadata": {"labels": {"app": "bench"}},
                                  "spec": {"containers": [{"name": "sleep",
                                                           "image": "busybox"}]}}}})
        config = KubernetesConfig(kubeconfig=str(kubeconfig(folder, url)),
                                  connection_pool_size=max(32, args.parallel * 2))
        backend = ClientBackend(config)
        calls: list[str] = []
        real = backend.api_client.call_api

        def counting(method: str, target: str, *rest: Any, **kwargs: Any) -> Any:
            calls.append(f"{method} {target}")
            return real(method, target, *rest, **kwargs)

        backend.api_client.call_api = counting  # type: ignore[assignment]
        actions = KubernetesActions(backend, config).by_name()

        print(f"lab API {url}: {args.nodes} nodes, {args.pods} evictable pods per node "
              f"(plus 3 DaemonSet pods), pod grace {args.pod_grace}s, no PDB, "
              f"TCP_NODELAY {'on' if args.nodelay else 'off'}")
        added = prepare(api, rs, nodes, args.pods)
        print(f"  added {added} pods")
        serial = drain_all(actions, nodes, 1, calls)
        print(f"one node at a time : {serial['wall_seconds']:8.2f} s  {serial['pods']} pods, "
              f"{serial['api_calls']} API calls ({serial['calls_per_pod']} per pod, "
              f"{serial['calls_per_node']} per node)")
        prepare(api, rs, nodes, args.pods)
        fast = drain_all(actions, nodes, args.parallel, calls)
        print(f"{args.parallel:2d} nodes at a time : {fast['wall_seconds']:8.2f} s  "
              f"{fast['pods']} pods, {fast['api_calls']} API calls ({fast['calls_per_pod']} "
              f"per pod, {fast['calls_per_node']} per node)")
        ratio = serial["wall_seconds"] / max(fast["wall_seconds"], 1e-9)
        worst = max(serial["calls_per_pod"], fast["calls_per_pod"])
        print(f"ratio {ratio:.1f}x (goal >= {GOAL_RATIO:g}x: "
              f"{'met' if ratio >= GOAL_RATIO else 'NOT met'}); API calls per pod "
              f"{worst} (goal <= {GOAL_CALLS:g}: {'met' if worst <= GOAL_CALLS else 'NOT met'})")
        print(json.dumps({"bench": "k8s_drain", "nodes": args.nodes, "pods_per_node": args.pods,
                          "parallel": args.parallel, "pod_grace": args.pod_grace,
                          "nodelay": args.nodelay,
                          "serial": serial, "parallel_run": fast, "ratio": round(ratio, 2),
                          "ratio_goal_met": ratio >= GOAL_RATIO,
                          "calls_per_pod_goal_met": worst <= GOAL_CALLS}))
    finally:
        if backend is not None:
            backend.close()
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if args.keep:
            print(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
