"""Where each node of a run that failed or was cancelled stands, in each pool, as the end of
its message says: drained and why (with the next command), cordoned or not; a system that
does not answer is named unknown within seconds, and a fleet run names no node."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from adapters.kubernetes.fake import FakeKubernetes
from adapters.slurm.fake import FakeSlurm
from bot.execution import node_states
from bot.runbooks.params import Inventory

INVENTORY = Inventory(nodes=frozenset({"gpu01", "gpu02", "gpu03", "gpu04"}),
                      slurm=frozenset({"gpu01", "gpu02", "gpu03", "gpu04"}),
                      kubernetes=frozenset({"gpu04"}))


def systems() -> tuple[FakeSlurm, FakeKubernetes]:
    slurm = FakeSlurm(["gpu01", "gpu02", "gpu03", "gpu04"])
    slurm.update_nodes(["gpu01"], "DRAIN", "XID 94 (execution 7)")
    slurm.update_nodes(["gpu02"], "DRAIN", "health check failed: Fail (execution 7: failed check)")
    kubernetes = FakeKubernetes(["gpu04"])
    kubernetes.patch_node("gpu04", {"spec": {"unschedulable": True}}, strategic=True)
    return slurm, kubernetes


def test_each_node_in_each_pool_with_the_next_command() -> None:
    slurm, kubernetes = systems()
    text = node_states.describe({"slurm": slurm, "kubernetes": kubernetes}, INVENTORY,
                                ["gpu01", "gpu02", "gpu03", "gpu04"])
    assert text == (
        'state now: gpu01: Slurm drained ("XID 94 (execution 7)"); next: resume-node '
        'node=gpu01 once it is serviced; gpu02: Slurm drained ("health check failed: Fail '
        '(execution 7: failed check)"); next: repair it (swap-gpu, reset-gpu), then '
        "resume-node node=gpu02 override_drains=true (break-glass); gpu03: Slurm in service; "
        "gpu04: Slurm in service, Kubernetes cordoned by someone else (no gpu-runbook-bot "
        "annotation)")


def test_a_system_that_does_not_answer_is_unknown_within_seconds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    slurm, kubernetes = systems()
    hung, answered, read_ended = threading.Event(), threading.Event(), threading.Event()
    after_answer: list[bool] = []  # each hung read: had describe answered when it ended?

    def nodes(*args: Any, **kwargs: Any) -> None:
        hung.wait(30)  # released by the test once describe answered
        after_answer.append(answered.is_set())
        read_ended.set()

    monkeypatch.setattr(slurm, "nodes", nodes)
    monkeypatch.setattr(node_states, "READ_SECONDS", 0.3)
    text = node_states.describe({"slurm": slurm, "kubernetes": kubernetes}, INVENTORY,
                                ["gpu01", "gpu04"])
    answered.set()
    hung.set()
    assert read_ended.wait(10)
    assert after_answer and all(after_answer)  # it answered without waiting for the read
    assert text == ("state now: gpu01: Slurm state unknown (no answer in 0.3 s); gpu04: Slurm "
                    "state unknown (no answer in 0.3 s), Kubernetes cordoned by someone else (no "
                    "gpu-runbook-bot annotation)")


def test_an_error_is_said_and_a_fleet_run_names_no_node() -> None:
    slurm, _ = systems()

    def refusing(*args: object, **kwargs: object) -> None:
        raise RuntimeError("slurmctld is not answering")

    slurm.nodes = refusing  # type: ignore[assignment,method-assign]
    text = node_states.describe({"slurm": slurm}, INVENTORY, ["gpu03"])
    assert text == "state now: gpu03: Slurm state unknown (slurmctld is not answering)"
    many = [f"gpu{i:02d}" for i in range(1, 10)]
    assert node_states.describe({"slurm": slurm}, INVENTORY, many) == ""
    assert node_states.describe({}, INVENTORY, ["gpu01"]) == ""
