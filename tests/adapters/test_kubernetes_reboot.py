"""``k8s.request_reboot`` over ``FakeKubernetes`` with a fake clock: the label set, the wait
for a new bootID and Ready, the label and annotation removed; a re-run after a crash waits
on the recorded bootID; no agent acting is a clear timeout that withdraws the request; a
cancel withdraws it too; a node without a bootID is refused; the plan."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from adapters.actions import ActionContext, ActionError, ActionStopped, ActionTimeout
from adapters.kubernetes.actions import KubernetesActions
from adapters.kubernetes.config import KubernetesConfig
from adapters.kubernetes.fake import FakeKubernetes
from adapters.kubernetes.reboot import BOOT_ID_BEFORE, RequestRebootArguments

LABEL = "gpu-runbook-bot/reboot-requested"


class Clock:
    """time.monotonic for the test; each sleep advances it and lets the 'agent' act."""

    def __init__(self, agent: Callable[[float], None] = lambda now: None) -> None:
        self.now = 1000.0
        self.agent = agent
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        self.agent(self.now)


def run(backend: FakeKubernetes, clock: Clock, monkeypatch: pytest.MonkeyPatch,
        ctx: ActionContext | None = None, config: KubernetesConfig | None = None,
        **args: Any) -> Any:
    monkeypatch.setattr(time, "monotonic", clock.monotonic)
    action = KubernetesActions(backend, config, sleep=clock.sleep).by_name()[
        "k8s.request_reboot"]
    context = ctx or ActionContext(execution_id=1, step_id="k8s-reboot",
                                   deadline=clock.now + 3600)
    return action.run(RequestRebootArguments(node="gpu06", **args), context)


def agent(backend: FakeKubernetes, label: str = LABEL) -> Callable[[float], None]:
    """Reboots a labelled node: NotReady 10 s after the label, back 20 s after that."""
    seen: dict[str, float] = {}

    def act(now: float) -> None:
        node = backend.nodes["gpu06"]
        if label not in node.labels:
            return
        started = seen.setdefault("at", now)
        if now - started >= 30 and not node.ready:
            backend.nodes["gpu06"] = replace(node, ready=True)
        elif now - started >= 10 and "down" not in seen:
            seen["down"] = now
            backend.reboot("gpu06", ready=False)
    return act


def test_request_reboot_waits_for_a_new_boot_id_and_ready(
        monkeypatch: pytest.MonkeyPatch) -> None:
    backend = FakeKubernetes(["gpu06"])
    clock = Clock(agent(backend))
    lines: list[str] = []
    ctx = ActionContext(execution_id=1, step_id="k8s-reboot", deadline=clock.now + 3600,
                        progress=lines.append)
    done = run(backend, clock, monkeypatch, ctx, timeout=600, poll=5)
    assert done.details["boot_id_before"] == "boot-gpu06-1"
    assert done.details["boot_id_after"] == "boot-gpu06-2"
    assert 30 <= done.details["waited_seconds"] <= 40
    node = backend.nodes["gpu06"]
    assert LABEL not in node.labels and BOOT_ID_BEFORE not in node.annotations
    assert node.ready
    assert any("asked for a reboot of gpu06: " + LABEL in line for line in lines)
    assert "gpu06: NotReady on the same bootID" not in lines  # the fake reboots at once
    assert "gpu06: booted again, not Ready" in lines
    assert max(clock.sleeps) <= 5


def test_a_rerun_after_a_crash_waits_on_the_recorded_boot_id(
        monkeypatch: pytest.MonkeyPatch) -> None:
    backend = FakeKubernetes(["gpu06"])
    backend.patch_node("gpu06", {"metadata": {"labels": {LABEL: "1700000000"},
                                              "annotations": {BOOT_ID_BEFORE: "boot-gpu06-1"}}})
    backend.reboot("gpu06")  # it rebooted while the bot was down
    clock = Clock()
    done = run(backend, clock, monkeypatch, timeout=60, poll=1)
    assert (done.details["boot_id_before"], done.details["boot_id_after"]) == (
        "boot-gpu06-1", "boot-gpu06-2")
    assert clock.sleeps == []  # no new request, no wait: it is back already
    assert LABEL not in backend.nodes["gpu06"].labels


def test_no_agent_acting_times_out_and_withdraws_the_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    backend = FakeKubernetes(["gpu06"])
    labelled: list[bool] = []
    clock = Clock(lambda now: labelled.append(LABEL in backend.nodes["gpu06"].labels))
    with pytest.raises(ActionTimeout, match=r"gpu06 did not come back from a reboot within "
                                            r"2m \(still Ready on the same bootID\): no reboot "
                                            r"agent acted on the label gpu-runbook-bot/reboot-"
                                            r"requested.*the bot does not reboot nodes itself"
                                            r".*request \(.*\) was withdrawn"):
        run(backend, clock, monkeypatch, timeout=120, poll=10)
    assert labelled and all(labelled)  # the label stayed while it waited
    assert 120 <= clock.now - 1000 <= 131
    node = backend.nodes["gpu06"]
    assert LABEL not in node.labels and BOOT_ID_BEFORE not in node.annotations


def test_a_cancel_withdraws_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = FakeKubernetes(["gpu06"])
    clock = Clock()
    ctx = ActionContext(execution_id=1, step_id="k8s-reboot", deadline=clock.now + 3600)
    clock.agent = lambda now: ctx.request_stop("the execution was cancelled") \
        if now > 1020 else None
    with pytest.raises(ActionStopped, match=r"cancelled.*was withdrawn"):
        run(backend, clock, monkeypatch, ctx, timeout=600, poll=5)
    assert LABEL not in backend.nodes["gpu06"].labels


def test_the_configured_label_and_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = FakeKubernetes(["gpu06"])
    config = KubernetesConfig(reboot_request_label="example.com/reboot")
    clock = Clock(agent(backend, "example.com/reboot"))
    done = run(backend, clock, monkeypatch, config=config, timeout=600, poll=5)
    assert done.details["label"] == "example.com/reboot"
    action = KubernetesActions(backend, config).by_name()["k8s.request_reboot"]
    assert action.plan(RequestRebootArguments(node="gpu06", timeout=600)) == [
        "kubectl label node gpu06 example.com/reboot=<unix time> --overwrite  # the site's "
        f"reboot agent reboots it; bootID kept in {BOOT_ID_BEFORE}",
        "wait until gpu06 booted again (new status.nodeInfo.bootID) and is Ready (at most 10m)",
        "kubectl label node gpu06 example.com/reboot-"]
    with pytest.raises(ValueError, match="reboot_request_label"):
        KubernetesConfig(reboot_request_label="not a label")


def test_a_node_without_a_boot_id_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = FakeKubernetes(["gpu06"])
    backend.nodes["gpu06"] = replace(backend.nodes["gpu06"], boot_id="")
    with pytest.raises(ActionError, match=r"reports no status\.nodeInfo\.bootID"):
        run(backend, Clock(), monkeypatch, timeout=60)
    assert LABEL not in backend.nodes["gpu06"].labels
