"""mig-reconfigure end to end against the lab: a Slurm node to all-3g.40gb and back to
all-disabled (Slurm's own `scontrol show node` changes its GRES), a Kubernetes node through
the lab's MIG Manager (label, state, mig resources, validator, uncordon), `lab fault NODE
mig=fail` stopping each side with its undo, GPUs missing from DCGM after the layout keeping the node
out on each side (drained / cordoned as a failed check), a cancel while jobs run, and a layout the
configuration does not list refused with nothing changed. Every node gets its layout back
(gpu:h100:8, nvidia.com/gpu 8), whatever happened: the other lab tests expect it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.kubernetes.cordons import CORDONED_BY, FAILED_CHECK
from bot.execution import executions
from bot.service import Service
from kit.errors import Refused
from tests.lab.fixture import Lab
from tests.lab.kubehelp import api, nodes, settled, wait_until
from tests.runbooks.test_gpu_gate_lab import back_in_dcgm
from tests.runbooks.test_slurm_runbooks import (
    bot,
    node,
    reservations,
    resume_everything,
    run,
    start_job,
    wait_for_event,
)

pytestmark = pytest.mark.lab
__all__ = ["bot"]  # the fixture, shared with the Slurm runbook tests

MIG_CONFIG, MIG_STATE = "nvidia.com/mig.config", "nvidia.com/mig.config.state"
LAB_NOTES = ("lab.gpu-runbook-bot/mig-applied", "lab.gpu-runbook-bot/mig-pending",
             "lab.gpu-runbook-bot/mig-failed")
PAUSED = ("nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.gpu-feature-discovery",
          "nvidia.com/gpu.deploy.dcgm-exporter")


def gres(lab: Lab, name: str) -> str:
    done = lab.run("scontrol", "show", "node", name, "-o")
    return dict(p.split("=", 1) for p in done.stdout.split() if "=" in p).get("Gres", "")


def nvidia_resources(lab: Lab, name: str) -> dict[str, str]:
    allocatable = nodes(lab)[name]["status"].get("allocatable") or {}
    return {k: v for k, v in allocatable.items() if k.startswith("nvidia.com/")}


@pytest.fixture
def slurm_node(lab: Lab) -> Iterator[str]:
    """gpu03, back on gpu:h100:8, in service and without reservations afterwards."""
    yield "gpu03"
    lab.lab("fault", "gpu03", "clear")
    back_in_dcgm(lab, "gpu03")
    (lab.dir / "state" / "mig" / "gpu03").unlink(missing_ok=True)
    if gres(lab, "gpu03") != "gpu:h100:8":
        assert lab.lab("mig-reload", "gpu03").returncode == 0
    resume_everything(lab, "gpu03")
    assert gres(lab, "gpu03") == "gpu:h100:8"


@pytest.fixture
def kube_node(lab: Lab) -> Iterator[str]:
    """gpu06 with MIG off (nvidia.com/gpu 8), its MIG labels gone, uncordoned; pool settled."""
    wait_until(lambda: settled(lab), "the Kubernetes pool to settle", timeout=60)
    yield "gpu06"
    lab.lab("fault", "gpu06", "clear")
    back_in_dcgm(lab, "gpu06")
    api(lab, "PATCH", "/api/v1/nodes/gpu06", {"metadata": {"labels": {MIG_CONFIG: "all-disabled"}}},
        ctype="application/merge-patch+json")
    wait_until(lambda: nodes(lab)["gpu06"]["metadata"]["labels"].get(MIG_STATE) == "success"
               and nvidia_resources(lab, "gpu06") == {"nvidia.com/gpu": "8"},
               "gpu06 back on plain GPUs", timeout=30)
    api(lab, "PATCH", "/api/v1/nodes/gpu06", {
        "metadata": {"labels": dict.fromkeys((MIG_CONFIG, MIG_STATE, *PAUSED)),
                     "annotations": dict.fromkeys((*LAB_NOTES, CORDONED_BY, FAILED_CHECK))},
        "spec": {"unschedulable": None}}, ctype="application/merge-patch+json")
    wait_until(lambda: settled(lab), "the Kubernetes pool to settle", timeout=90)


def test_slurm_node_to_all_3g_40gb_and_back(lab: Lab, bot: Service, slurm_node: str) -> None:
    ex = run(bot, "mig-reconfigure", {"node": slurm_node, "layout": "all-3g.40gb"})
    assert ex.state == "succeeded", ex.error
    assert gres(lab, slurm_node) == "gpu:3g.40gb:16"
    assert node(lab, slurm_node)["state"] == "IDLE"
    assert f"mig-{slurm_node}" not in reservations(lab)
    job = lab.run("srun", "-w", slurm_node, "--gres=gpu:3g.40gb:2", "-N1", "-n1", "printenv",
                  "CUDA_VISIBLE_DEVICES")
    assert job.returncode == 0 and job.stdout.strip() == "0,1", job.stderr
    ex = run(bot, "mig-reconfigure", {"node": slurm_node, "layout": "all-disabled"})
    assert ex.state == "succeeded", ex.error
    assert gres(lab, slurm_node) == "gpu:h100:8"
    assert node(lab, slurm_node)["state"] == "IDLE"


def test_kubernetes_node_through_the_mig_manager(lab: Lab, bot: Service,
                                                 kube_node: str) -> None:
    plan = bot.plan("mig-reconfigure", {"node": kube_node, "layout": "all-3g.40gb"})
    label = next(s for s in plan.steps if s.id == "k8s-label")
    assert label.operations == [f"kubectl label node {kube_node} {MIG_CONFIG}=all-3g.40gb "
                                "--overwrite"]
    ex = run(bot, "mig-reconfigure", {"node": kube_node, "layout": "all-3g.40gb",
                                      "timeout": "2m"})
    assert ex.state == "succeeded", ex.error
    seen = nodes(lab)[kube_node]
    assert seen["metadata"]["labels"][MIG_CONFIG] == "all-3g.40gb"
    assert seen["metadata"]["labels"][MIG_STATE] == "success"
    assert nvidia_resources(lab, kube_node) == {"nvidia.com/mig-3g.40gb": "16"}
    assert not seen["spec"].get("unschedulable")


def test_kubernetes_mig_failure_uncordons_and_reports(lab: Lab, bot: Service,
                                                      kube_node: str) -> None:
    lab.lab("fault", kube_node, "mig=fail")
    ex = run(bot, "mig-reconfigure", {"node": kube_node, "layout": "all-1g.10gb",
                                      "timeout": "2m"})
    assert ex.state == "failed"
    assert f"{MIG_STATE}=failed on {kube_node} for layout all-1g.10gb" in (ex.error or "")
    assert "undone: k8s-drain" in (ex.error or "")
    seen = nodes(lab)[kube_node]
    assert not seen["spec"].get("unschedulable")
    assert seen["metadata"]["labels"][MIG_STATE] == "failed"  # reported, not reverted
    assert nvidia_resources(lab, kube_node) == {"nvidia.com/gpu": "8"}


def test_slurm_mig_failure_resumes_the_node(lab: Lab, bot: Service, slurm_node: str) -> None:
    lab.lab("fault", slurm_node, "mig=fail")
    ex = run(bot, "mig-reconfigure", {"node": slurm_node, "layout": "all-1g.10gb"})
    assert ex.state == "failed"
    assert "slurm-apply failed" in (ex.error or "") and "error applying MIG" in (ex.error or "")
    assert "undone:" in (ex.error or "") and "slurm-drain" in (ex.error or "")
    assert node(lab, slurm_node)["state"] == "IDLE"
    assert f"mig-{slurm_node}" not in reservations(lab)
    assert gres(lab, slurm_node) == "gpu:h100:8"


def test_gpus_missing_from_dcgm_after_the_layout_keep_the_node_drained(
        lab: Lab, bot: Service, slurm_node: str) -> None:
    lab.lab("fault", slurm_node, "exporter=down")
    time.sleep(2.5)  # two scrapes: the series are gone from Prometheus (staleness marker)
    ex = run(bot, "mig-reconfigure", {"node": slurm_node, "layout": "all-3g.40gb"})
    assert ex.state == "failed"
    assert "has the layout but its GPUs did not pass" in (ex.error or "")
    state = node(lab, slurm_node)
    assert "DRAIN" in state["state"]  # the undo did not return it
    assert state["reason"].startswith(f"GPU telemetry: DCGM reports no GPU of {slurm_node} "
                                      "(its dcgm-exporter down"), state["reason"]
    assert state["reason"].endswith(f"(execution {ex.id}: failed check)")
    assert f"mig-{slurm_node}" not in reservations(lab)


def test_a_kubernetes_node_missing_a_gpu_after_the_layout_stays_cordoned(
        lab: Lab, bot: Service, kube_node: str) -> None:
    lab.lab("fault", kube_node, "gpu_missing=1")
    time.sleep(2.5)
    ex = run(bot, "mig-reconfigure", {"node": kube_node, "layout": "all-3g.40gb",
                                      "timeout": "2m"})
    assert ex.state == "failed"
    assert "k8s-gpus failed" in (ex.error or ""), ex.error
    seen = nodes(lab)[kube_node]
    assert seen["spec"].get("unschedulable") is True
    assert seen["metadata"]["annotations"][FAILED_CHECK].startswith(
        "GPU telemetry: DCGM reports 7 of 8 GPUs"), seen["metadata"]["annotations"]


def test_cancel_while_jobs_run_is_undone(lab: Lab, bot: Service, slurm_node: str) -> None:
    job = start_job(lab, slurm_node)

    def cancel_while_waiting(bot: Service, execution_id: int) -> None:
        wait_for_event(bot, execution_id, "step_started", "wait-idle")
        time.sleep(0.3)
        bot.cancel(execution_id, "alice")

    try:
        ex = run(bot, "mig-reconfigure", {"node": slurm_node, "layout": "all-3g.40gb"},
                 during=cancel_while_waiting)
        assert ex.state == "cancelled", ex.error
        assert "undone: slurm-drain" in (ex.error or "")
        assert "DRAIN" not in node(lab, slurm_node)["state"]
        assert "RUNNING" in lab.run("squeue", "-h", "-j", job, "-o", "%T").stdout
        assert gres(lab, slurm_node) == "gpu:h100:8"
    finally:
        lab.run("scancel", job)


def test_a_layout_not_listed_is_refused_with_nothing_changed(lab: Lab, bot: Service) -> None:
    before: dict[str, Any] = {"slurm": node(lab, "gpu03"), "gres": gres(lab, "gpu03"),
                              "kube": nodes(lab)["gpu06"]["metadata"]["labels"]}
    for layout in ("all-3g.40g", "all-7g.80gb"):
        with pytest.raises(Refused, match=r"not a configured MIG layout.*allowed: all-1g.10gb, "
                                          r"all-3g.40gb, all-disabled"):
            bot.request("mig-reconfigure", {"node": "gpu06", "layout": layout}, "alice")
    with bot.db.connect() as conn:
        assert executions.find(conn) == []  # nothing recorded, no lock taken
    assert node(lab, "gpu03") == before["slurm"] and gres(lab, "gpu03") == before["gres"]
    assert nodes(lab)["gpu06"]["metadata"]["labels"] == before["kube"]
