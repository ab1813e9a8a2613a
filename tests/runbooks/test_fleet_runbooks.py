"""drain-nodes and resume-nodes end to end against the lab: a set of three Slurm nodes with
a job running on one (the drain waits for it, the node states show in the one chat message
and ``runbook status`` meanwhile), a cancel during the wait that resumes exactly the nodes
this run drained, and a Kubernetes set drained through the Eviction API with the serving
PodDisruptionBudget in the way."""

from __future__ import annotations

import time
from typing import Any

import pytest

from bot.service import Service
from bot.surfaces.rendering import status_text
from bot.surfaces.slack.blocks import progress_message
from tests.adapters.test_kubernetes import set_pdb
from tests.lab.fixture import Lab
from tests.lab.kubehelp import api, is_daemonset_pod, nodes, pods_on, settled, wait_until
from tests.runbooks.test_slurm_runbooks import (
    bot,
    node,
    resume_everything,
    run,
    start_job,
    wait_for_event,
)

pytestmark = pytest.mark.lab
__all__ = ["bot"]  # the fixture, shared with the Slurm runbook tests
SET = ["gpu01", "gpu02", "gpu03"]


def shown_while_waiting(bot: Service, execution_id: int) -> str:
    """The root chat message and ``runbook status`` once wait-idle published its states."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        states = bot.step_states(execution_id)
        wait = states.get(("do", "wait-idle"))
        if wait is not None and (wait.result or {}).get("status"):
            ex = bot.get(execution_id)
            return (str(progress_message(ex, [], states).blocks) + "\n"
                    + status_text(ex, [], states))
        time.sleep(0.1)
    raise AssertionError("wait-idle published no node states")


def test_drain_a_set_waits_for_the_job_then_resume_nodes(lab: Lab, bot: Service) -> None:
    job = start_job(lab, "gpu02", seconds=300)
    seen: dict[str, str] = {}

    def end_the_job_once_shown(bot: Service, execution_id: int) -> None:
        wait_for_event(bot, execution_id, "step_started", "wait-idle", seconds=30)
        seen["text"] = shown_while_waiting(bot, execution_id)
        lab.run("scancel", job)

    try:
        ex = run(bot, "drain-nodes", {"nodes": "gpu[01-03]", "reason": "rack 1 work",
                                      "timeout": "2m"}, during=end_the_job_once_shown)
        assert ex.state == "succeeded", ex.error
        assert "idle 2/3 gpu[01,03] · running jobs 1 gpu02" in seen["text"]
        assert "wait-idle: idle 2/3 gpu[01,03]" in seen["text"]  # runbook status too
        for name in SET:
            state = node(lab, name)
            assert "DRAIN" in state["state"]
            assert state["reason"] == f"rack 1 work (execution {ex.id})"
        ex = run(bot, "resume-nodes", {"nodes": "gpu[01-03]"})
        assert ex.state == "succeeded", ex.error
        assert all("DRAIN" not in node(lab, name)["state"] for name in SET)
    finally:
        lab.run("scancel", job)
        resume_everything(lab, *SET)


def test_a_cancel_during_wait_idle_resumes_only_this_runs_nodes(lab: Lab,
                                                              bot: Service) -> None:
    lab.run("scontrol", "update", "NodeName=gpu01", "State=DRAIN", "Reason=someone else")
    job = start_job(lab, "gpu03", seconds=300)
    seen: dict[str, float] = {}

    def cancel_while_waiting(bot: Service, execution_id: int) -> None:
        wait_for_event(bot, execution_id, "step_started", "wait-idle", seconds=30)
        time.sleep(0.5)
        asked = time.monotonic()
        bot.cancel(execution_id, "alice")
        while any("DRAIN" in node(lab, name)["state"] for name in ("gpu02", "gpu03")):
            assert time.monotonic() - asked < 15, "the set stayed drained"
            time.sleep(0.1)
        seen["back"] = time.monotonic() - asked

    try:
        ex = run(bot, "drain-nodes", {"nodes": "gpu[01-03]", "reason": "cancel me"},
                 during=cancel_while_waiting)
        assert ex.state == "cancelled", ex.error
        assert seen["back"] < 10 and "undone: slurm-drain" in (ex.error or "")
        assert node(lab, "gpu01")["reason"] == "someone else"  # not ours: left drained
        assert "DRAIN" in node(lab, "gpu01")["state"]
        assert "RUNNING" in lab.run("squeue", "-h", "-j", job, "-o", "%T").stdout
    finally:
        lab.run("scancel", job)
        resume_everything(lab, *SET)


@pytest.fixture
def pool(lab: Lab) -> Any:
    """The Kubernetes pool settled (the serving PDB allows one disruption), before and after."""
    wait_until(lambda: settled(lab), "the Kubernetes pool to settle", timeout=60)
    yield lab
    set_pdb(lab, 9)
    for name in nodes(lab):
        api(lab, "PATCH", f"/api/v1/nodes/{name}",
            {"spec": {"unschedulable": None},
             "metadata": {"annotations": {"gpu-runbook-bot/cordoned-by": None}}},
            ctype="application/merge-patch+json")
    wait_until(lambda: settled(lab), "the Kubernetes pool to settle", timeout=90)


def test_a_kubernetes_set_drain_waits_on_the_pdb_then_finishes(pool: Lab,
                                                                bot: Service) -> None:
    """gpu06 and gpu07 serve one pod each and the pool has no room for both replacements:
    the budget lets one go, refuses the other (shown as blocked by the PDB, the other node
    drained meanwhile) until the budget is relaxed; then the set finishes."""
    lab = pool
    targets = ["gpu06", "gpu07"]
    seen: dict[str, str] = {}

    def relax_once_blocked(bot: Service, execution_id: int) -> None:
        deadline = time.monotonic() + 30
        while "blocked by PDB 1" not in seen.get("text", ""):
            assert time.monotonic() < deadline, f"never blocked by the PDB: {seen}"
            states = bot.step_states(execution_id)
            seen["text"] = status_text(bot.get(execution_id), [], states)
            time.sleep(0.2)
        set_pdb(lab, 8)

    # two of four Kubernetes nodes out goes under the default floor: break-glass, 2 approvals
    ex = run(bot, "drain-nodes", {"nodes": "gpu[06-07]", "reason": "rack 2",
                                  "min_free_gpus": "0", "timeout": "40s",
                                  "evictions_per_second": "5"},
             approvers=("carol", "dave"), break_glass=True, during=relax_once_blocked)
    assert ex.state == "succeeded", ex.error
    assert "k8s-drain: drained " in seen["text"] and "/2 " in seen["text"]
    assert "PodDisruptionBudget serving/inference-pdb" in seen["text"]
    after = nodes(lab)
    for name in targets:
        assert after[name]["spec"].get("unschedulable") is True
        marks = after[name]["metadata"].get("annotations") or {}
        assert marks.get("gpu-runbook-bot/cordoned-by") == f"execution-{ex.id}"
        assert [p for p in pods_on(lab, name) if not is_daemonset_pod(p)] == []
    details = (bot.step_states(ex.id)[("do", "k8s-drain")].result or {})["details"]
    assert details["eviction_refusals"] >= 1 and details["cordoned"] == targets
    ex = run(bot, "resume-nodes", {"nodes": "gpu[06-07]"})
    assert ex.state == "succeeded", ex.error
    assert not any(nodes(lab)[name]["spec"].get("unschedulable") for name in targets)
