"""The lab's Kubernetes API server (deploy/lab/kubeapi) as a lab daemon, and its kubeconfig."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .daemons import Daemon, http_status
from .layout import CLUSTER, DEFAULT_DRIVER, Info, Layout, Ports

NAME = "kubeapi"
# The Kubernetes pool: separate from the Slurm nodes gpu01..gpu04 of a default lab.
KUBE_NODES = ["gpu05", "gpu06", "gpu07", "gpu08"]
# Slurm nodes also registered in Kubernetes, serving Slurm (kubeapi.seed.HANDOFF_NODES):
# handoff-node moves them between the pools
HANDOFF_NODES = ["gpu04"]
FAULT_NODE = "kube"  # `lab fault kube api=500|hang|ok`
TOKEN = "grblab-admin-token"  # any bearer token is accepted; clients just need one
LAB_DIR = Path(__file__).resolve().parent.parent


def kubeconfig_path(layout: Layout) -> Path:
    return layout.root / "kubeconfig"


def state_file(layout: Layout) -> Path:
    return layout.state / "kubeapi.json"


def audit_log(layout: Layout) -> Path:
    """Every request the API server answered, one JSON line each (kubeapi/audit.py)."""
    return layout.log / "kubeapi-audit.jsonl"


def url(ports: Ports) -> str:
    return f"http://127.0.0.1:{ports.service(NAME)}"


def daemon(layout: Layout, ports: Ports) -> Daemon:
    port = ports.service(NAME)
    env = dict(os.environ, PYTHONPATH=str(LAB_DIR), PYTHONDONTWRITEBYTECODE="1")

    def ready() -> bool:
        return http_status(f"{url(ports)}/version", {"X-Lab-Probe": "1"}) == 200

    return Daemon(
        name=NAME,
        argv=[sys.executable, "-m", "kubeapi", "--port", str(port),
              "--state", str(state_file(layout)), "--faults", str(layout.faults),
              "--log", str(layout.log / "kubeapi.log"), "--audit-log", str(audit_log(layout)),
              "--nodes", ",".join(KUBE_NODES),
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


def info(layout: Layout, ports: Ports) -> Info:
    return {"url": url(ports), "kubeconfig": str(kubeconfig_path(layout)),
            "nodes": KUBE_NODES, "handoff_nodes": HANDOFF_NODES, "context": CLUSTER,
            "token": TOKEN,
            "fault_node": FAULT_NODE, "state_file": str(state_file(layout)),
            "log": str(layout.log / "kubeapi.log"), "audit_log": str(audit_log(layout))}
