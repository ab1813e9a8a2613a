"""Whose cordon it is: the bot lifts only a cordon it made to work on a node. Another
owner's (a person, a window, the GPU Operator) and one kept for a failed validator stay
unless the request says override_drains=true; an undo lifts only its own execution's."""

from __future__ import annotations

import time
from typing import Any

import pytest

from adapters.actions import ActionContext, ActionError, ActionTimeout
from adapters.kubernetes import cordons
from adapters.kubernetes.actions import KubernetesActions
from adapters.kubernetes.cordons import CORDONED_BY, FAILED_CHECK
from adapters.kubernetes.fake import FakeKubernetes


def run(backend: FakeKubernetes, name: str, execution: int = 7, **args: Any) -> Any:
    action = KubernetesActions(backend).by_name()[name]
    ctx = ActionContext(execution_id=execution, step_id="s", deadline=time.monotonic() + 30)
    return action.run(action.Arguments(**args), ctx)


def plan(backend: FakeKubernetes, name: str, **args: Any) -> list[str]:
    action = KubernetesActions(backend).by_name()[name]
    return action.plan(action.Arguments(**args))


def cordoned(backend: FakeKubernetes, annotations: dict[str, str]) -> None:
    for name, owner in annotations.items():
        backend.patch_node(name, {"spec": {"unschedulable": True},
                                  "metadata": {"annotations": {CORDONED_BY: owner}
                                               if owner else {}}}, strategic=True)


def lab() -> FakeKubernetes:
    """gpu05 cordoned by the bot (execution 3), gpu06 by a person, gpu07 by window 2, gpu08
    by the bot and kept for a failed check."""
    kube = FakeKubernetes(["gpu05", "gpu06", "gpu07", "gpu08"])
    cordoned(kube, {"gpu05": "execution-3", "gpu06": "", "gpu07": "window-2",
                    "gpu08": "execution-4"})
    kube.patch_node("gpu08", cordons.failed_check_patch(4, "validator not Ready"),
                    strategic=True)
    return kube


def test_only_a_cordon_the_bot_made_to_work_on_the_node_is_liftable() -> None:
    kube = lab()
    assert cordons.not_liftable(kube.nodes.values()) == {
        "gpu06": "cordoned by someone else (no gpu-runbook-bot annotation)",
        "gpu07": "cordoned by window 2 (its owner lifts it)",
        "gpu08": 'cordoned by the bot for a failed check: "validator not Ready (execution-4)"'}
    assert cordons.held_by(kube.nodes["gpu05"].annotations) == {3}


def test_uncordon_refuses_another_owners_cordon_and_changes_nothing() -> None:
    kube = lab()
    for node in ("gpu06", "gpu07", "gpu08"):
        with pytest.raises(ActionError, match=f"{node} is cordoned by .*override_drains=true"):
            run(kube, "k8s.uncordon", node=node)
        assert kube.nodes[node].unschedulable
    assert run(kube, "k8s.uncordon", node="gpu05").summary == "uncordoned gpu05"
    assert not kube.nodes["gpu05"].unschedulable
    assert CORDONED_BY not in kube.nodes["gpu05"].annotations


def test_override_drains_lifts_it_and_drops_the_marks() -> None:
    kube = lab()
    run(kube, "k8s.uncordon", node="gpu08", override_drains=True)
    assert not kube.nodes["gpu08"].unschedulable
    assert not {CORDONED_BY, FAILED_CHECK} & set(kube.nodes["gpu08"].annotations)


def test_the_plan_names_whose_cordon_stays() -> None:
    kube = lab()
    assert plan(kube, "k8s.uncordon", node="gpu06") == [
        "gpu06 is cordoned by someone else (no gpu-runbook-bot annotation): STAYS CORDONED: "
        "not lifted without override_drains=true (break-glass)", "kubectl uncordon gpu06"]
    assert plan(kube, "k8s.uncordon", node="gpu05") == ["kubectl uncordon gpu05"]


def test_an_undo_lifts_only_this_executions_own_cordon() -> None:
    kube = lab()
    for node in ("gpu05", "gpu06", "gpu08"):
        result = run(kube, "k8s.uncordon", execution=4, node=node, only_this_run=True)
        assert not result.changed and result.summary.startswith(f"{node} left cordoned: ")
        assert kube.nodes[node].unschedulable
    cordoned(kube, {"gpu05": "execution-4"})
    assert run(kube, "k8s.uncordon", execution=4, node="gpu05", only_this_run=True).changed
    assert not kube.nodes["gpu05"].unschedulable


def test_resume_nodes_kubernetes_side_lifts_the_rest_and_fails_naming_what_stays() -> None:
    kube = lab()
    with pytest.raises(ActionError) as err:
        run(kube, "k8s.undrain_nodes", nodes="gpu[05-08]", only_this_run=False)
    assert str(err.value).startswith("uncordoned gpu05; left cordoned: gpu06 (cordoned by "
                                     "someone else")
    assert "gpu07 (cordoned by window 2" in str(err.value)
    assert [n for n, node in kube.nodes.items() if node.unschedulable] == [
        "gpu06", "gpu07", "gpu08"]
    assert plan(kube, "k8s.undrain_nodes", nodes="gpu[05-08]", only_this_run=False)[0] == (
        "gpu06 is cordoned by someone else (no gpu-runbook-bot annotation): STAYS CORDONED: "
        "not lifted without override_drains=true (break-glass)")
    done = run(kube, "k8s.undrain_nodes", nodes="gpu[05-08]", only_this_run=False,
               override_drains=True)
    assert done.details["uncordoned"] == ["gpu06", "gpu07", "gpu08"]


def test_the_undo_of_a_fleet_drain_leaves_a_failed_checks_cordon() -> None:
    kube = lab()
    result = run(kube, "k8s.undrain_nodes", execution=4, nodes="gpu[05-08]")
    assert not result.changed and kube.nodes["gpu08"].unschedulable


def test_a_validator_that_never_gets_ready_keeps_the_cordoned_node_out() -> None:
    kube = FakeKubernetes(["gpu05", "gpu06"])
    cordoned(kube, {"gpu05": "execution-7"})
    with pytest.raises(ActionTimeout) as err:
        run(kube, "gpu_operator.wait_validator", nodes=["gpu05", "gpu06"], timeout=0.3,
            poll=0.05)
    assert str(err.value).endswith(f"gpu05 stays cordoned, marked as a failed check "
                                   f"({FAILED_CHECK})")
    assert kube.nodes["gpu05"].annotations[FAILED_CHECK] == (
        "GPU Operator validator not Ready: no validator pod (execution-7)")
    assert FAILED_CHECK not in kube.nodes["gpu06"].annotations  # in service: not taken out
    assert not kube.nodes["gpu06"].unschedulable
    assert "gpu05" in cordons.not_liftable(kube.nodes.values())
