"""The lab's shape without starting it: node names and ports of scale labs, the
Kubernetes pool numbered on after the Slurm nodes, slurm.conf's node lines."""
from __future__ import annotations

import ipaddress
import sys
from pathlib import Path

import pytest

from tests.lab.fixture import REPO

sys.path.insert(0, str(REPO / "deploy" / "lab"))
from kubeapi import seed
from labkit import kube, layout, mig


def test_node_names_pad_to_the_widest_name() -> None:
    assert layout.node_names(5) == ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05"]
    assert layout.node_names(100)[0] == "gpu001"
    names = layout.node_names(1024)
    assert (names[0], names[-1], len(names)) == ("gpu0001", "gpu1024", 1024)
    assert names == sorted(names), "names sort as their numbers do"


def test_default_kubernetes_pool_is_unchanged() -> None:
    nodes = layout.node_names(5)
    assert kube.shape(nodes, nodes, None) == (["gpu05", "gpu06", "gpu07", "gpu08"], ["gpu04"])
    assert kube.of({}) == (kube.KUBE_NODES, kube.HANDOFF_NODES)


def test_scale_pool_is_numbered_after_the_slurm_nodes() -> None:
    nodes = layout.node_names(layout.SCALE_NODES)
    pool, handoff = kube.shape(nodes, nodes[:4], layout.SCALE_KUBE_NODES)
    assert (len(pool), pool[0], pool[-1]) == (512, "gpu1025", "gpu1536")
    assert not set(pool) & set(nodes)
    assert handoff == ["gpu0004"]


def test_scale_slurm_conf_gives_idle_nodes_one_shared_port(tmp_path: Path) -> None:
    nodes = layout.node_names(1024)
    ports = layout.Ports(20000, len(nodes))
    lines = mig.slurm_node_lines(layout.Layout(tmp_path), nodes,
                                 {n: ports.slurmd(i) for i, n in enumerate(nodes)}, "HW")
    assert lines == ["NodeName=gpu[0001-0380] NodeAddr=127.0.0.1 Port=[20010-20389] HW",
                     "NodeName=gpu[0381-1024] NodeAddr=127.0.0.1 Port=20399 HW"]
    assert max(ports.all()) < 20000 + layout.SLOT_SIZE, "the ports stay in the lab's slot"


def test_seeded_node_addresses_stay_valid_past_255_nodes() -> None:
    for index in (0, 255, 511):
        obj = seed.node(f"gpu{index:04d}", index, "535.161.08")
        ipaddress.ip_network(obj["spec"]["podCIDR"])
        ipaddress.ip_address(obj["status"]["addresses"][0]["address"])
    assert seed.node("gpu05", 0, "535.161.08")["spec"]["podCIDR"] == "10.244.0.0/24"


def test_plan_keeps_the_default_shape_and_plans_a_scale_lab(tmp_path: Path) -> None:
    from labkit import cli

    plain = cli.plan(layout.Layout(tmp_path), {}, None, None)
    assert plain["nodes"] == plain["slurmd_nodes"] == layout.node_names(5)
    assert "kube_nodes" not in plain, "a default lab.json stays as it was"
    scale = cli.plan(layout.Layout(tmp_path), {}, 1024, None, 512)
    assert len(scale["nodes"]) == 1024 and scale["slurmd_nodes"] == scale["nodes"][:4]
    assert len(scale["kube_nodes"]) == 512 and scale["handoff_nodes"] == ["gpu0004"]
    assert len(cli.watched(scale)) == 8, "telemetry: 4 slurmd nodes, 4 Kubernetes nodes"
    assert cli.watched(plain) == [*plain["nodes"], "gpu06", "gpu07", "gpu08"]
    with pytest.raises(layout.LabError, match="--slurmd"):
        cli.plan(layout.Layout(tmp_path), {}, 1024, 381, 512)
