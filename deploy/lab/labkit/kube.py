"""The lab's Kubernetes API server (deploy/lab/kubeapi) as a lab daemon, and its kubeconfig."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .daemons import Daemon, http_status
from .layout import CLUSTER, DEFAULT_DRIVER, Info, Layout, Ports, node_names

NAME = "kubeapi"
# The Kubernetes pool: separate from the Slurm nodes gpu01..gpu04 of a default lab.
KUBE_NODES = ["gpu05", "gpu06", "gpu07", "gpu08"]
# Slurm nodes also registered in Kubernetes, serving Slurm (kubeapi.seed.HANDOFF_NODES):
# handoff-node moves them between the pools
HANDOFF_NODES = ["gpu04"]
FAULT_NODE = "kube"  # `lab fault kube api=500|hang|ok`
TOKEN = "grblab-admin-token"  # any bearer token is accepted; clients just need one
LAB_DIR = Path(__file__).resolve().parent.parent


def shape(slurm_nodes: list[str], slurmd_nodes: list[str],
          count: int | None) -> tuple[list[str], list[str]]:
    """The Kubernetes pool and its hand-off nodes: today's gpu05..gpu08 and gpu04 unless a
    count is given; then COUNT nodes numbered on after the Slurm nodes (the bot names a node
    once, so a name in both systems would be one node in both pools) and, as hand-off node,
    the fourth node running slurmd (if there is one)."""
    if count is None:
        return list(KUBE_NODES), list(HANDOFF_NODES)
    width = len(slurm_nodes[-1]) - 3 if slurm_nodes else 0
    pool = node_names(count, first=len(slurm_nodes) + 1, width=width)
    return pool, slurmd_nodes[3:4]


def of(info: Info) -> tuple[list[str], list[str]]:
    """The pool and hand-off nodes of a lab (labs from before --kube-nodes: today's)."""
    return (list(info.get("kube_nodes", KUBE_NODES)),
            list(info.get("handoff_nodes", HANDOFF_NODES)))


def kubeconfig_path(layout: Layout) -> Path:
    return layout.root / "kubeconfig"


def state_file(layout: Layout) -> Path:
    return layout.state / "kubeapi.json"


def audit_log(layout: Layout) -> Path:
    """Every request the API server answered, one JSON line each (kubeapi/audit.py)."""
    return layout.log / "kubeapi-audit.jsonl"


def url(ports: Ports) -> str:
    return f"http://127.0.0.1:{ports.service(NAME)}"


def daemon(layout: Layout, ports: Ports, pool: list[str] = KUBE_NODES,
           handoff: list[str] = HANDOFF_NODES) -> Daemon:
    port = ports.service(NAME)
    env = dict(os.environ, PYTHONPATH=str(LAB_DIR), PYTHONDONTWRITEBYTECODE="1")

    def ready() -> bool:
        return http_status(f"{url(ports)}/version", {"X-Lab-Probe": "1"}) == 200

    return Daemon(
        name=NAME,
        argv=[sys.executable, "-m", "kubeapi", "--port", str(port),
              "--state", str(state_file(layout)), "--faults", str(layout.faults),
              "--log", str(layout.log / "kubeapi.log"), "--audit-log", str(audit_log(layout)),
              "--nodes", ",".join(pool), "--handoff", ",".join(handoff),
              "--driver", DEFAULT_DRIVER],
        env=env, port=port, logs=[layout.log / "kubeapi.log", layout.log / "kubeapi.out"],
        ready=ready,
    )


def fresh_state(layout: Layout) -> None:
    """`lab up` seeds a fresh pool; `lab service kubeapi start` keeps the state."""
    state_file(layout).unlink(missing_ok=True)


def write_kubeconfig(layout: Layout, ports: Ports) -> Path:
    path = kubeconfig_path(layout)
    path.write_text(f"""\
apiVersion: v1
kind: Config
clusters:
- name: {CLUSTER}
  cluster:
    server: {url(ports)}
contexts:
- name: {CLUSTER}
  context:
    cluster: {CLUSTER}
    user: {CLUSTER}-admin
    namespace: default
current-context: {CLUSTER}
users:
- name: {CLUSTER}-admin
  user:
    token: {TOKEN}
""")
    path.chmod(0o600)
    return path


def info(layout: Layout, ports: Ports, pool: list[str] = KUBE_NODES,
         handoff: list[str] = HANDOFF_NODES) -> Info:
    return {"url": url(ports), "kubeconfig": str(kubeconfig_path(layout)),
            "nodes": pool, "handoff_nodes": handoff, "context": CLUSTER,
            "token": TOKEN,
            "fault_node": FAULT_NODE, "state_file": str(state_file(layout)),
            "log": str(layout.log / "kubeapi.log"), "audit_log": str(audit_log(layout))}
