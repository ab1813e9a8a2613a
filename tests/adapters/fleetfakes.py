"""A fake clock and the in-memory Kubernetes fake with PodDisruptionBudgets, pods that take
a while to terminate and a log of every call: what the fleet drain tests drive."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from adapters.actions import ActionContext
from adapters.kubernetes.backend import Eviction, Node, Pod
from adapters.kubernetes.fake import FakeKubernetes


class Clock:
    """``time.monotonic`` for a test: moves only when slept."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(time, "monotonic", fake)
    return fake


class PdbKube(FakeKubernetes):
    """Evictions of pods named in ``blocked`` are refused (429, PodDisruptionBudget
    ``serving-pdb``); an evicted pod is gone ``linger`` seconds later; ``evictions`` logs
    (time, pod) of every eviction call and ``calls`` counts the API calls by kind."""

    def __init__(self, nodes: list[str], clock: Clock, linger: float = 0.0) -> None:
        super().__init__(nodes)
        self.clock = clock
        self.linger = linger
        self.blocked: set[str] = set()
        self.evictions: list[tuple[float, str]] = []
        self.leaving: dict[str, float] = {}  # pod name -> when it is gone
        self.calls: Counter[str] = Counter()
        for name in nodes:
            self.nodes[name] = replace(self.nodes[name], gpus_allocatable=8)

    def add_pods(self, node: str, count: int, owner: str | None = "ReplicaSet") -> list[str]:
        names = [f"{node}-p{i}" for i in range(count)]
        self.pods += [Pod("serving", name, f"uid-{name}", node=node, phase="Running",
                          ready=True, owner_kind=owner) for name in names]
        return names

    def _expire(self) -> None:
        gone = {name for name, at in self.leaving.items() if at <= self.clock.now}
        self.pods = [p for p in self.pods if p.name not in gone]
        for name in gone:
            del self.leaving[name]

    def get_node(self, name: str) -> Node:
        self.calls["get_node"] += 1
        return super().get_node(name)

    def list_nodes(self, label_selector: str | None = None) -> list[Node]:
        self.calls["list_nodes"] += 1
        return super().list_nodes(label_selector)

    def patch_node(self, name: str, patch: Any, *, strategic: bool = False) -> Node:
        self.calls["patch_node"] += 1
        return super().patch_node(name, patch, strategic=strategic)

    def pods_on_node(self, node: str) -> list[Pod]:
        self.calls["pods_on_node"] += 1
        self._expire()
        return super().pods_on_node(node)

    def evict(self, namespace: str, name: str, grace_seconds: int | None = None) -> Eviction:
        self.calls["evict"] += 1
        self.evictions.append((self.clock.now, name))
        if name in self.blocked:
            return Eviction("blocked", "serving-pdb",
                            "Cannot evict pod as it would violate the pod's disruption budget.")
        if not any(p.name == name for p in self.pods):
            return Eviction("gone")
        if self.linger:
            self.leaving.setdefault(name, self.clock.now + self.linger)
            self.pods = [replace(p, deleting=True) if p.name == name else p for p in self.pods]
            return Eviction("evicted")
        return super().evict(namespace, name, grace_seconds)

    def cordoned(self) -> dict[str, str | None]:
        return {name: node.annotations.get("gpu-runbook-bot/cordoned-by")
                for name, node in self.nodes.items() if node.unschedulable}


def max_in_a_second(times: list[float]) -> int:
    """The most calls in any one-second window [t, t+1)."""
    times = sorted(times)
    best, start = 0, 0
    for end, at in enumerate(times):
        while at - times[start] >= 1.0:
            start += 1
        best = max(best, end - start + 1)
    return best


def context(clock: Clock, execution_id: int = 7, seconds: float = 3600,
            statuses: list[Any] | None = None, lines: list[str] | None = None) -> ActionContext:
    return ActionContext(execution_id=execution_id, step_id="k8s-drain",
                         # ActionContext reads the real time.monotonic(): a deadline on
                         # the fake clock would pass once the machine is up ~1 h
                         deadline=time.monotonic() + seconds,
                         progress=(lines.append if lines is not None else lambda line: None),
                         status=(statuses.append if statuses is not None else lambda d: None))
