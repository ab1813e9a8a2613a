"""``k8s.cordon_nodes`` / ``k8s.uncordon_nodes`` over an in-memory backend: all or none,
idempotent, and with an owner they uncordon only the nodes they cordoned themselves (the
lab's Kubernetes API fake runs them too, in tests/runbooks/test_windows_lab.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import ValidationError

from adapters.actions import ActionContext, ActionError
from adapters.kubernetes.actions import KubernetesActions
from adapters.kubernetes.backend import KubernetesUnavailable, Node
from adapters.kubernetes.cordons import CORDONED_BY
from adapters.kubernetes.fake import FakeKubernetes


class Flaky(FakeKubernetes):
    """Refuses to patch one node (the API went away half-way)."""

    def __init__(self, nodes: list[str], broken: str) -> None:
        super().__init__(nodes)
        self.broken = broken

    def patch_node(self, name: str, patch: Any, *, strategic: bool = False) -> Node:
        if name == self.broken and (patch.get("spec") or {}).get("unschedulable"):
            raise KubernetesUnavailable("the API did not answer", status=503)
        return super().patch_node(name, patch, strategic=strategic)


def run(backend: FakeKubernetes, name: str, **args: Any) -> Any:
    action = KubernetesActions(backend).by_name()[name]
    ctx = ActionContext(execution_id=1, step_id="s", deadline=time.monotonic() + 30)
    return action.run(action.Arguments(**args), ctx)


def state(backend: FakeKubernetes) -> dict[str, tuple[bool, str | None]]:
    return {n.name: (n.unschedulable, n.annotations.get(CORDONED_BY))
            for n in backend.nodes.values()}


def test_cordon_marks_its_own_and_uncordon_undoes_only_those() -> None:
    kube = FakeKubernetes(["gpu05", "gpu06", "gpu07"])
    kube.patch_node("gpu06", {"spec": {"unschedulable": True}})  # somebody else's cordon
    result = run(kube, "k8s.cordon_nodes", nodes=["gpu05", "gpu06"], owner="window-3")
    assert result.changed and result.summary == ("cordoned gpu05; gpu06 already cordoned "
                                                 "(left as they were)")
    assert state(kube) == {"gpu05": (True, "window-3"), "gpu06": (True, None),
                           "gpu07": (False, None)}
    again = run(kube, "k8s.cordon_nodes", nodes=["gpu05", "gpu06"], owner="window-3")
    assert not again.changed
    done = run(kube, "k8s.uncordon_nodes", nodes=["gpu05", "gpu06"], owner="window-3")
    assert done.details["uncordoned"] == ["gpu05"] and done.details["left_alone"] == ["gpu06"]
    assert state(kube) == {"gpu05": (False, None), "gpu06": (True, None),
                           "gpu07": (False, None)}
    assert not run(kube, "k8s.uncordon_nodes", nodes=["gpu05"], owner="window-3").changed


def test_without_an_owner_every_node_named() -> None:
    kube = FakeKubernetes(["gpu05", "gpu06"])
    run(kube, "k8s.cordon_nodes", nodes=["gpu05", "gpu06"])
    assert state(kube) == {"gpu05": (True, None), "gpu06": (True, None)}
    run(kube, "k8s.uncordon_nodes", nodes=["gpu05", "gpu06"])
    assert state(kube) == {"gpu05": (False, None), "gpu06": (False, None)}


def test_all_or_none() -> None:
    kube = Flaky(["gpu05", "gpu06", "gpu07"], broken="gpu07")
    with pytest.raises(ActionError, match="nothing left cordoned by this step"):
        run(kube, "k8s.cordon_nodes", nodes=["gpu05", "gpu06", "gpu07"], owner="window-1")
    assert state(kube) == {"gpu05": (False, None), "gpu06": (False, None),
                           "gpu07": (False, None)}


def test_plans_and_arguments() -> None:
    actions = KubernetesActions(FakeKubernetes([])).by_name()
    cordon = actions["k8s.cordon_nodes"]
    two = {"nodes": ["gpu05", "gpu06"], "owner": "window-2"}
    assert cordon.plan(cordon.Arguments.model_validate(two))[:2] == [
        "kubectl cordon gpu05", "kubectl cordon gpu06"]
    uncordon = actions["k8s.uncordon_nodes"]
    one = {"nodes": ["gpu05"], "owner": "window-2"}
    assert uncordon.plan(uncordon.Arguments.model_validate(one)) == [
        f"kubectl uncordon gpu05  # if annotated {CORDONED_BY}=window-2"]
    with pytest.raises(ValidationError):
        cordon.Arguments.model_validate({"nodes": []})
    with pytest.raises(ValidationError):
        cordon.Arguments.model_validate({"nodes": ["GPU 05"]})
    with pytest.raises(ValidationError):
        cordon.Arguments.model_validate({"nodes": ["gpu05"], "owner": "window 2;"})
