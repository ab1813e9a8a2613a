"""`lab up --scale` in a lab of its own: 1,024 Slurm nodes (4 with slurmd), 512 Kubernetes
nodes numbered on after them, and the lab's bot.yaml naming every Slurm node."""
from __future__ import annotations

import json
import os
import tempfile
import urllib.request

import pytest

from tests.lab.fixture import lab_command, start_lab

pytestmark = pytest.mark.ownlab  # its own folder and ports: runs beside the shared lab
SLURM_NODES, KUBE_NODES, SLURMD = 1024, 512, 4


def test_scale_lab_has_1024_slurm_and_512_kubernetes_nodes() -> None:
    folder = tempfile.mkdtemp(prefix="grb-s-")  # short: unix socket paths stay < 108 bytes
    env = dict(os.environ, RUNBOOK_LAB_DIR=folder)
    env.pop("RUNBOOK_LAB_PORT_BASE", None)
    try:
        lab = start_lab(env, "--scale", "--no-install")
        sinfo = lab.run("sinfo", "-h", "-N", "-o", "%N %T")
        assert sinfo.returncode == 0, sinfo.stderr
        states = dict(line.split() for line in sinfo.stdout.splitlines())
        assert len(states) == SLURM_NODES
        assert sorted(states)[:2] == ["gpu0001", "gpu0002"] and max(states) == "gpu1024"
        assert [n for n, s in states.items() if s == "idle"] == lab["slurmd_nodes"]
        assert len(lab["slurmd_nodes"]) == SLURMD
        request = urllib.request.Request(f"{lab['kubeapi']['url']}/api/v1/nodes",
                                         headers={"Authorization": "Bearer t"})
        with urllib.request.urlopen(request, timeout=30) as response:
            names = {n["metadata"]["name"] for n in json.load(response)["items"]}
        pool, handoff = set(lab["kubeapi"]["nodes"]), set(lab["kubeapi"]["handoff_nodes"])
        assert len(pool) == KUBE_NODES and names == pool | handoff
        assert not pool & set(states), "a Kubernetes node named like a Slurm node"
        assert handoff <= set(lab["slurmd_nodes"])
        bot_yaml = (lab.dir / "bot.yaml").read_text()
        assert "gpu0001, gpu0002" in bot_yaml and "gpu1024]" in bot_yaml
    finally:
        lab_command("down", "--purge", env=env)
    assert not os.path.exists(folder)
