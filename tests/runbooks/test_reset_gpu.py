"""reset-gpu end to end against the lab's real Slurm (fake nvidia-smi and dcgmi through srun)
and its Kubernetes API: a reset that works, a reset that fails (`reset=fail`) and falls back
to a reboot, a GPU that neither clears (`health=fail`: the node stays drained, the run fails
with the swap-gpu proposal in its plan), a cancel while jobs still run; a Kubernetes-only
node: method=reset refused before anything changes, method=reboot through the lab's reboot
agent (drained, labelled, a new bootID, uncordoned), and no agent acting (`reboot=hang`: the
run fails in time, the node stays cordoned, swap-gpu is proposed)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.kubernetes.reboot import BOOT_ID_BEFORE
from bot.alerts import proposing
from bot.service import Service
from bot.store import audit
from kit.errors import Refused
from tests.lab.fixture import Lab
from tests.lab.kubehelp import api, nodes, wait_until
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
REBOOT_LABEL = "gpu-runbook-bot/reboot-requested"
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
        assert ex.plan.propose_on_failure == {"runbook": "swap-gpu",
                                              "after_step": ["reset", "k8s-reboot"],
                                              "params": {
            "node": "gpu04", "gpu": "1",
            "reason": "reset-gpu (reset) did not clear GPU 1: XID 48"}}
        [proposal] = proposing.listing(bot)
        # the lab's dcgmi names GPU 3 as the failing one ("Fail - GPU: 3"): swap that one
        assert (proposal.runbook, proposal.params["gpu"]) == ("swap-gpu", "3")
        assert (proposal.note or "").startswith("the diagnostic named GPU 3, not GPU 1")
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


def test_a_kubernetes_only_reset_is_refused_with_nothing_changed(lab: Lab,
                                                                  bot: Service) -> None:
    assert "gpu06" not in bot.inventory.slurm
    before = nodes(lab)["gpu06"]
    with pytest.raises(Refused, match=r"gpu06 is not in the Slurm pool: a GPU reset runs "
                                      r"nvidia-smi on the node through srun.*ask for "
                                      r"method=reboot"):
        bot.request("reset-gpu", {"node": "gpu06", "gpu": "2", "reason": "XID 48"}, "alice")
    after = nodes(lab)["gpu06"]
    assert after["spec"].get("unschedulable") == before["spec"].get("unschedulable")
    assert REBOOT_LABEL not in after["metadata"].get("labels", {})
    assert after["status"]["nodeInfo"]["bootID"] == before["status"]["nodeInfo"]["bootID"]
    with bot.db.connect() as conn:  # refused before any execution was recorded
        assert [e["kind"] for e in audit.events(conn) if e.get("execution_id")] == []


@pytest.fixture
def gpu06(pool: Lab) -> Iterator[Lab]:
    """gpu06 (Kubernetes only) left as found: no reboot fault, label or cordon."""
    try:
        yield pool
    finally:
        pool.lab("fault", "gpu06", "reboot=ok")
        api(pool, "PATCH", "/api/v1/nodes/gpu06", {
            "metadata": {"labels": {REBOOT_LABEL: None},
                         "annotations": {BOOT_ID_BEFORE: None}},
            "spec": {"unschedulable": None}}, ctype="application/merge-patch+json")


def test_a_kubernetes_only_node_reboots_through_the_agent(gpu06: Lab, bot: Service) -> None:
    lab = gpu06
    boot_before = nodes(lab)["gpu06"]["status"]["nodeInfo"]["bootID"]
    assert serving_pods(lab, "gpu06")
    ex = run(bot, "reset-gpu", {"node": "gpu06", "gpu": "2", "reason": "XID 79",
                                "method": "reboot", "timeout": "2m", "reboot_timeout": "1m"})
    assert ex.state == "succeeded", ex.error
    finished = [e["data"]["step"] for e in events(bot, ex.id) if e["kind"] == "step_finished"]
    assert finished == ["k8s-drain", "k8s-reboot", "validator", "k8s-diag", "k8s-gpus", "uncordon"]
    [label_line] = [op for step in ex.plan.steps if step.id == "k8s-reboot"
                    for op in step.operations][:1]
    assert label_line.startswith(f"kubectl label node gpu06 {REBOOT_LABEL}=")
    seen = nodes(lab)["gpu06"]
    assert seen["status"]["nodeInfo"]["bootID"] != boot_before
    assert REBOOT_LABEL not in seen["metadata"].get("labels", {})
    assert BOOT_ID_BEFORE not in seen["metadata"].get("annotations", {})
    assert not seen["spec"].get("unschedulable")
    [rebooted] = [e["data"]["details"] for e in events(bot, ex.id)
                  if e["kind"] == "step_finished" and e["data"].get("step") == "k8s-reboot"]
    assert rebooted["boot_id_before"] == boot_before
    assert rebooted["boot_id_after"] == seen["status"]["nodeInfo"]["bootID"]
    # serving pods land there again: one moved off another node comes to the empty gpu06
    if not serving_pods(lab, "gpu06"):
        victim = serving_pods(lab, "gpu07")[0]["metadata"]["name"]
        api(lab, "DELETE", f"/api/v1/namespaces/serving/pods/{victim}")
    wait_until(lambda: serving_pods(lab, "gpu06"), "a serving pod on gpu06", timeout=20)


def test_no_reboot_agent_leaves_the_node_cordoned_and_proposes_swap_gpu(
        gpu06: Lab, bot: Service) -> None:
    lab = gpu06
    lab.lab("fault", "gpu06", "reboot=hang")
    boot_before = nodes(lab)["gpu06"]["status"]["nodeInfo"]["bootID"]
    started = time.monotonic()
    ex = run(bot, "reset-gpu", {"node": "gpu06", "gpu": "2", "reason": "XID 79",
                                "method": "reboot", "timeout": "2m", "reboot_timeout": "6s"})
    assert ex.state == "failed"
    assert time.monotonic() - started < 60
    assert "gpu06 did not come back from a reboot within 6s" in (ex.error or "")
    assert "no reboot agent acted on the label" in (ex.error or "")
    seen = nodes(lab)["gpu06"]
    assert seen["spec"].get("unschedulable") is True  # on_failure: leave
    assert seen["status"]["nodeInfo"]["bootID"] == boot_before
    assert REBOOT_LABEL not in seen["metadata"].get("labels", {})  # the request withdrawn
    assert serving_pods(lab, "gpu06") == []
    [proposal] = proposing.listing(bot)
    assert (proposal.runbook, proposal.params["node"], proposal.params["gpu"]) == (
        "swap-gpu", "gpu06", "2")
    assert proposal.alertname == "reset-gpu failed"
