"""upgrade-driver's actions against the in-memory fakes: ``slurm.driver_upgrade`` (canaries
first, the soak, the rest; stops at the first failure with the nodes done and the
rollback-driver request), ``prom.gpu_errors_hold`` (no new XID or ECC error), and the GPU
Operator's ``gpu_operator.skip_upgrade`` and ``gpu_operator.set_upgrade_policy``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from adapters.actions import ActionContext, ActionError, ActionStopped
from adapters.kubernetes.config import KubernetesConfig
from adapters.kubernetes.fake import FakeKubernetes
from adapters.kubernetes.gpu_operator import CLUSTERPOLICY
from adapters.kubernetes.upgrade_skip import (
    SET_BY,
    SKIP_LABEL,
    SetUpgradePolicyAction,
    SkipUpgradeAction,
    UpgradePolicyArguments,
)
from adapters.prometheus.backend import PrometheusError, Sample
from adapters.prometheus.config import PrometheusConfig
from adapters.prometheus.fake import FakePrometheus
from adapters.prometheus.soak import ErrorsHoldAction, ErrorsHoldArguments
from adapters.slurm.config import SlurmConfig
from adapters.slurm.driver_upgrade import DriverUpgradeAction
from adapters.slurm.fake import FakeSlurm

OLD, NEW = "535.161.08", "550.54.15"
COMMANDS = {"driver-install": {"argv": ["install"], "accepts_args": True},
            "driver-version": {"argv": ["version"]}, "health-check": {"argv": ["diag"]},
            "gpu-test-job": {"argv": ["job"]}}


class DriverSlurm(FakeSlurm):
    """Each node has a driver: ``install V`` sets it, ``version`` prints it; ``fail`` makes
    one command word fail on one node."""

    def __init__(self, nodes: list[str]) -> None:
        super().__init__(nodes)
        self.driver = dict.fromkeys(nodes, OLD)
        self.fail: dict[str, str] = {}

    def run_on_node(self, node: str, reservation: str | None, argv: list[str],
                    timeout: float, env: Mapping[str, str] | None = None
                    ) -> tuple[int, str, str]:
        self.calls.append(("srun", node, reservation, argv))
        if self.fail.get(node) == argv[0]:
            return 1, "Row remap | Fail\n", "srun: error: task 0: exit 1\n"
        if argv[0] == "install":
            self.driver[node] = argv[1]
        return 0, (self.driver[node] if argv[0] == "version" else "Pass") + "\n", ""


def errors(nodes: list[str], xid: float = 0.0, on: str = "") -> list[Sample]:
    return [Sample({"__name__": "DCGM_FI_DEV_XID_ERRORS", "Hostname": n, "gpu": "0"},
                   xid if n == on else 0.0) for n in nodes]


def context(seconds: float = 60) -> ActionContext:
    return ActionContext(execution_id=1, step_id="slurm-upgrade",
                         deadline=time.monotonic() + seconds)


def upgrade(slurm: FakeSlurm, prom: FakePrometheus | None,
            during_soak: Callable[[], None] = lambda: None) -> DriverUpgradeAction:
    def sleep(seconds: float) -> None:
        during_soak()
        time.sleep(min(seconds, 0.01))

    return DriverUpgradeAction(slurm, SlurmConfig.model_validate({"commands": COMMANDS}),
                               sleep, prometheus=prom)


def args(**over: Any) -> Any:
    base = {"canary": "gpu01", "nodes": "gpu[02-04]", "version": NEW, "soak": 0.2,
            "soak_poll": 0.05, "poll": 0.01}
    return DriverUpgradeAction.Arguments.model_validate({**base, **over})


def sruns(slurm: FakeSlurm) -> list[tuple[str, str]]:
    return [(c[1], c[3][0]) for c in slurm.calls if c[0] == "srun"]


def test_canaries_first_then_the_soak_then_the_rest() -> None:
    nodes = ["gpu01", "gpu02", "gpu03", "gpu04"]
    slurm, prom = DriverSlurm(nodes), FakePrometheus(errors(["gpu01"]))
    result = upgrade(slurm, prom).run(args(), context())
    assert slurm.driver == dict.fromkeys(nodes, NEW)
    assert result.details["done"] == nodes
    assert result.details["previous"] == dict.fromkeys(nodes, OLD)
    order = sruns(slurm)
    first_rest = order.index(("gpu02", "version"))
    soak = [order.index(("gpu01", "diag"), 3), order.index(("gpu01", "job"))]
    assert order[:5] == [("gpu01", "version"), ("gpu01", "install"), ("gpu01", "diag"),
                         ("gpu01", "version"), ("gpu01", "diag")]
    assert max(soak) < first_rest  # the soak's diagnostic and test job before the rest
    assert [c for c in slurm.calls if c[0] == "srun" and c[3][0] == "job"] == [
        ("srun", "gpu01", None, ["job"])]  # outside any reservation: a job like any other
    assert len(prom.queries) >= 3 and 'Hostname=~"gpu01"' in prom.queries[0]
    assert not any("DRAIN" in n.flags for n in slurm.state.values())


def test_a_new_xid_during_the_soak_stops_before_the_rest() -> None:
    slurm = DriverSlurm(["gpu01", "gpu02", "gpu03"])
    prom = FakePrometheus(errors(["gpu01"]))

    def xid() -> None:
        if prom.queries:  # the soak began: its baseline is read
            prom.answer = errors(["gpu01"], 79, "gpu01")

    with pytest.raises(ActionError) as caught:
        upgrade(slurm, prom, xid).run(args(nodes="gpu[02-03]"), context())
    text = str(caught.value)
    assert "stopped in the soak: new GPU errors during the soak: gpu01: " \
           'DCGM_FI_DEV_XID_ERRORS{gpu="0"} 0 -> 79' in text
    assert f"Done (on driver {NEW}): gpu01; not started: gpu[02-03]" in text
    assert f"`runbook run rollback-driver pool=slurm nodes=gpu01 version={OLD}`" in text
    assert slurm.driver == {"gpu01": NEW, "gpu02": OLD, "gpu03": OLD}
    assert "DRAIN" in slurm.state["gpu01"].flags  # a canary that failed its soak stays out
    assert slurm.state["gpu01"].reason.startswith(f"driver {NEW} soak failed")


def test_a_failing_diagnostic_in_the_soak_stops_it() -> None:
    slurm, prom = DriverSlurm(["gpu01", "gpu02"]), FakePrometheus(errors(["gpu01"]))
    slurm.fail["gpu01"] = "job"
    with pytest.raises(ActionError, match=r"soak: gpu01: gpu-test-job failed"):
        upgrade(slurm, prom).run(args(nodes="gpu02"), context())
    assert slurm.driver["gpu02"] == OLD


def test_a_failure_in_the_rest_lists_the_nodes_done_and_the_rollback() -> None:
    nodes = ["gpu01", "gpu02", "gpu03", "gpu04"]
    slurm, prom = DriverSlurm(nodes), FakePrometheus(errors(["gpu01"]))
    slurm.fail["gpu03"] = "diag"  # its health check after the install
    with pytest.raises(ActionError) as caught:
        upgrade(slurm, prom).run(args(), context())
    text = str(caught.value)
    assert "stopped in the rest: gpu03: FAILED: health-check failed" in text
    assert "(left drained)" in text
    assert f"Done (on driver {NEW}): gpu[01-02]; not started: gpu04" in text
    assert f"`runbook run rollback-driver pool=slurm nodes=gpu[01-02] version={OLD}`" in text
    assert slurm.driver["gpu04"] == OLD
    assert "DRAIN" in slurm.state["gpu03"].flags
    assert "DRAIN" not in slurm.state["gpu02"].flags


def test_a_failing_first_canary_leaves_nothing_to_roll_back() -> None:
    slurm, prom = DriverSlurm(["gpu01", "gpu02"]), FakePrometheus(errors(["gpu01"]))
    slurm.fail["gpu01"] = "install"
    with pytest.raises(ActionError) as caught:
        upgrade(slurm, prom).run(args(nodes="gpu02"), context())
    assert "Done (on driver 550.54.15): none; not started: gpu02" in str(caught.value)
    assert "rollback-driver" not in str(caught.value)
    assert prom.queries == []  # no soak


def test_overlap_and_missing_nodes_are_refused_at_plan() -> None:
    action = upgrade(DriverSlurm(["gpu01", "gpu02"]), FakePrometheus([]))
    with pytest.raises(ActionError, match=r"gpu02 named both in canary= and in nodes="):
        action.plan(args(canary="gpu[01-02]", nodes="gpu02"))
    with pytest.raises(ActionError, match=r"nodes= is required for the Slurm pool"):
        action.plan(args(nodes=""))
    lines = action.plan(args(nodes="gpu02"))
    assert lines[0] == "canaries:" and any(line.startswith("soak 0.2s") or "soak" in line
                                           for line in lines)
    assert any("srun -w gpu01 job" in line for line in lines)


def test_without_prometheus_the_plan_is_refused() -> None:
    action = upgrade(DriverSlurm(["gpu01", "gpu02"]), None)
    with pytest.raises(ActionError, match=r"configure prometheus"):
        action.plan(args(nodes="gpu02"))


def test_a_canary_prometheus_does_not_see_fails_the_soak() -> None:
    slurm, prom = DriverSlurm(["gpu01", "gpu02"]), FakePrometheus(errors(["gpu09"]))
    with pytest.raises(ActionError, match=r"no DCGM error series .* for gpu01"):
        upgrade(slurm, prom).run(args(nodes="gpu02"), context())
    assert slurm.driver["gpu02"] == OLD


def test_a_cancel_during_the_soak_stops_with_the_nodes_done() -> None:
    slurm, prom = DriverSlurm(["gpu01", "gpu02"]), FakePrometheus(errors(["gpu01"]))
    ctx = context()
    def cancel() -> None:
        if prom.queries:  # the soak began
            ctx.request_stop("the execution was cancelled")

    action = upgrade(slurm, prom, cancel)
    with pytest.raises(ActionStopped) as caught:
        action.run(args(nodes="gpu02", soak=30), ctx)
    assert "stopped in the soak" in str(caught.value)
    assert f"nodes=gpu01 version={OLD}" in str(caught.value)
    assert slurm.driver["gpu02"] == OLD
    assert "DRAIN" not in slurm.state["gpu01"].flags  # a cancel does not judge the canary


# --- prom.gpu_errors_hold -------------------------------------------------------------

def hold(prom: FakePrometheus) -> ErrorsHoldAction:
    return ErrorsHoldAction(prom, PrometheusConfig(url="http://prometheus.invalid:9090"),
                            lambda s: time.sleep(min(s, 0.01)))


def test_errors_hold_passes_when_nothing_rises() -> None:
    prom = FakePrometheus(errors(["gpu05", "gpu06"], 79, "gpu06"))  # an old XID: not new
    action = hold(prom)
    arguments = ErrorsHoldArguments.model_validate({"nodes": "gpu[05-06]", "duration": 0.1,
                                                 "poll": 0.02})
    result = action.run(arguments, context())
    assert result.summary == "no new XID or ECC error on gpu[05-06] for 0.1s"
    assert 'Hostname=~"gpu05|gpu06"' in prom.queries[0]
    assert 'hostname=~"gpu05|gpu06"' in prom.queries[0]


def test_errors_hold_fails_on_a_new_series_with_the_hint() -> None:
    prom = FakePrometheus(errors(["gpu06"]))
    action = hold(prom)
    arguments = ErrorsHoldArguments.model_validate({"nodes": "gpu06", "duration": 5,
                                                 "poll": 0.02, "hint": "Left: the canary."})
    new = Sample({"__name__": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Hostname": "gpu06",
                  "gpu": "2"}, 1.0)
    timer = threading.Timer(0.1, lambda: setattr(prom, "answer", [*errors(["gpu06"]), new]))
    timer.start()
    with pytest.raises(ActionError, match=r"gpu06: DCGM_FI_DEV_ECC_DBE_VOL_TOTAL\{gpu=\"2\"\} "
                                          r"0 -> 1\. Left: the canary\."):
        action.run(arguments, context())
    timer.join()


def test_errors_hold_fails_closed() -> None:
    arguments = ErrorsHoldArguments.model_validate({"nodes": "gpu06", "duration": 1})
    with pytest.raises(ActionError, match=r"cannot read the GPU error counters"):
        hold(FakePrometheus(PrometheusError("connection refused"))).run(arguments, context())
    with pytest.raises(ActionError, match=r"no DCGM error series"):
        hold(FakePrometheus([])).run(arguments, context())


# --- the GPU Operator: the skip labels and the upgrade policy -----------------------------

def label(kube: FakeKubernetes, name: str, labels: dict[str, str]) -> None:
    kube.patch_node(name, {"metadata": {"labels": labels}})


def cluster() -> tuple[FakeKubernetes, KubernetesConfig]:
    kube = FakeKubernetes(["gpu05", "gpu06", "gpu07", "gpu08"])
    for name in kube.nodes:
        label(kube, name, {"nvidia.com/gpu.present": "true"})
    group, version, plural = CLUSTERPOLICY
    kube.objects[(group, version, plural, None, "cluster-policy")] = {
        "metadata": {"name": "cluster-policy", "resourceVersion": "1"},
        "spec": {"driver": {"version": OLD, "repository": "nvcr.io/nvidia", "image": "driver",
                            "upgradePolicy": {"autoUpgrade": True, "maxParallelUpgrades": 1,
                                              "drain": {"enable": False,
                                                        "timeoutSeconds": 300}}}}}
    return kube, KubernetesConfig()


def skip(kube: FakeKubernetes, config: KubernetesConfig, **over: Any) -> Any:
    action = SkipUpgradeAction(kube, config, lambda s: None)
    return action, action.Arguments.model_validate({"canary": "gpu05", **over})


def skipped(kube: FakeKubernetes) -> dict[str, tuple[str | None, str | None]]:
    return {name: (n.labels.get(SKIP_LABEL), n.labels.get(SET_BY))
            for name, n in sorted(kube.nodes.items())}


def test_the_skip_label_holds_back_all_but_the_canaries_and_only_the_bots_come_off() -> None:
    kube, config = cluster()
    label(kube, "gpu08", {SKIP_LABEL: "true"})  # the site skips gpu08 on purpose
    action, hold = skip(kube, config)
    assert action.plan(hold) == [
        f"kubectl label node NODE {SKIP_LABEL}=true {SET_BY}=true for every node matching "
        f"nvidia.com/gpu.present=true but gpu05; a node that already has {SKIP_LABEL}=true "
        "(the site's) is left as it is"]
    result = action.run(hold, context())
    assert result.changed and result.details["labelled"] == ["gpu06", "gpu07"]
    assert result.details["site_skipped"] == ["gpu08"]
    assert skipped(kube) == {"gpu05": (None, None), "gpu06": ("true", "true"),
                             "gpu07": ("true", "true"), "gpu08": ("true", None)}
    again = action.run(hold, context())  # a run resumed after a crash: same record
    assert not again.changed and again.details["held"] == ["gpu06", "gpu07"]
    _, release = skip(kube, config, remove=True)
    assert "kubectl label nodes -l gpu-runbook-bot/upgrade-skip-set=true" in \
        action.plan(release)[0]
    result = action.run(release, context())
    assert result.changed and result.details["released"] == ["gpu06", "gpu07"]
    assert skipped(kube) == {"gpu05": (None, None), "gpu06": (None, None),
                             "gpu07": (None, None), "gpu08": ("true", None)}
    assert not action.run(release, context()).changed


def test_a_half_done_hold_is_completed_and_an_old_mark_on_a_canary_freed() -> None:
    kube, config = cluster()
    label(kube, "gpu05", {SKIP_LABEL: "true", SET_BY: "true"})  # an earlier run
    label(kube, "gpu06", {SKIP_LABEL: "true", SET_BY: "true"})  # before a crash
    action, hold = skip(kube, config)
    result = action.run(hold, context())
    assert result.details["labelled"] == ["gpu07", "gpu08"] and result.details["freed"] == [
        "gpu05"]
    assert result.details["held"] == ["gpu06", "gpu07", "gpu08"]
    assert skipped(kube)["gpu05"] == (None, None)


def test_kubernetes_names_and_refusals() -> None:
    kube, config = cluster()
    action, hold = skip(kube, config, canary="node-a", kubernetes_names={"node-a": "gpu06"})
    assert action.run(hold, context()).details["canaries"] == ["gpu06"]
    assert skipped(kube)["gpu06"] == (None, None) and skipped(kube)["gpu05"] == ("true", "true")
    kube, config = cluster()
    label(kube, "gpu05", {SKIP_LABEL: "true"})
    action, hold = skip(kube, config)
    with pytest.raises(ActionError, match=r"canary gpu05 carries nvidia\.com/gpu-driver-upgrade"
                                          r"\.skip=true \(the site's\)"):
        action.run(hold, context())
    assert skipped(kube)["gpu06"] == (None, None)  # refused before any label
    with pytest.raises(ActionError, match=r"canary gpu09 is not a GPU node"):
        action.run(skip(kube, config, canary="gpu09")[1], context())
    with pytest.raises(ActionError, match=r"nodes=gpu07 does not apply to the Kubernetes pool"):
        action.plan(skip(kube, config, others="gpu07")[1])
    unlabelled = KubernetesConfig.model_validate({"gpu_operator": {
        "driver_version_label": None}})
    action, hold = skip(kube, unlabelled)
    with pytest.raises(ActionError, match=r"set kubernetes\.gpu_operator\.driver_version_label"):
        action.plan(hold)


def test_the_upgrade_policy_is_set_on_the_clusterpolicy() -> None:
    kube, config = cluster()
    action = SetUpgradePolicyAction(kube, config, lambda s: None)
    arguments = UpgradePolicyArguments.model_validate({"max_parallel": 2, "max_unavailable": 2,
                                                 "drain_timeout": "2h"})
    assert "maxParallelUpgrades\":2" in action.plan(arguments)[0]
    assert action.run(arguments, context()).changed
    group, version, plural = CLUSTERPOLICY
    policy = kube.get_custom_object(group, version, plural,
                                    "cluster-policy")["spec"]["driver"]["upgradePolicy"]
    assert policy == {"autoUpgrade": True, "maxParallelUpgrades": 2, "maxUnavailable": 2,
                      "drain": {"enable": True, "force": False, "timeoutSeconds": 7200,
                                "deleteEmptyDir": True}}
    assert not action.run(arguments, context()).changed
    with pytest.raises(ValueError, match="a number of nodes or a percentage"):
        UpgradePolicyArguments.model_validate({"max_parallel": 1, "max_unavailable": "lots"})
