"""handoff-node end to end against the lab's real Slurm and its Kubernetes API: gpu04 (a
Slurm node the Kubernetes fake registers as serving Slurm: the pool label slurm and its
NoSchedule taint) moves to Kubernetes and back; the inventory and the node view follow, and
`runbook node` history shows both moves. A failed health check stops it with the node
drained with the verdict; a wait_idle deadline and a cancel undo it (the node serves Slurm
again); a node not in both systems, or not serving the giving pool, is not touched; the
capacity guard refuses a move that takes Slurm under its floor."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.config import EngineConfig, GuardsConfig, PoolFloors, load_config
from bot.config.remediation import PoolsConfig
from bot.service import Service
from bot.surfaces import nodeview
from kit.errors import Refused
from tests.lab.fixture import Lab
from tests.lab.kubehelp import api, nodes
from tests.runbooks.test_slurm_runbooks import node, reservations, run, start_job, wait_for_event

pytestmark = pytest.mark.lab

NODE, FEATURE, POOL = "gpu04", "training", "gpu-runbook-bot/pool"


def make_bot(lab: Lab, db: Path, **update: Any) -> Service:
    config = load_config(lab.dir / "bot.yaml")
    config = config.model_copy(update={
        "database_url": f"sqlite:///{db}",
        "engine": EngineConfig(lease_seconds=10, poll_seconds=0.1),
        "pools": PoolsConfig(slurm_feature=FEATURE), **update})
    return Service.from_config(config)


def serve_slurm(lab: Lab) -> None:
    """gpu04 as the lab starts it, plus the feature its Slurm jobs ask for."""
    lab.lab("fault", NODE, "clear")
    for line in reservations(lab).splitlines():
        if line.startswith(f"ReservationName=handoff-{NODE}"):
            lab.run("scontrol", "delete", f"ReservationName=handoff-{NODE}")
    if "DRAIN" in node(lab, NODE)["state"]:
        lab.run("scontrol", "update", f"NodeName={NODE}", "State=RESUME")
    lab.run("scontrol", "update", f"NodeName={NODE}", f"AvailableFeatures={FEATURE}",
            f"ActiveFeatures={FEATURE}")
    code, body = api(lab, "PATCH", f"/api/v1/nodes/{NODE}", {
        "metadata": {"labels": {POOL: "slurm"}},
        "spec": {"unschedulable": None,
                 "taints": [{"key": POOL, "value": "slurm", "effect": "NoSchedule"}]}},
        ctype="application/merge-patch+json")
    assert code == 200, body


@pytest.fixture
def handoff(lab: Lab, tmp_path: Path) -> Iterator[Service]:
    serve_slurm(lab)
    try:
        yield make_bot(lab, tmp_path / "bot.db")
    finally:
        serve_slurm(lab)
        lab.run("scontrol", "update", f"NodeName={NODE}", "AvailableFeatures=",
                "ActiveFeatures=")


def features(lab: Lab) -> str:
    out = lab.run("scontrol", "show", "node", NODE, "-o").stdout
    return out.split("AvailableFeatures=", 1)[1].split()[0]


def k8s(lab: Lab) -> dict[str, Any]:
    found = nodes(lab)[NODE]
    return {"pool": found["metadata"]["labels"].get(POOL),
            "taints": [t["key"] for t in found["spec"].get("taints") or []],
            "cordoned": bool(found["spec"].get("unschedulable"))}


def serves_slurm_now(lab: Lab, bot: Service) -> None:
    state = node(lab, NODE)
    assert "DRAIN" not in state["state"] and features(lab) == FEATURE
    assert k8s(lab) == {"pool": "slurm", "taints": [POOL], "cordoned": False}
    assert f"handoff-{NODE}" not in reservations(lab)


def test_handoff_to_kubernetes_and_back(lab: Lab, handoff: Service, tmp_path: Path) -> None:
    bot = handoff
    assert NODE in bot.inventory.slurm and NODE not in bot.inventory.kubernetes
    ex = run(bot, "handoff-node", {"node": NODE, "to": "kubernetes"})
    assert ex.state == "succeeded", ex.error
    state = node(lab, NODE)
    assert "DRAIN" in state["state"] and state["reason"].startswith("pool: kubernetes")
    assert features(lab) == "(null)"
    assert k8s(lab) == {"pool": "kubernetes", "taints": [], "cordoned": False}
    assert f"handoff-{NODE}" not in reservations(lab)
    now = make_bot(lab, tmp_path / "bot.db")  # the inventory as a new command sees it
    assert NODE in now.inventory.kubernetes and NODE not in now.inventory.slurm
    (view,) = nodeview.build(now, [NODE])
    assert view.pools == ["kubernetes"]
    assert nodeview.text(view).startswith(f"node {NODE}: serves kubernetes")

    ex = run(now, "handoff-node", {"node": NODE, "to": "slurm"})
    assert ex.state == "succeeded", ex.error
    serves_slurm_now(lab, now)
    after = make_bot(lab, tmp_path / "bot.db")
    assert NODE in after.inventory.slurm and NODE not in after.inventory.kubernetes
    (view,) = nodeview.build(after, [NODE])
    shown = nodeview.text(view)
    assert shown.startswith(f"node {NODE}: serves slurm") and "gpu:h100:8" in shown
    assert "handoff-node to=slurm succeeded" in shown
    assert "handoff-node to=kubernetes succeeded" in shown


def test_a_failed_health_check_leaves_the_node_drained_in_slurm(lab: Lab,
                                                                handoff: Service) -> None:
    lab.lab("fault", NODE, "health=fail")
    ex = run(handoff, "handoff-node", {"node": NODE, "to": "kubernetes"})
    assert ex.state == "failed"
    assert "health-check failed" in (ex.error or "")
    state = node(lab, NODE)
    assert "DRAIN" in state["state"] and state["reason"].startswith("health check failed")
    assert features(lab) == FEATURE  # undone: back in the Slurm pool, out of service
    assert k8s(lab) == {"pool": "slurm", "taints": [POOL], "cordoned": False}
    assert f"handoff-{NODE}" not in reservations(lab)


def test_the_wait_idle_deadline_undoes_the_handoff(lab: Lab, handoff: Service) -> None:
    job = start_job(lab, NODE)
    try:
        ex = run(handoff, "handoff-node", {"node": NODE, "to": "kubernetes", "timeout": "10s"})
        assert ex.state == "failed"
        assert "wait-idle failed" in (ex.error or "") and "undone: slurm-leave" in (ex.error or "")
        serves_slurm_now(lab, handoff)
        assert "RUNNING" in lab.run("squeue", "-h", "-j", job, "-o", "%T").stdout
    finally:
        lab.run("scancel", job)


def test_a_cancel_undoes_the_handoff(lab: Lab, handoff: Service) -> None:
    job = start_job(lab, NODE)

    def cancel_while_waiting(bot: Service, execution_id: int) -> None:
        wait_for_event(bot, execution_id, "step_started", "wait-idle", seconds=30)
        time.sleep(0.3)
        bot.cancel(execution_id, "alice")

    try:
        ex = run(handoff, "handoff-node", {"node": NODE, "to": "kubernetes"},
                 during=cancel_while_waiting)
        assert ex.state == "cancelled", ex.error
        assert "undone: slurm-leave" in (ex.error or "")
        serves_slurm_now(lab, handoff)
    finally:
        lab.run("scancel", job)


def test_a_node_only_slurm_knows_is_not_moved(lab: Lab, handoff: Service) -> None:
    ex = run(handoff, "handoff-node", {"node": "gpu01", "to": "kubernetes"})
    assert ex.state == "failed"
    assert "in-kubernetes failed" in (ex.error or "") and "gpu01" in (ex.error or "")
    assert node(lab, "gpu01")["state"] == "IDLE"  # nothing was changed
    ex = run(handoff, "handoff-node", {"node": NODE, "to": "slurm"})  # it serves Slurm
    assert ex.state == "failed" and "want kubernetes" in (ex.error or "")
    serves_slurm_now(lab, handoff)


def test_the_giving_pool_keeps_its_floor(lab: Lab, handoff: Service, tmp_path: Path) -> None:
    floors = GuardsConfig(min_free_gpus=PoolFloors(slurm=36))  # 5 nodes x 8 GPUs: 32 after
    sited = make_bot(lab, tmp_path / "sited.db", guards=floors)
    with pytest.raises(Refused, match=r"the site floor: .*Slurm pool: \d+ free GPUs now, "
                                      r"\d+ after taking gpu04 out \(floor 36"):
        sited.request("handoff-node", {"node": NODE, "to": "kubernetes"}, "alice",
                      break_glass=True)
    with pytest.raises(Refused, match=r"capacity guard: .*floor 39.*ask for break-glass"):
        handoff.request("handoff-node", {"node": NODE, "to": "kubernetes",
                                         "min_free_gpus": "39"}, "alice")
    serves_slurm_now(lab, handoff)
