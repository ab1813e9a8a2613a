"""Whose drain it is, on the lab's real Slurm: a node the bot drained for a failed health
check is not brought back by the routine resume-nodes (its plan lists every drained node's
reason and owner; override_drains=true, break-glass, does it); resume-node does not lift a
drain someone made by hand, and drain-node keeps their reason, adding its own (recorded in
the audit log); a drain-node whose Kubernetes drain fails (a PodDisruptionBudget that lets
no pod go) leaves the faulty node drained in Slurm instead of returning it; close-maintenance
refuses a window's or a run's reservation."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from adapters.kubernetes.cordons import FAILED_CHECK
from bot.service import Service
from kit.errors import Refused
from tests.adapters.test_kubernetes import set_pdb
from tests.lab.fixture import Lab
from tests.lab.kubehelp import api
from tests.runbooks.test_slurm_runbooks import (
    bot,
    events,
    node,
    reservations,
    resume_everything,
    run,
)

pytestmark = pytest.mark.lab
__all__ = ["bot"]  # the fixture, shared with the Slurm runbook tests

NODES = ("gpu01", "gpu02", "gpu03", "gpu04", "gpu05")
HAND = "bob: PSU fan noise, ticket 4411"


@pytest.fixture
def clean(lab: Lab) -> Iterator[Lab]:
    resume_everything(lab, *NODES)
    yield lab
    resume_everything(lab, *NODES)


def test_resume_nodes_leaves_a_node_that_failed_its_check(clean: Lab, bot: Service) -> None:
    lab = clean
    assert run(bot, "drain-node", {"node": "gpu02", "reason": "XID 79"}).state == "succeeded"
    lab.lab("fault", "gpu02", "health=fail")
    failed = run(bot, "resume-node", {"node": "gpu02"})
    lab.lab("fault", "gpu02", "clear")
    assert failed.state == "failed"
    verdict = node(lab, "gpu02")["reason"]
    assert verdict.startswith("health check failed")
    assert verdict.endswith(f"(execution {failed.id}: failed check)")
    plan = bot.plan("resume-nodes", {"nodes": "gpu[01-03]"})
    said = "\n".join(plan.steps[0].operations)
    assert (f"gpu02 is drained by the bot for a failed check (execution {failed.id}): "
            f'"{verdict}": STAYS DRAINED') in said
    ex = run(bot, "resume-nodes", {"nodes": "gpu[01-03]"})
    assert ex.state == "failed"
    assert ("post-check 'no node is left drained by someone else or for a failed check "
            "(override_drains=true lifts those)' failed: held out by someone else or for a "
            "failed check: gpu02: ") in (ex.error or "")
    assert verdict in (ex.error or "")
    step = [e["data"]["summary"] for e in events(bot, ex.id)
            if e["kind"] == "step_finished" and e["data"].get("step") == "slurm-resume"]
    assert step[0].startswith("resumed nothing; LEFT DRAINED: gpu02 (drained by the bot "
                              "for a failed check")
    assert "DRAIN" in node(lab, "gpu02")["state"] and node(lab, "gpu02")["reason"] == verdict
    with pytest.raises(Refused, match=r"override_drains=true weakens a guard"):
        bot.request("resume-nodes", {"nodes": "gpu02", "override_drains": "true"}, "alice")
    ex = run(bot, "resume-nodes", {"nodes": "gpu02", "override_drains": "true"},
             approvers=("carol", "dave"), break_glass=True)
    assert ex.state == "succeeded", ex.error
    assert "DRAIN" not in node(lab, "gpu02")["state"]


def cordon_of(lab: Lab, name: str) -> tuple[bool, dict[str, str]]:
    code, seen = api(lab, "GET", f"/api/v1/nodes/{name}")
    assert code == 200, seen
    return bool(seen["spec"].get("unschedulable")), seen["metadata"].get("annotations") or {}


def test_a_failed_check_keeps_the_node_out_of_both_pools(clean: Lab, bot: Service) -> None:
    """gpu05 serves both pools: its failed health check keeps its Kubernetes cordon too, so
    resume-nodes returns gpu06 (drained to work on it) and leaves gpu05 out in both."""
    lab = clean
    try:
        for name in ("gpu05", "gpu06"):  # the second one is below the pool's floor
            drained = run(bot, "drain-node", {"node": name, "reason": "XID 79"},
                          approvers=("carol", "dave"), break_glass=name == "gpu06")
            assert drained.state == "succeeded", drained.error
        lab.lab("fault", "gpu05", "health=fail")
        failed = run(bot, "resume-node", {"node": "gpu05"})
        lab.lab("fault", "gpu05", "clear")
        assert failed.state == "failed"
        assert "gpu05 kept cordoned in Kubernetes for the failed check" in (failed.error or "")
        assert "Kubernetes cordoned by the bot for a failed check" in (failed.error or "")
        cordoned, marks = cordon_of(lab, "gpu05")
        assert cordoned and marks[FAILED_CHECK].startswith("Slurm kept it out: health check")
        ex = run(bot, "resume-nodes", {"nodes": "gpu[05-06]"})
        assert ex.state == "failed"
        assert "left cordoned: gpu05 (cordoned by the bot for a failed check" in (ex.error or "")
        assert cordon_of(lab, "gpu05")[0] and not cordon_of(lab, "gpu06")[0]
        assert "DRAIN" in node(lab, "gpu05")["state"]
    finally:  # the Kubernetes API back on its seed: cordons and the serving pods' places
        assert lab.lab("reset", timeout=120).returncode == 0


def test_a_hand_drain_is_never_lifted_or_erased(clean: Lab, bot: Service) -> None:
    lab = clean
    lab.run("scontrol", "update", "NodeName=gpu03", "State=DRAIN", f"Reason={HAND}")
    ex = run(bot, "resume-node", {"node": "gpu03"})
    assert ex.state == "failed"
    assert (f'gpu03 is drained by someone else (not the bot): "{HAND}": that drain stays'
            in (ex.error or ""))
    assert "DRAIN" in node(lab, "gpu03")["state"] and node(lab, "gpu03")["reason"] == HAND
    assert "resume-gpu03" not in reservations(lab)  # the reservation was undone
    drained = run(bot, "drain-node", {"node": "gpu03", "reason": "XID 48"})
    assert drained.state == "succeeded", drained.error
    assert node(lab, "gpu03")["reason"] == f"{HAND} ++ XID 48 (execution {drained.id})"
    finished = [e for e in events(bot, drained.id)
                if e["kind"] == "step_finished" and e["data"].get("step") == "slurm-drain"]
    assert finished and finished[0]["data"]["details"]["kept_reasons"] == {"gpu03": HAND}


def test_a_failed_kubernetes_drain_leaves_the_node_drained_in_slurm(
        clean: Lab, bot: Service) -> None:
    lab = clean
    set_pdb(lab, 10)  # every serving pod must stay: the Kubernetes drain cannot finish
    try:
        ex = run(bot, "drain-node", {"node": "gpu05", "reason": "XID 94", "timeout": "10s"})
    finally:
        set_pdb(lab, 9)
        api(lab, "PATCH", "/api/v1/nodes/gpu05", {"spec": {"unschedulable": None}},
            ctype="application/strategic-merge-patch+json")
    assert ex.state == "failed"
    assert "step k8s-drain failed" in (ex.error or "")
    assert "completed steps left as they are" in (ex.error or "")
    state = node(lab, "gpu05")  # the faulty node is not handed back to training jobs
    assert "DRAIN" in state["state"] and state["reason"] == f"XID 94 (execution {ex.id})"


def test_close_maintenance_refuses_what_a_window_or_a_run_holds(clean: Lab,
                                                                bot: Service) -> None:
    for name, owner in (("window-3", "maintenance window 3"),
                        ("resume-gpu03", "a resume-node run on gpu03")):
        with pytest.raises(Refused, match=rf"reservation {name} belongs to {owner}"):
            bot.request("close-maintenance", {"name": name}, "alice")
    with pytest.raises(Refused, match=r"override_owner=true weakens a guard"):
        bot.request("close-maintenance", {"name": "window-3", "override_owner": "true"},
                    "alice")
    plan = bot.plan("close-maintenance", {"name": "window-3", "override_owner": "true"},
                    break_glass=True)
    *gate, delete = plan.steps[0].operations  # the GPU gate of the nodes it returns, then
    assert delete == "scontrol delete ReservationName=window-3"
    assert [line.split(":")[0] for line in gate] == ["first, DCGM in Prometheus for each node "
                                                     "of window-3 that returns to service (not "
                                                     "drained, not down)"]
