"""The capacity guard on the lab's real Slurm (5 nodes, 40 GPUs) for every shipped runbook
that takes GPUs out: with a site floor just under the pool's free GPUs, driver rollbacks and
upgrades over two nodes stop before the first drain with the guard's verdict, no node
touched (refused when planned; failed at the pre-check when the pool shrank after the
approval); swap-gpu and mig-reconfigure of a busy node are refused; swap-gpu of a node
already drained goes ahead, its plan saying the node costs nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from bot.config import GuardsConfig, PoolFloors
from bot.execution.engine import Engine
from bot.service import Service
from kit.errors import Refused
from tests.lab.fixture import Lab
from tests.runbooks.test_slurm_runbooks import (
    bot,
    confirm_when_asked,
    node,
    reservations,
    resume_everything,
    run,
)

pytestmark = pytest.mark.lab
__all__ = ["bot"]  # the fixture, shared with the Slurm runbook tests

NODES = ("gpu01", "gpu02", "gpu03", "gpu04", "gpu05")
NEW = "550.54.15"
SITE = r"the site floor: .*\(floor 33, the site floor \(guards\.min_free_gpus\.slurm\)"


def sited(bot: Service, slurm: int = 33) -> Service:
    """The same bot with a site floor on the Slurm pool (40 GPUs when all is in service)."""
    return Service.from_config(bot.config.model_copy(update={
        "guards": GuardsConfig(min_free_gpus=PoolFloors(slurm=slurm))}))


def states(lab: Lab) -> dict[str, str]:
    return {name: node(lab, name)["state"] for name in NODES}


@pytest.fixture
def clean(lab: Lab) -> Iterator[Lab]:
    resume_everything(lab, *NODES)
    yield lab
    lab.run("scancel", "--name=capacity-guard")
    resume_everything(lab, *NODES)


def test_driver_changes_under_the_site_floor_stop_before_the_first_drain(
        clean: Lab, bot: Service) -> None:
    lab = clean
    before, held = states(lab), reservations(lab)
    floor = sited(bot)
    with pytest.raises(Refused, match=SITE) as refused:
        floor.request("rollback-driver", {"nodes": "gpu[01-02]", "version": NEW}, "alice")
    assert ("Slurm pool: 40 free GPUs now, 32 after taking 1 of gpu[01-02] (2 nodes) at once "
            "(the worst case: gpu01) out") in str(refused.value)
    with pytest.raises(Refused, match=SITE):
        floor.request("upgrade-driver", {"pool": "slurm", "version": NEW, "canary": "gpu01",
                                         "nodes": "gpu02"}, "alice")
    assert states(lab) == before and reservations(lab) == held  # nothing touched


def test_a_pool_that_shrank_after_the_approval_stops_the_rollback_at_its_pre_check(
        clean: Lab, bot: Service) -> None:
    lab = clean
    asked = {"nodes": "gpu[01-02]", "version": NEW, "min_free_gpus": "9"}
    # planned and approved with 40 free, 32 with a node out: above 9
    execution_id = bot.request("rollback-driver", asked, "alice")
    for approver in ("carol", "dave"):
        bot.approve(execution_id, approver)
    for name in ("gpu03", "gpu04", "gpu05"):  # 16 free left, 8 with gpu01 out: under 9
        lab.run("scontrol", "update", f"NodeName={name}", "State=DRAIN",
                "Reason=bob: rack 4 power")
    engine = Engine(bot)
    try:
        ex = engine.drive(execution_id)
    finally:
        engine.close()
    assert ex.state == "failed"
    assert "16 free GPUs now, 8 after taking 1 of gpu[01-02]" in (ex.error or "")
    for name in ("gpu01", "gpu02"):
        assert node(lab, name)["state"] == "IDLE"
    assert "driver-gpu0" not in reservations(lab)


def test_swap_gpu_and_mig_reconfigure_of_a_busy_node_are_refused(
        clean: Lab, bot: Service) -> None:
    lab = clean
    job = lab.run("sbatch", "--parsable", "-o", "/dev/null", "-w", "gpu03", "-N1",
                  "--gres=gpu:2", "-J", "capacity-guard", "--wrap", "sleep 120").stdout.strip()
    deadline = time.monotonic() + 30
    while "RUNNING" not in lab.run("squeue", "-h", "-j", job, "-o", "%T").stdout:
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.2)
    floor = sited(bot)
    with pytest.raises(Refused, match=SITE) as refused:
        floor.request("swap-gpu", {"node": "gpu03", "gpu": "1", "reason": "XID 79"}, "alice")
    assert "38 free GPUs now, 32 after taking gpu03 out" in str(refused.value)
    with pytest.raises(Refused, match=SITE):
        floor.request("mig-reconfigure", {"node": "gpu03", "layout": "all-3g.40gb"}, "alice")
    assert "DRAIN" not in node(lab, "gpu03")["state"]
    assert "RUNNING" in lab.run("squeue", "-h", "-j", job, "-o", "%T").stdout


def test_swap_gpu_of_a_node_already_drained_goes_ahead_under_the_floor(
        clean: Lab, bot: Service) -> None:
    lab = clean
    drained = run(bot, "drain-node", {"node": "gpu02", "reason": "XID 79 on GPU 1"})
    assert drained.state == "succeeded", drained.error
    floor = sited(bot)  # 32 free: the pool is already under 33
    asked = {"node": "gpu02", "gpu": "1", "reason": "XID 79"}
    plan = floor.plan("swap-gpu", asked)
    assert plan.capacity == [
        "capacity stays above the floor: Slurm pool: 32 free GPUs now, taking nothing more; "
        "already out, costing nothing: gpu02 (drained) (floor 33, the site floor "
        "(guards.min_free_gpus.slurm); the runbook asks for 8)"]
    ex = run(floor, "swap-gpu", asked, during=confirm_when_asked())
    assert ex.state == "succeeded", ex.error
    assert node(lab, "gpu02")["state"] == "IDLE"
