"""The GPU gate on the lab's real Prometheus and DCGM simulator: a GPU off the bus keeps
resume-node's node drained, named in its reason; with the GPU back, the request passes (with
override_drains=true: the failed check's drain is the bot's for a failed check, which a routine
return never lifts); an XID while swap-gpu's node settles fails the swap and drains it; a
Kubernetes-only node missing a GPU stays cordoned, marked as a failed check."""

from __future__ import annotations

import time

import pytest

from adapters.kubernetes.cordons import FAILED_CHECK
from bot.service import Service
from tests.lab.fixture import Lab
from tests.lab.kubehelp import api, wait_until
from tests.runbooks.test_monitoring_path import prometheus_sees
from tests.runbooks.test_slurm_runbooks import (
    bot,
    confirm_when_asked,
    node,
    resume_everything,
    run,
)

pytestmark = pytest.mark.lab
__all__ = ["bot"]  # the fixture, shared with the Slurm runbook tests


def test_a_gpu_off_the_bus_keeps_the_node_drained_naming_it(lab: Lab, bot: Service) -> None:
    try:
        assert run(bot, "drain-node", {"node": "gpu02", "reason": "XID 79"}).state == "succeeded"
        lab.lab("fault", "gpu02", "gpu_missing=3")
        time.sleep(2.5)  # two scrapes: the series is gone from Prometheus (staleness marker)
        failed = run(bot, "resume-node", {"node": "gpu02"})
        assert failed.state == "failed"
        reason = node(lab, "gpu02")["reason"]
        assert reason.startswith("GPU telemetry: DCGM reports 7 of 8 GPUs of gpu02: GPU 3 "
                                 "missing (off the bus?)"), reason
        assert reason.endswith(f"(execution {failed.id}: failed check)")
        assert "its GPUs did not" in (failed.error or "")
        lab.lab("fault", "gpu02", "clear")
        time.sleep(2.5)
        passed = run(bot, "resume-node", {"node": "gpu02", "override_drains": "true"},
                     approvers=("carol", "dave"), break_glass=True)
        assert passed.state == "succeeded", passed.error
        assert node(lab, "gpu02")["state"] == "IDLE"
    finally:
        resume_everything(lab, "gpu02")
        back_in_dcgm(lab, "gpu02")


def test_an_xid_while_the_node_settles_fails_the_swap(lab: Lab, bot: Service) -> None:
    def xid_once_resumed(bot_: Service, execution_id: int) -> None:
        confirm_when_asked()(bot_, execution_id)
        deadline = time.monotonic() + 60
        while "DRAIN" in node(lab, "gpu03")["state"] and time.monotonic() < deadline:
            time.sleep(0.2)  # the health check resumes it inside its reservation
        time.sleep(1.0)
        lab.lab("fault", "gpu03", "xid=79")

    try:
        ex = run(bot, "swap-gpu", {"node": "gpu03", "gpu": "3", "reason": "XID 79",
                                   "settle": "30s"}, during=xid_once_resumed)
        assert ex.state == "failed"
        state = node(lab, "gpu03")
        assert "DRAIN" in state["state"]
        assert state["reason"].startswith("GPU telemetry: "), state["reason"]
        assert 'xid="79"' in state["reason"] or "xid=79" in state["reason"]  # counter, alert
    finally:
        resume_everything(lab, "gpu03")


def test_a_kubernetes_node_missing_a_gpu_stays_cordoned(lab: Lab, bot: Service) -> None:
    try:
        drained = run(bot, "drain-node", {"node": "gpu06", "reason": "XID 79"},
                      approvers=("carol", "dave"), break_glass=True)  # below the pool's floor
        assert drained.state == "succeeded", drained.error
        lab.lab("fault", "gpu06", "gpu_missing=2")
        time.sleep(2.5)
        failed = run(bot, "resume-node", {"node": "gpu06"})
        assert failed.state == "failed"
        assert "gpu06's GPUs did not pass: DCGM reports 7 of 8 GPUs of gpu06: GPU 2" in (
            failed.error or "")
        code, seen = api(lab, "GET", "/api/v1/nodes/gpu06")
        assert code == 200 and seen["spec"].get("unschedulable")
        assert seen["metadata"]["annotations"][FAILED_CHECK].startswith("GPU telemetry: ")
    finally:
        assert lab.lab("reset", timeout=120).returncode == 0  # cordons, faults, pods' places


def test_resume_nodes_returns_the_good_nodes_and_keeps_the_one_missing_a_gpu(
        lab: Lab, bot: Service) -> None:
    """resume-nodes gates every Slurm node before it returns: gpu03 (all GPUs, no error)
    goes back; gpu02 (GPU 3 off the bus) stays drained with the verdict added after the
    drain-nodes reason, marked as a failed check, and the run fails naming it."""
    try:
        drained = run(bot, "drain-nodes", {"nodes": "gpu[02-03]", "reason": "rack 1 work",
                                           "timeout": "1m"})
        assert drained.state == "succeeded", drained.error
        lab.lab("fault", "gpu02", "gpu_missing=3")
        time.sleep(2.5)  # two scrapes: the series is gone from Prometheus (staleness marker)
        ex = run(bot, "resume-nodes", {"nodes": "gpu[02-03]"})
        assert ex.state == "failed"
        back = node(lab, "gpu03")["state"]  # NOT_RESPONDING for a moment after a resume
        assert back.startswith("IDLE") and "DRAIN" not in back, back
        reason = node(lab, "gpu02")["reason"]
        assert reason.startswith(f"rack 1 work (execution {drained.id})"), reason
        assert "GPU telemetry: DCGM reports 7 of 8 GPUs of gpu02: GPU 3 missing" in reason
        assert reason.endswith(f"(execution {ex.id}: failed check)")
        assert "gpu02" in (ex.error or "")
    finally:
        resume_everything(lab, "gpu02", "gpu03")
        back_in_dcgm(lab, "gpu02")


def test_close_maintenance_keeps_out_a_node_missing_a_gpu(lab: Lab, bot: Service) -> None:
    """The reservation goes for gpu04, whose GPUs all report; gpu03 (GPU 2 off the bus) is
    drained with the verdict before it could return, and the run fails naming it."""
    try:
        opened = run(bot, "open-maintenance", {"name": "rack12", "nodes": "gpu[03-04]",
                                               "duration": "1h"})
        assert opened.state == "succeeded", opened.error
        lab.lab("fault", "gpu03", "gpu_missing=2")
        time.sleep(2.5)  # two scrapes: the series is gone from Prometheus (staleness marker)
        ex = run(bot, "close-maintenance", {"name": "rack12"})
        assert ex.state == "failed"
        assert "KEPT OUT: gpu03" in (ex.error or "")
        assert "rack12" not in lab.run("scontrol", "show", "reservation").stdout
        reason = node(lab, "gpu03")["reason"]
        assert reason.startswith("GPU telemetry: DCGM reports 7 of 8 GPUs of gpu03: GPU 2")
        assert reason.endswith(f"(execution {ex.id}: failed check)")
        assert "DRAIN" not in node(lab, "gpu04")["state"]
    finally:
        resume_everything(lab, "gpu03", "gpu04")
        back_in_dcgm(lab, "gpu03")


def back_in_dcgm(lab: Lab, name: str) -> None:
    """After a fault is cleared: Prometheus holds the node's eight GPUs again (the next test
    may gate it at once)."""
    wait_until(lambda: prometheus_sees(
        lab, f'count(DCGM_FI_DEV_GPU_TEMP{{Hostname="{name}"}}) == 8'),
        f"{name}'s GPUs back in Prometheus", timeout=30, every=0.2)
