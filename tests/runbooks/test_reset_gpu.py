"""reset-gpu end to end against the lab's real Slurm (fake nvidia-smi and dcgmi through srun)
and its Kubernetes API: a reset that works, a reset that fails (`reset=fail`) and falls back
to a reboot, a GPU that neither clears (`health=fail`: the node stays drained, the run fails
with the swap-gpu proposal in its plan), a cancel while jobs still run, and a Kubernetes-only
node refused before anything changes."""

from __future__ import annotations

import time
from typing import Any

import pytest

from bot.alerts import proposing
from bot.service import Service
from bot.store import audit
from kit.errors import Refused
from tests.lab.fixture import Lab
from tests.lab.kubehelp import nodes
from tests.runbooks.test_kubernetes_runbooks import pool, serving_pods
from tests.runbooks.test_slurm_runbooks import (
    bot,
    events,
    node,
    reservations,
    resume_everything,
    run,
    start_job,
    wait_for_event,
)

pytestmark = pytest.mark.lab
__all__ = ["bot", "pool"]  # the fixtures, shared with the other runbook tests


def reset_details(bot: Service, execution_id: int) -> dict[str, Any]:
    found = [e["data"] for e in events(bot, execution_id)
             if e["kind"] == "step_finished" and e["data"].get("step") == "reset"]
    assert found, "no step_finished event for the reset step"
    details: dict[str, Any] = found[-1]["details"]
    return details


def test_reset_gpu_resets_and_returns_the_node(lab: Lab, bot: Service) -> None:
    try:
        ex = run(bot, "reset-gpu", {"node": "gpu03", "gpu": "3", "reason": "XID 48"})
        assert ex.state == "succeeded", ex.error
        assert node(lab, "gpu03")["state"] == "IDLE"
        assert "reset-gpu03" not in reservations(lab)
        details = reset_details(bot, ex.id)
        assert details["method"] == "reset" and details["attempts"][0]["ok"]
    finally:
        resume_everything(lab, "gpu03")


def test_a_failing_reset_falls_back_to_a_reboot(lab: Lab, bot: Service) -> None:
    lab.lab("fault", "gpu04", "reset=fail")
    try:
        ex = run(bot, "reset-gpu", {"node": "gpu04", "gpu": "1", "reason": "XID 94"})
        assert ex.state == "succeeded", ex.error
        details = reset_details(bot, ex.id)
        assert details["method"] == "reboot"
        assert "Unable to reset this GPU" in details["attempts"][0]["error"]
        assert node(lab, "gpu04")["state"] == "IDLE"
        assert "reset-gpu04" not in reservations(lab)
    finally:
        resume_everything(lab, "gpu04")


def test_a_gpu_neither_clears_stays_drained_and_the_run_fails(lab: Lab, bot: Service) -> None:
    lab.lab("fault", "gpu04", "health=fail")
    try:
        ex = run(bot, "reset-gpu", {"node": "gpu04", "gpu": "1", "reason": "XID 48"})
        assert ex.state == "failed"
        assert "reset and reboot both failed" in (ex.error or "")
        state = node(lab, "gpu04")
        assert "DRAIN" in state["state"]
        assert state["reason"].startswith("GPU 1: reset and reboot did not clear it: health "
                                          "check failed"), state
        assert "reset-gpu04" not in reservations(lab)
        # the swap-gpu proposal was in the plan that was approved, and the failed reset
        # left it, open for a person
        assert ex.plan.propose_on_failure == {"runbook": "swap-gpu", "after_step": "reset",
                                              "params": {
            "node": "gpu04", "gpu": "1",
            "reason": "reset and reboot did not clear GPU 1: XID 48"}}
        [proposal] = proposing.listing(bot)
        assert (proposal.runbook, proposal.params["gpu"]) == ("swap-gpu", "1")
        assert proposal.alertname == "reset-gpu failed"
    finally:
        resume_everything(lab, "gpu04")


def test_cancel_while_waiting_for_jobs_resumes_the_node(lab: Lab, bot: Service) -> None:
    job = start_job(lab, "gpu02")

    def cancel_while_waiting(bot: Service, execution_id: int) -> None:
        wait_for_event(bot, execution_id, "step_started", "wait-idle")
        time.sleep(0.3)
        bot.cancel(execution_id, "alice")

    try:
        ex = run(bot, "reset-gpu", {"node": "gpu02", "gpu": "0", "reason": "XID 48"},
                 during=cancel_while_waiting)
        assert ex.state == "cancelled", ex.error
        assert "undone: drain" in (ex.error or "")
        assert "DRAIN" not in node(lab, "gpu02")["state"]
        assert "RUNNING" in lab.run("squeue", "-h", "-j", job, "-o", "%T").stdout
        assert "reset-gpu02" not in reservations(lab)
    finally:
        lab.run("scancel", job)
        resume_everything(lab, "gpu02")


def test_a_node_in_both_pools_is_drained_in_both_and_back_in_both(pool: Lab,
                                                                   bot: Service) -> None:
    lab = pool
    assert serving_pods(lab, "gpu05")
    try:
        ex = run(bot, "reset-gpu", {"node": "gpu05", "gpu": "2", "reason": "XID 74",
                                    "timeout": "2m"})
        assert ex.state == "succeeded", ex.error
        assert reset_details(bot, ex.id)["method"] == "reset"
        finished = [e["data"]["step"] for e in events(bot, ex.id) if e["kind"] == "step_finished"]
        assert finished == ["drain", "k8s-drain", "wait-idle", "reserve", "reset", "release",
                            "validator", "uncordon"]
        assert node(lab, "gpu05")["state"] == "IDLE"
        assert not nodes(lab)["gpu05"]["spec"].get("unschedulable")
    finally:
        resume_everything(lab, "gpu05")


def test_a_kubernetes_only_node_is_refused_with_nothing_changed(lab: Lab, bot: Service) -> None:
    assert "gpu06" not in bot.inventory.slurm
    before = nodes(lab)["gpu06"]["spec"].get("unschedulable")
    with pytest.raises(Refused, match=r"gpu06 is not in the Slurm pool: a GPU reset runs "
                                      r"nvidia-smi on the node through srun"):
        bot.request("reset-gpu", {"node": "gpu06", "gpu": "2", "reason": "XID 48"}, "alice")
    assert nodes(lab)["gpu06"]["spec"].get("unschedulable") == before
    with bot.db.connect() as conn:  # refused before any execution was recorded
        assert [e["kind"] for e in audit.events(conn) if e.get("execution_id")] == []
