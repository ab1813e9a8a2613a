"""The Kubernetes sides of the shipped runbooks end to end against the lab's Kubernetes API
(and real Slurm, for gpu05, which is in both pools): drain-node and resume-node on a node in
both pools and on a Kubernetes-only node, rollback-driver on the Kubernetes pool (to a given
version, back to the version before the last change, and stopping at an upgrade-failed node),
and restore-etcd against a real etcd."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from adapters.kubernetes.cordons import CORDONED_BY, FAILED_CHECK
from bot.service import Service
from tests.lab.fixture import Lab
from tests.lab.kubehelp import (
    api,
    is_daemonset_pod,
    nodes,
    pods_on,
    set_driver,
    settled,
    wait_until,
)
from tests.runbooks.test_slurm_runbooks import bot, events, node, resume_everything, run

pytestmark = pytest.mark.lab
__all__ = ["bot"]  # the fixture, shared with the Slurm runbook tests

DRIVER_LABEL = "lab.gpu-runbook-bot/driver-version"


@pytest.fixture
def pool(lab: Lab) -> Any:
    """The Kubernetes pool settled before and after; fast upgrade steps for the test."""
    wait_until(lambda: settled(lab), "the Kubernetes pool to settle", timeout=60)
    yield lab
    for name in ("gpu05", "gpu06", "gpu07", "gpu08"):
        lab.lab("fault", name, "clear")
    set_driver(lab, lab["default_driver_version"], 1, 0.05)
    for name in nodes(lab):
        api(lab, "PATCH", f"/api/v1/nodes/{name}", {"spec": {"unschedulable": None}},
            ctype="application/merge-patch+json")
    wait_until(lambda: settled(lab), "the Kubernetes pool to settle", timeout=90)


def serving_pods(lab: Lab, name: str) -> list[dict[str, Any]]:
    return [p for p in pods_on(lab, name) if not is_daemonset_pod(p)]


def test_drain_and_resume_a_node_in_both_pools(pool: Lab, bot: Service) -> None:
    lab = pool
    assert serving_pods(lab, "gpu05") and "gpu05" in bot.inventory.slurm
    try:
        ex = run(bot, "drain-node", {"node": "gpu05", "reason": "XID 79", "timeout": "2m"})
        assert ex.state == "succeeded", ex.error
        assert "DRAIN" in node(lab, "gpu05")["state"]
        assert nodes(lab)["gpu05"]["spec"].get("unschedulable") is True
        assert serving_pods(lab, "gpu05") == []
        assert any(is_daemonset_pod(p) for p in pods_on(lab, "gpu05"))  # DaemonSets stay
        ex = run(bot, "resume-node", {"node": "gpu05"})
        assert ex.state == "succeeded", ex.error
        assert node(lab, "gpu05")["state"] == "IDLE"
        assert not nodes(lab)["gpu05"]["spec"].get("unschedulable")
    finally:
        resume_everything(lab, "gpu05")


def test_drain_a_kubernetes_only_node_skips_slurm(pool: Lab, bot: Service) -> None:
    lab = pool
    ex = run(bot, "drain-node", {"node": "gpu06", "reason": "ECC", "timeout": "2m"})
    assert ex.state == "succeeded", ex.error
    assert nodes(lab)["gpu06"]["spec"].get("unschedulable") is True
    assert serving_pods(lab, "gpu06") == []
    from bot.store import audit
    with bot.db.connect() as conn:
        skipped = [e["data"]["step"] for e in audit.events(conn, execution_id=ex.id)
                   if e["kind"] == "step_skipped"]
    assert skipped == ["slurm-drain", "wait-idle"]


def driver_versions(lab: Lab) -> set[str]:
    return {n["metadata"]["labels"].get(DRIVER_LABEL) for n in nodes(lab).values()}


def test_rollback_driver_on_the_kubernetes_pool(pool: Lab, bot: Service) -> None:
    lab = pool
    set_driver(lab, lab["default_driver_version"], 2, 0.05)
    ex = run(bot, "rollback-driver", {"pool": "kubernetes", "version": "550.54.15"},
             approvers=("carol", "dave"))
    assert ex.state == "succeeded", ex.error
    assert driver_versions(lab) == {"550.54.15"}
    # No version: back to the one before the bot's last change, from the audit log.
    plan = bot.plan("rollback-driver", {"pool": "kubernetes"})
    steps = {step.id: step for step in plan.steps}
    assert steps["set-version"].args["version"] == lab["default_driver_version"]
    assert steps["policy"].args["max_parallel"] == 1  # the operator takes what the guard counted
    ex = run(bot, "rollback-driver", {"pool": "kubernetes"}, approvers=("carol", "dave"))
    assert ex.state == "succeeded", ex.error
    assert driver_versions(lab) == {lab["default_driver_version"]}


def test_rollback_driver_stops_at_an_upgrade_failed_node(pool: Lab, bot: Service) -> None:
    lab = pool
    set_driver(lab, lab["default_driver_version"], 1, 0.05)
    lab.lab("fault", "gpu06", "upgrade=fail")
    ex = run(bot, "rollback-driver", {"pool": "kubernetes", "version": "550.54.15"},
             approvers=("carol", "dave"))
    assert ex.state == "failed"
    assert "gpu06" in (ex.error or "") and "upgrade-failed" in (ex.error or "")
    assert "left as they are" in (ex.error or "")


def test_rollback_driver_cordons_a_node_whose_gpus_fail_after_the_rollout(
        pool: Lab, bot: Service) -> None:
    """The operator returns every node; the GPU gate then finds GPU 2 of gpu07 off the bus:
    gpu07 is cordoned as a failed check naming it, the run fails naming it, the rest serve."""
    lab = pool
    set_driver(lab, lab["default_driver_version"], 2, 0.05)
    lab.lab("fault", "gpu07", "gpu_missing=2")
    try:
        time.sleep(2.5)  # two scrapes: the series is gone from Prometheus
        ex = run(bot, "rollback-driver", {"pool": "kubernetes", "version": "550.54.15"},
                 approvers=("carol", "dave"))
        assert ex.state == "failed"
        assert "step k8s-gpus failed: KEPT OUT: gpu07 (DCGM reports 7 of 8 GPUs of gpu07: " \
            "GPU 2 missing" in (ex.error or ""), ex.error
        assert driver_versions(lab) == {"550.54.15"}  # the rollout itself went through
        seen = nodes(lab)
        assert seen["gpu07"]["spec"].get("unschedulable") is True
        assert seen["gpu07"]["metadata"]["annotations"][FAILED_CHECK].startswith(
            "GPU telemetry: DCGM reports 7 of 8 GPUs of gpu07")
        assert not any(seen[n]["spec"].get("unschedulable") for n in ("gpu05", "gpu06", "gpu08"))
    finally:
        lab.lab("fault", "gpu07", "clear")
        api(lab, "PATCH", "/api/v1/nodes/gpu07", {"metadata": {"annotations": dict.fromkeys(
            (CORDONED_BY, FAILED_CHECK))}}, ctype="application/merge-patch+json")


def etcdctl(lab: Lab, *args: str) -> str:
    env = {**lab.env, "ETCDCTL_API": "3"}
    env.pop("ETCDCTL_ENDPOINTS", None)
    done = subprocess.run(["etcdctl", f"--endpoints={lab['etcd']['endpoint']}", *args],
                          env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_restore_etcd_brings_the_keys_back(lab: Lab, bot: Service, tmp_path: Path) -> None:
    snapshot = tmp_path / "before.db"
    etcdctl(lab, "snapshot", "save", str(snapshot))
    etcdctl(lab, "del", "/registry/grblab/config/a")
    etcdctl(lab, "put", "/registry/grblab/config/after", "written after the snapshot")
    current = lab["etcd"]["data_dir"]
    try:
        ex = run(bot, "restore-etcd", {
            "snapshot": str(snapshot), "data_dir": str(tmp_path / "restored"),
            "previous_data_dir": current, "safety_snapshot": str(tmp_path / "safety.db"),
            "known_key": "/registry/grblab/config/a"}, approvers=("carol", "dave"))
        assert ex.state == "succeeded", ex.error
        checked = [e["data"] for e in events(bot, ex.id) if e["kind"] == "check_evaluated"]
        assert {c["check"] for c in checked if c["passed"]} >= {
            "Prometheus sees every etcd member up", "every etcd member has a leader",
            "the etcd cluster has exactly one leader"}
        assert etcdctl(lab, "get", "/registry/grblab/config/a", "--print-value-only").strip() == (
            lab["etcd"]["seed_keys"]["/registry/grblab/config/a"])
        assert etcdctl(lab, "get", "/registry/grblab/config/after").strip() == ""
        assert (tmp_path / "safety.db").stat().st_size > 0
    finally:  # back to the lab's own data, as the other tests expect it
        assert lab.lab("etcd-switch", lab["etcd"]["default_data_dir"]).returncode == 0
        for key, value in lab["etcd"]["seed_keys"].items():
            etcdctl(lab, "put", key, value)
        etcdctl(lab, "del", "/registry/grblab/config/after")


def test_a_restore_prometheus_cannot_see_is_switched_back(lab: Lab, bot: Service,
                                                         tmp_path: Path) -> None:
    """No etcd series in Prometheus (here: a job name nobody scrapes) fails the post-check:
    the run fails naming the query, and etcd is switched back to the data it ran on."""
    snapshot = tmp_path / "before.db"
    etcdctl(lab, "snapshot", "save", str(snapshot))
    etcdctl(lab, "put", "/registry/grblab/config/after", "written after the snapshot")
    current = lab["etcd"]["data_dir"]
    try:
        ex = run(bot, "restore-etcd", {
            "snapshot": str(snapshot), "data_dir": str(tmp_path / "restored"),
            "previous_data_dir": current, "safety_snapshot": str(tmp_path / "safety.db"),
            "etcd_job": "no-such-job"}, approvers=("carol", "dave"))
        assert ex.state == "failed"
        assert 'no data for up{job="no-such-job"}' in (ex.error or "")
        # switched back: the key written after the snapshot is there again
        assert etcdctl(lab, "get", "/registry/grblab/config/after",
                       "--print-value-only").strip() == "written after the snapshot"
    finally:
        assert lab.lab("etcd-switch", lab["etcd"]["default_data_dir"]).returncode == 0
        etcdctl(lab, "del", "/registry/grblab/config/after")


def identity_evidence(bot: Service, execution_id: int) -> Any:
    return [e["data"]["details"]["swap_evidence"] for e in events(bot, execution_id)
            if e["kind"] == "step_finished" and e["data"]["step"] == "k8s-identity"]


def test_swap_gpu_on_a_kubernetes_only_node(pool: Lab, bot: Service) -> None:
    """The swap evidence through a Job running the lab's nvidia-smi on gpu07: a swap that
    happened passes with both readings in the audit log; the old GPU still in keeps gpu07
    cordoned, marked as a failed check naming the GPU."""
    from tests.runbooks.test_slurm_runbooks import confirm_when_asked

    lab = pool
    try:
        ex = run(bot, "swap-gpu", {"node": "gpu07", "gpu": "2", "reason": "XID 79"},
                 during=confirm_when_asked(swap=False))
        assert ex.state == "failed"
        assert "GPU swap: GPU 2 still reports UUID" in (ex.error or ""), ex.error
        seen = nodes(lab)["gpu07"]
        assert seen["spec"].get("unschedulable") is True
        assert seen["metadata"]["annotations"][FAILED_CHECK].startswith(
            "GPU swap: GPU 2 still reports UUID")
        back_in_service(lab, "gpu07")  # as a person would, after looking
        ex = run(bot, "swap-gpu", {"node": "gpu07", "gpu": "2", "reason": "XID 79"},
                 during=confirm_when_asked())
        assert ex.state == "succeeded", ex.error
        [evidence] = identity_evidence(bot, ex.id)
        assert evidence["after"]["uuid"] != evidence["before"][0]["uuid"]
        assert evidence["after"] in evidence["dcgm"]
        assert not nodes(lab)["gpu07"]["spec"].get("unschedulable")  # validated, uncordoned
    finally:
        back_in_service(lab, "gpu07")


def back_in_service(lab: Lab, name: str) -> None:
    api(lab, "PATCH", f"/api/v1/nodes/{name}", {
        "spec": {"unschedulable": None},
        "metadata": {"annotations": dict.fromkeys((CORDONED_BY, FAILED_CHECK))}},
        ctype="application/merge-patch+json")
